// Flags: defaults, kube-proxy style durations, and one clear error per bad value.

import { expect } from 'chai';
import { parseDuration } from '../../src/config/duration.js';
import { buildCommand } from '../../src/config/flags.js';
import { parseConfig, UsageError } from '../../src/config/options.js';

function fails(argv: string[], pattern: RegExp, env: NodeJS.ProcessEnv = {}): void {
  expect(() => parseConfig(argv, env))
    .to.throw()
    .that.satisfies((err: unknown) => {
      if (!(err instanceof UsageError)) expect.fail(`expected a UsageError, got ${String(err)}`);
      expect(err.message).to.match(pattern);
      expect(err.message, 'one line').to.not.match(/\n/);
      return true;
    });
}

describe('durations', () => {
  it('parses what kube-proxy flags accept', () => {
    expect(parseDuration('30s')).to.equal(30_000);
    expect(parseDuration('500ms')).to.equal(500);
    expect(parseDuration('1m')).to.equal(60_000);
    expect(parseDuration('1m30s')).to.equal(90_000);
    expect(parseDuration('1.5h')).to.equal(5_400_000);
    expect(parseDuration('0')).to.equal(0);
  });
  it('rejects anything else', () => {
    for (const bad of ['', '30', 's', '1x', '1m 30s', '-1s', '1s2'])
      expect(parseDuration(bad), bad).to.equal(undefined);
  });
});

describe('flags', () => {
  it('has sane defaults', () => {
    const c = parseConfig([], { NODE_NAME: 'worker-1' });
    expect(c.nodeName).to.equal('worker-1');
    expect(c.backend).to.equal('auto');
    expect(c.model.detectLocalMode).to.equal('NodeCIDR');
    expect(c.model.masqueradeBit).to.equal(14);
    expect(c.minSyncPeriodMs).to.equal(1000);
    expect(c.syncPeriodMs).to.equal(30_000);
    expect(c.model.localTrafficPolicyOnly).to.equal(false);
    expect(c.dryRun).to.equal(false);
    expect(c.cleanup).to.equal(false);
    expect(c.model.maxEntriesPerService).to.equal(10_000);
    expect(c.maxEntries, "the backend's default").to.equal(undefined);
    expect(c.model.externalIpRanges, 'any external IP').to.equal(undefined);
    expect(c.model.allowServiceExternalIPs).to.equal(true);
    expect(c.model.serviceCidrs, 'no Service CIDR known').to.equal(undefined);
    expect(c.model.nodeAddressRanges, 'no node address range known').to.equal(undefined);
  });

  it("reads the cluster's Service CIDRs (one per family) and the Nodes' address ranges", () => {
    const c = parseConfig(
      [
        '--service-cluster-ip-range=10.96.0.0/12,fd00:10:96::/108',
        '--node-address-ranges=192.168.5.0/24',
        '--node-address-ranges',
        '2001:db8:ffff::/64,10.0.0.7/32',
      ],
      {},
    );
    expect(c.model.serviceCidrs).to.deep.equal(['10.96.0.0/12', 'fd00:10:96::/108']);
    expect(c.model.nodeAddressRanges).to.deep.equal(['192.168.5.0/24', '2001:db8:ffff::/64', '10.0.0.7/32']);
    expect(parseConfig(['--service-cluster-ip-range', 'fd00:10:96::1/108'], {}).model.serviceCidrs).to.deep.equal([
      'fd00:10:96::/108',
    ]);
    fails(['--service-cluster-ip-range=10.96.0.0'], /--service-cluster-ip-range: '10.96.0.0' is not a CIDR/);
    fails(
      ['--service-cluster-ip-range=10.96.0.0/12,10.112.0.0/12'],
      /--service-cluster-ip-range: '10.96.0.0\/12,10.112.0.0\/12' must be one CIDR, or one IPv4 and one IPv6/,
    );
    fails(['--service-cluster-ip-range='], /--service-cluster-ip-range: '' is not a CIDR/);
    fails(['--node-address-ranges=192.168.5.0/24,nodes'], /--node-address-ranges: 'nodes' is not a CIDR/);
  });

  it('--log-format: json by default, text on request, nothing else', () => {
    expect(parseConfig([], { NODE_NAME: 'n' }).logFormat).to.equal('json');
    expect(parseConfig(['--log-format=text'], { NODE_NAME: 'n' }).logFormat).to.equal('text');
    expect(parseConfig(['--log-format', 'json'], { NODE_NAME: 'n' }).logFormat).to.equal('json');
    fails(
      ['--log-format=yaml'],
      /^option '--log-format <format>' argument 'yaml' is invalid\. Allowed choices are json, text\.$/,
    );
    fails(['--log-format=JSON'], /Allowed choices are json, text/);
    fails(['--log-format='], /Allowed choices are json, text/);
  });

  it('reads the limits and the allowed external IP ranges', () => {
    const c = parseConfig(
      [
        '--max-entries-per-service=500',
        '--max-entries',
        '2000',
        '--service-external-ip-range=198.51.100.0/24,2001:db8:1::/64',
        '--service-external-ip-range',
        '203.0.113.7/32',
      ],
      {},
    );
    expect(c.model.maxEntriesPerService).to.equal(500);
    expect(c.maxEntries).to.equal(2000);
    expect(c.model.externalIpRanges).to.deep.equal(['198.51.100.0/24', '2001:db8:1::/64', '203.0.113.7/32']);
  });

  it('prefers --node-name over NODE_NAME', () => {
    expect(parseConfig(['--node-name', 'a'], { NODE_NAME: 'b' }).nodeName).to.equal('a');
  });

  it('reads --cluster-cidr, or the original POD_CIDR_IPV4 / POD_CIDR_IPV6', () => {
    const flag = parseConfig(['--detect-local-mode=ClusterCIDR', '--cluster-cidr=10.244.0.0/16,fd00:10:244::/56'], {});
    expect(flag.model.clusterCidrs).to.deep.equal(['10.244.0.0/16', 'fd00:10:244::/56']);
    const env = parseConfig(['--detect-local-mode', 'ClusterCIDR'], {
      POD_CIDR_IPV4: '10.244.0.0/16',
      POD_CIDR_IPV6: 'fd00::/48',
    });
    expect(env.model.clusterCidrs).to.deep.equal(['10.244.0.0/16', 'fd00::/48']);
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
    fails(['--max-entries-per-service=0'], /--max-entries-per-service: '0' must be an integer from 1 to 10000000/);
    fails(['--max-entries=1e5'], /--max-entries: '1e5' must be an integer/);
    fails(['--service-external-ip-range=198.51.100.0'], /--service-external-ip-range: '198.51.100.0' is not a CIDR/);
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
    expect(parseConfig(['--dry-run', '--from-file', '-'], {}).fromFile).to.equal('-');
  });
});

