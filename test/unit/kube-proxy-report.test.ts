// What operators see of kube-proxy without a kernel: the --dry-run header and migration report
// (the real CLI against a /proxyMode and /metrics stand-in on loopback and a KubeProxyConfiguration
// file), and /readyz while the controller steps aside and while kube-proxy has a known bug.

import { expect } from 'chai';
import http from 'node:http';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';
import { ApiReachability, judgeLiveness, judgeReadiness, type HealthInputs } from '../../src/health/health.js';
import type { ControllerStatus, KubeProxyStatus } from '../../src/controller/controller.js';
import { kubeProxyMetricsText } from '../support/kube-proxy-stand-in.js';

const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

/** A LoadBalancer Service of namespace shop as YAML: `metadata` and `spec` add to its own, in flow style. */
const lbYaml = (name: string, metadata: string, spec: string, ip: string) =>
  `apiVersion: v1\nkind: Service\nmetadata: {name: ${name}, namespace: shop${metadata}}\n` +
  `spec: {type: LoadBalancer, ${spec}}\nstatus: {loadBalancer: {ingress: [{ip: ${ip}}]}}\n`;

const OBJECTS = [
  'apiVersion: v1\nkind: Node\nmetadata: {name: node-1}\nspec: {podCIDRs: [10.244.1.0/24]}\n',
  lbYaml('local', '', 'externalTrafficPolicy: Local, clusterIP: 10.96.0.10, ports: [{port: 80}]', '192.0.2.10'),
  lbYaml('cluster', '', 'externalTrafficPolicy: Cluster, clusterIP: 10.96.0.11, ports: [{port: 443}]', '192.0.2.11'),
  lbYaml(
    'opted',
    ', annotations: {ipvs-node-controller/skip: "true"}',
    'clusterIP: 10.96.0.12, ports: [{port: 80}]',
    '192.0.2.12',
  ),
].join('---\n');

