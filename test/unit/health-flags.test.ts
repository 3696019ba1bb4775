// The flags of the operational endpoints and Events.

import { expect } from 'chai';
import { parseBindAddress, parseConfig, UsageError } from '../../src/config/options.js';

const env = { NODE_NAME: 'node-1' };

describe('operational flags', () => {
  it('default to 0.0.0.0:9477 for metrics, 0.0.0.0:9478 for health (not kube-proxy 10256), Events off', () => {
    const c = parseConfig([], env);
    expect(c.metricsBindAddress).to.deep.equal({ host: '0.0.0.0', port: 9477 });
    expect(c.healthzBindAddress).to.deep.equal({ host: '0.0.0.0', port: 9478 });
    expect(c.emitEvents).to.equal(false);
    expect(parseConfig(['--emit-events'], env).emitEvents).to.equal(true);
  });

  it('take IPv4 and bracketed IPv6 addresses, port 0, and the empty value to disable', () => {
    expect(parseBindAddress('--x', '127.0.0.1:1')).to.deep.equal({ host: '127.0.0.1', port: 1 });
    expect(parseBindAddress('--x', '[::1]:65535')).to.deep.equal({ host: '::1', port: 65535 });
    expect(parseBindAddress('--x', '[::]:0')).to.deep.equal({ host: '::', port: 0 });
    expect(parseBindAddress('--x', '')).to.equal(undefined);
    // Brackets around IPv4 too, as Go's SplitHostPort takes them: the DaemonSet writes [$(HOST_IP)]:9477.
    expect(parseBindAddress('--x', '[10.0.0.7]:9477')).to.deep.equal({ host: '10.0.0.7', port: 9477 });
    const c = parseConfig(['--metrics-bind-address', '', '--healthz-bind-address=127.0.0.1:10999'], env);
    expect(c.metricsBindAddress).to.equal(undefined);
    expect(c.healthzBindAddress).to.deep.equal({ host: '127.0.0.1', port: 10999 });
  });

  for (const bad of ['9477', 'localhost:9477', '::1:9477', '1.2.3:4', '0.0.0.0:65536', '0.0.0.0:', '[::1]']) {
    it(`reject ${JSON.stringify(bad)} with one line naming the flag`, () => {
      expect(() => parseConfig(['--metrics-bind-address', bad], env))
        .to.throw(UsageError)
        .with.property('message')
        .that.satisfies((message: string) => message.startsWith(`--metrics-bind-address: '${bad}' is not IP:port`));
    });
  }

  it('reject the same port for metrics and health when the addresses overlap', () => {
    for (const [m, h] of [
      ['0.0.0.0:9000', '127.0.0.1:9000'],
      ['127.0.0.1:9000', '127.0.0.1:9000'],
      ['[::]:9000', '10.0.0.1:9000'],
    ]) {
      expect(() => parseConfig(['--metrics-bind-address', m!, '--healthz-bind-address', h!], env)).to.throw(
        /must use different ports/,
      );
    }
    expect(() =>
      parseConfig(['--metrics-bind-address', '127.0.0.1:9000', '--healthz-bind-address', '127.0.0.2:9000'], env),
    ).to.not.throw();
  });
});