describe("flags as kube-proxy's: booleans and aliases", () => {
  const BOOLEANS = [
    ['--local-traffic-policy-only', (c: ReturnType<typeof parseConfig>) => c.model.localTrafficPolicyOnly, false],
    ['--emit-events', (c: ReturnType<typeof parseConfig>) => c.emitEvents, false],
    ['--kube-proxy-step-aside', (c: ReturnType<typeof parseConfig>) => c.kubeProxyStepAside, true],
    ['--iptables-comments', (c: ReturnType<typeof parseConfig>) => c.iptablesComments, true],
    ['--dry-run', (c: ReturnType<typeof parseConfig>) => c.dryRun, false],
    ['--cleanup', (c: ReturnType<typeof parseConfig>) => c.cleanup, false],
    ['--probe-readiness', (c: ReturnType<typeof parseConfig>) => c.probe.readiness, false],
  ] as const;
  /** What a boolean needs beside it to be accepted. */
  const NEEDS: Record<string, string[]> = { '--probe-readiness': ['--probe-service=ns/web'] };

  it('lists every boolean flag of --help here, each with a [bool] value; no flag is a bare switch', () => {
    const help = buildCommand().helpInformation();
    const optional = [...help.matchAll(/^\s+(--[a-z-]+) \[bool\]/gm)].map((m) => m[1]);
    expect(optional.sort()).to.deep.equal(BOOLEANS.map(([flag]) => flag).sort());
    // A switch without a value would refuse --flag=true (booleanOption makes one that takes it).
    const switches = buildCommand()
      .options.filter((o) => !o.required && !o.optional && !['--help', '--version'].includes(o.long!))
      .map((o) => o.long);
    expect(switches).to.deep.equal([]);
  });

  for (const [flag, read, byDefault] of BOOLEANS) {
    it(`${flag}: absent is ${byDefault}; ${flag}, ${flag}=true and ${flag}=false; any other value refused`, () => {
      const env = { NODE_NAME: 'n' };
      const w = NEEDS[flag] ?? [];
      expect(read(parseConfig([...w], env))).to.equal(byDefault);
      expect(read(parseConfig([...w, flag], env))).to.equal(true);
      expect(read(parseConfig([...w, `${flag}=true`], env))).to.equal(true);
      expect(read(parseConfig([...w, `${flag}=false`], env))).to.equal(false);
      expect(read(parseConfig([...w, `${flag}=False`], env)), 'strconv.ParseBool spellings').to.equal(false);
      expect(read(parseConfig([...w, `${flag}=1`], env))).to.equal(true);
      fails([...w, `${flag}=yes`], new RegExp(`${flag}.*'yes' is not true or false`), env);
    });
  }

  it('--iptables-masquerade-bit is --masquerade-bit, counted as given; both only when they agree', () => {
    const c = parseConfig(['--iptables-masquerade-bit=15'], { NODE_NAME: 'n' });
    expect(c.model.masqueradeBit).to.equal(15);
    expect(c.modelSources.masqueradeBit).to.equal('flag');
    expect(parseConfig(['--iptables-masquerade-bit=3', '--masquerade-bit=3'], {}).model.masqueradeBit).to.equal(3);
    fails(['--iptables-masquerade-bit=3', '--masquerade-bit=4'], /--masquerade-bit and --iptables-masquerade-bit/);
    fails(['--iptables-masquerade-bit=40'], /^--iptables-masquerade-bit: '40' must be an integer from 0 to 31$/);
  });

  it('--hostname-override is --node-name, and wins over NODE_NAME as it does', () => {
    const c = parseConfig(['--hostname-override', 'worker-7'], { NODE_NAME: 'other' });
    expect(c.nodeName).to.equal('worker-7');
    expect(c.nodeNameGiven).to.equal(true);
    fails(['--hostname-override=a', '--node-name=b'], /--node-name and --hostname-override/);
  });
});