describe('--dry-run: kube-proxy settings, mode and the migration report', function () {
  let dir: string;
  let server: http.Server;
  let answer = 'ipvs';
  let version = 'v1.33.2';
  let address: string;

  before(async () => {
    dir = mkdtempSync(join(tmpdir(), 'kp-report-'));
    writeFileSync(join(dir, 'objects.yaml'), OBJECTS);
    writeFileSync(
      join(dir, 'config.conf'),
      'apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nmode: ipvs\n' +
        'iptables: {masqueradeBit: 15}\nclusterCIDR: 10.244.0.0/16\ndetectLocalMode: ClusterCIDR\n',
    );
    server = http.createServer((req, res) => res.end(req.url === '/metrics' ? kubeProxyMetricsText(version) : answer));
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    address = `127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
    rmSync(dir, { recursive: true, force: true });
  });

  const dryRun = (...extra: string[]) =>
    execa(
      process.execPath,
      [
        CLI,
        '--dry-run',
        '--from-file',
        join(dir, 'objects.yaml'),
        `--kube-proxy-config=${join(dir, 'config.conf')}`,
        `--kube-proxy-metrics-address=${address}`,
        ...extra,
      ],
      { reject: false, timeout: 100_000 },
    );

  it('IPVS mode: settings with their sources, and which Services depend on the controller', async () => {
    answer = 'ipvs';
    const r = await dryRun('--masquerade-bit=14');
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.include('# kube-proxy mode: ipvs (proxyMode: kube-proxy answers /proxyMode: ipvs)');
    expect(r.stdout).to.include('# setting masqueradeBit=14 (flag)');
    expect(r.stdout).to.include('# setting detectLocalMode=ClusterCIDR (kube-proxy-config)');
    expect(r.stdout).to.include('# setting clusterCidrs=10.244.0.0/16 (kube-proxy-config)');
    expect(r.stdout).to.match(/# {3}shop\/local 192\.0\.2\.10 TCP\/80: depends on the controller/);
    expect(r.stdout).to.match(/# {3}shop\/cluster 192\.0\.2\.11 TCP\/443: translated, but IPVS serves it without/);
    expect(r.stdout).to.match(/# {3}shop\/opted: opted out/);
    expect(r.stdout).to.include('# skipped shop/opted: optedOut');
    // The ruleset follows the effective settings: the flag's bit, the file's cluster CIDR.
    expect(r.stdout).to.include('0x00004000');
    expect(r.stdout).to.include('10.244.0.0/16');
  });

  it("kube-proxy's version, and in IPVS mode the bug a move to nftables mode would meet", async () => {
    answer = 'ipvs';
    version = 'v1.33.2';
    const r = await dryRun();
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.include('# kube-proxy version: v1.33.2\n');
    expect(r.stdout).to.not.include('# known bug'); // not in IPVS mode
    expect(r.stdout).to.match(
      /shop\/local 192\.0\.2\.10 TCP\/80: depends on the controller.*but kube-proxy v1\.33\.2 in nftables mode drops traffic from this node's pods to it .*kubernetes#131765.*upgrade kube-proxy first/,
    );
    expect(r.stdout).to.not.match(/shop\/cluster .*kubernetes#131765/); // Cluster policy: not concerned
    version = 'v1.33.6';
    const fixed = await dryRun();
    expect(fixed.stdout).to.include('# kube-proxy version: v1.33.6\n');
    expect(fixed.stdout).to.not.include('kubernetes#131765');
  });

  it('nftables mode with an affected kube-proxy: the known bug in the header and for the Local Services', async () => {
    answer = 'nftables';
    version = 'v1.33.5';
    const r = await dryRun();
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/# known bug: kube-proxy v1\.33\.5 has a known bug \(kubernetes#131765\)/);
    expect(r.stdout).to.match(
      /shop\/local 192\.0\.2\.10 TCP\/80: kube-proxy \(nftables\) serves it: .*but kube-proxy v1\.33\.5 drops traffic from this node's pods to it/,
    );
    version = 'v1.34.0';
    expect((await dryRun()).stdout).to.not.include('kubernetes#131765');
  });

  it('nftables mode: the controller steps aside, and no Service depends on it', async () => {
    answer = 'nftables';
    const r = await dryRun();
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.include('# kube-proxy mode: nftables (proxyMode');
    expect(r.stdout).to.include('the controller steps aside and programs nothing');
    expect(r.stdout).to.match(/shop\/local 192\.0\.2\.10 TCP\/80: kube-proxy \(nftables\) serves it: no dependency/);
    const off = await dryRun('--kube-proxy-step-aside=false');
    expect(off.stdout).to.match(/would preempt kube-proxy's DNAT/);
    expect(off.stdout).to.match(/our translation would break it/);
  });

  it('a malformed kube-proxy file is reported on one line and the flags and defaults apply', async () => {
    writeFileSync(join(dir, 'bad.conf'), 'iptables: {masqueradeBit: 40}\n');
    answer = 'garbage';
    const r = await execa(
      process.execPath,
      [
        CLI,
        '--dry-run',
        '--from-file',
        join(dir, 'objects.yaml'),
        `--kube-proxy-config=${join(dir, 'bad.conf')}`,
        `--kube-proxy-metrics-address=${address}`,
      ],
      { reject: false },
    );
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.match(
      /# kube-proxy configuration: .*bad\.conf not used: .*iptables\.masqueradeBit: 40 must be/,
    );
    expect(r.stdout).to.include('# setting masqueradeBit=14 (default)');
    expect(r.stdout).to.match(/# kube-proxy mode: unknown .*an answer that is no mode/);
    expect(r.stdout).to.include('# kube-proxy version: unknown (/proxyMode gives no mode)');
  });
});

describe('/readyz while stepped aside', () => {
  const T0 = 1_700_000_000_000;
  const kubeProxy: KubeProxyStatus = {
    mode: { mode: 'nftables', source: 'proxyMode', detail: 'kube-proxy answers /proxyMode: nftables' },
    steppedAside: true,
    reason: 'kube-proxy is in nftables mode (kube-proxy answers /proxyMode: nftables)',
    settings: [],
  };
  const inputs = (k: KubeProxyStatus): HealthInputs => {
    const status: ControllerStatus = {
      cachesSynced: true,
      lastSuccessfulSyncAt: T0,
      localPodMatchProblems: [],
      kubeProxy: k,
    };
    return { status, api: new ApiReachability(() => T0), syncPeriodMs: 30_000, startedAt: T0, now: T0 + 1000 };
  };

  it('is ready and healthy, and the detail says why nothing is programmed', () => {
    const ready = judgeReadiness(inputs(kubeProxy));
    expect(ready.ok).to.equal(true);
    expect(ready.detail).to.match(/^stepped aside, nothing is programmed: kube-proxy is in nftables mode/);
    expect(judgeLiveness(inputs(kubeProxy)).ok).to.equal(true);
  });

  it('with an affected kube-proxy: ready, and a warning names the bug, the version and the fix', () => {
    const affected = { ...kubeProxy, mode: { ...kubeProxy.mode, version: 'v1.33.2' } };
    const ready = judgeReadiness(inputs(affected));
    expect(ready.ok).to.equal(true);
    expect(ready.detail).to.match(/^stepped aside/);
    const [warning, ...others] = ready.warnings;
    expect(others).to.deep.equal([]);
    expect(warning).to.match(
      /^kube-proxy v1\.33\.2 has a known bug \(kubernetes#131765\): in nftables mode kube-proxy drops traffic from pods/,
    );
    expect(warning).to.include('v1.33.6 and v1.34.0 fix it');
    for (const version of ['v1.33.6', 'v1.34.0', undefined]) {
      const k = { ...kubeProxy, mode: { ...kubeProxy.mode, version } };
      expect(judgeReadiness(inputs(k)).warnings, String(version)).to.deep.equal([]);
    }
    const ipvs = {
      ...kubeProxy,
      steppedAside: false,
      reason: undefined,
      mode: { mode: 'ipvs' as const, source: 'proxyMode' as const, detail: '', version: 'v1.33.2' },
    };
    expect(judgeReadiness(inputs(ipvs)).warnings, 'IPVS mode').to.deep.equal([]);
  });

  it('with stepping aside off, warns that the translation breaks kube-proxy', () => {
    const ready = judgeReadiness(inputs({ ...kubeProxy, steppedAside: false }));
    expect(ready.ok).to.equal(true);
    expect(ready.warnings.join()).to.match(/translating although kube-proxy is in nftables mode/);
  });
});
