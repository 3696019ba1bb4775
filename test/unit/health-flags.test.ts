// The flags of the operational endpoints and Events.

import assert from 'node:assert/strict';
import { parseBindAddress, parseConfig, UsageError } from '../../src/config/options.js';

const env = { NODE_NAME: 'node-1' };

describe('operational flags', () => {
  it('default to 0.0.0.0:9477 for metrics, 0.0.0.0:9478 for health (not kube-proxy 10256), Events off', () => {
    const c = parseConfig([], env);
    assert.deepEqual(c.metricsBindAddress, { host: '0.0.0.0', port: 9477 });
    assert.deepEqual(c.healthzBindAddress, { host: '0.0.0.0', port: 9478 });
    assert.equal(c.emitEvents, false);
    assert.equal(parseConfig(['--emit-events'], env).emitEvents, true);
  });

  it('take IPv4 and bracketed IPv6 addresses, port 0, and the empty value to disable', () => {
    assert.deepEqual(parseBindAddress('--x', '127.0.0.1:1'), { host: '127.0.0.1', port: 1 });
    assert.deepEqual(parseBindAddress('--x', '[::1]:65535'), { host: '::1', port: 65535 });
    assert.deepEqual(parseBindAddress('--x', '[::]:0'), { host: '::', port: 0 });
    assert.equal(parseBindAddress('--x', ''), undefined);
    const c = parseConfig(['--metrics-bind-address', '', '--healthz-bind-address=127.0.0.1:10999'], env);
    assert.equal(c.metricsBindAddress, undefined);
    assert.deepEqual(c.healthzBindAddress, { host: '127.0.0.1', port: 10999 });
  });

  for (const bad of [
    '9477',
    'localhost:9477',
    '::1:9477',
    '[127.0.0.1]:1',
    '1.2.3:4',
    '0.0.0.0:65536',
    '0.0.0.0:',
    '[::1]',
  ]) {
    it(`reject ${JSON.stringify(bad)} with one line naming the flag`, () => {
      assert.throws(
        () => parseConfig(['--metrics-bind-address', bad], env),
        (err: Error) =>
          err instanceof UsageError && err.message.startsWith(`--metrics-bind-address: '${bad}' is not IP:port`),
      );
    });
  }

  it('reject the same port for metrics and health when the addresses overlap', () => {
    for (const [m, h] of [
      ['0.0.0.0:9000', '127.0.0.1:9000'],
      ['127.0.0.1:9000', '127.0.0.1:9000'],
      ['[::]:9000', '10.0.0.1:9000'],
    ]) {
      assert.throws(
        () => parseConfig(['--metrics-bind-address', m!, '--healthz-bind-address', h!], env),
        /must use different ports/,
      );
    }
    assert.doesNotThrow(() =>
      parseConfig(['--metrics-bind-address', '127.0.0.1:9000', '--healthz-bind-address', '127.0.0.2:9000'], env),
    );
  });
});
