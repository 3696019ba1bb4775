// Flags: defaults, kube-proxy style durations, and one clear error per bad value.

import assert from 'node:assert/strict';
import { parseDuration } from '../../src/config/duration.js';
import { parseConfig, UsageError } from '../../src/config/options.js';

function fails(argv: string[], pattern: RegExp, env: NodeJS.ProcessEnv = {}): void {
  assert.throws(
    () => parseConfig(argv, env),
    (err: unknown) => {
      assert.ok(err instanceof UsageError, `expected a UsageError, got ${String(err)}`);
      assert.match(err.message, pattern);
      assert.doesNotMatch(err.message, /\n/, 'one line');
      return true;
    },
  );
}

describe('durations', () => {
  it('parses what kube-proxy flags accept', () => {
    assert.equal(parseDuration('30s'), 30_000);
    assert.equal(parseDuration('500ms'), 500);
    assert.equal(parseDuration('1m'), 60_000);
    assert.equal(parseDuration('1m30s'), 90_000);
    assert.equal(parseDuration('1.5h'), 5_400_000);
    assert.equal(parseDuration('0'), 0);
  });
  it('rejects anything else', () => {
    for (const bad of ['', '30', 's', '1x', '1m 30s', '-1s', '1s2']) assert.equal(parseDuration(bad), undefined, bad);
  });
});

describe('flags', () => {
  it('has sane defaults', () => {
    const c = parseConfig([], { NODE_NAME: 'worker-1' });
    assert.equal(c.nodeName, 'worker-1');
    assert.equal(c.backend, 'auto');
    assert.equal(c.model.detectLocalMode, 'NodeCIDR');
    assert.equal(c.model.masqueradeBit, 14);
    assert.equal(c.minSyncPeriodMs, 1000);
    assert.equal(c.syncPeriodMs, 30_000);
    assert.equal(c.model.localTrafficPolicyOnly, false);
    assert.equal(c.dryRun, false);
    assert.equal(c.cleanup, false);
  });

  it('prefers --node-name over NODE_NAME', () => {
    assert.equal(parseConfig(['--node-name', 'a'], { NODE_NAME: 'b' }).nodeName, 'a');
  });

  it('reads --cluster-cidr, or the original POD_CIDR_IPV4 / POD_CIDR_IPV6', () => {
    const flag = parseConfig(['--detect-local-mode=ClusterCIDR', '--cluster-cidr=10.244.0.0/16,fd00:10:244::/56'], {});
    assert.deepEqual(flag.model.clusterCidrs, ['10.244.0.0/16', 'fd00:10:244::/56']);
    const env = parseConfig(['--detect-local-mode', 'ClusterCIDR'], {
      POD_CIDR_IPV4: '10.244.0.0/16',
      POD_CIDR_IPV6: 'fd00::/48',
    });
    assert.deepEqual(env.model.clusterCidrs, ['10.244.0.0/16', 'fd00::/48']);
  });

  it('rejects bad values with one line each', () => {
    fails(['--backend=ipvs'], /--backend.*ipvs/);
    fails(['--detect-local-mode=Magic'], /Magic/);
    fails(['--masquerade-bit=32'], /--masquerade-bit: '32' must be an integer from 0 to 31/);
    fails(['--masquerade-bit=0x4000'], /--masquerade-bit/);
    fails(['--sync-period=30'], /--sync-period: '30' is not a duration/);
    fails(['--min-sync-period=1m', '--sync-period=30s'], /must not be longer/);
    fails(['--cluster-cidr=10.0.0.0/33'], /--cluster-cidr: '10.0.0.0\/33' is not a CIDR/);
    fails(['--pod-bridge-interface=a/b'], /not an interface name/);
    fails(['--pod-interface-name-prefix=waytoolongforaninterface'], /not an interface name prefix/);
    fails(['--unknown-flag'], /unknown option '--unknown-flag'/);
    fails(['extra-argument'], /too many arguments|unknown command|excess/i);
  });

  it('requires the value each detect-local mode needs', () => {
    fails(['--detect-local-mode=ClusterCIDR'], /needs --cluster-cidr/);
    fails(['--detect-local-mode=BridgeInterface'], /needs --pod-bridge-interface/);
    fails(['--detect-local-mode=InterfaceNamePrefix'], /needs --pod-interface-name-prefix/);
  });

  it('checks combinations of modes', () => {
    fails(['--from-file=x.yaml'], /--from-file only works with --dry-run/);
    fails(['--dry-run', '--cleanup'], /exclude each other/);
    assert.equal(parseConfig(['--dry-run', '--from-file', '-'], {}).fromFile, '-');
  });
});
