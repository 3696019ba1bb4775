// The command line as users meet it: exit codes and one-line errors. No kernel access needed.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { once } from 'node:events';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { execa } from 'execa';
import { writeUnreachableKubeconfig } from '../support/fixtures.js';

const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
/** The clone: where `npx ipvs-node-controller` resolves to its own build. */
const REPO = fileURLToPath(new URL('../../../', import.meta.url));

function cli(args: string[], input?: string, env?: NodeJS.ProcessEnv) {
  return execa(process.execPath, [CLI, ...args], {
    reject: false,
    input: input ?? '',
    timeout: 100_000,
    ...(env ? { env, extendEnv: false } : {}),
  });
}

/** The environment of a machine outside any cluster, with HOME at `home`. */
function outsideCluster(home: string): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, HOME: home };
  delete env.KUBECONFIG;
  delete env.KUBERNETES_SERVICE_HOST;
  delete env.KUBERNETES_SERVICE_PORT;
  return env;
}

/** Two Nodes of a --from-file list: a (pod CIDR 10.1.0.0/24) and b (10.2.0.0/24). */
const TWO_NODES = [
  { kind: 'Node', metadata: { name: 'a' }, spec: { podCIDRs: ['10.1.0.0/24'] } },
  { kind: 'Node', metadata: { name: 'b' }, spec: { podCIDRs: ['10.2.0.0/24'] } },
];
/** shop/web of a --from-file list: 203.0.113.5, TCP port 443, to the ClusterIP 10.96.0.1. */
const SHOP_WEB = {
  kind: 'Service',
  metadata: { name: 'web', namespace: 'shop' },
  spec: { type: 'LoadBalancer', clusterIP: '10.96.0.1', ports: [{ port: 443 }] },
  status: { loadBalancer: { ingress: [{ ip: '203.0.113.5' }] } },
};

/** A loopback port held by the test: a controller that binds it first fails differently. */
async function heldPort(): Promise<{ port: number; close: () => void }> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { port: (server.address() as net.AddressInfo).port, close: () => server.close() };
}

describe('command line', function () {
  let dir: string;
  before(() => (dir = mkdtempSync(join(tmpdir(), 'cli-'))));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('--help lists every flag and exits 0', async () => {
    const r = await cli(['--help']);
    expect(r.exitCode).to.equal(0);
    for (const flag of ['--kubeconfig', '--backend', '--detect-local-mode', '--dry-run', '--from-file', '--cleanup']) {
      expect(r.stdout, flag).to.include(flag);
    }
  });

  it('a bad flag value is one line on stderr and exit code 2', async () => {
    const r = await cli(['--min-sync-period', 'soon']);
    expect(r.exitCode).to.equal(2);
    expect(r.stderr.split('\n')[0]).to.equal(
      "ipvs-node-controller: --min-sync-period: 'soon' is not a duration (write it as 30s, 500ms, 1m)",
    );
    expect(r.stdout).to.equal('');
  });

  it('--dry-run --from-file prints the ruleset with skips, without root or kernel', async () => {
    const r = await cli(['--dry-run', '--from-file', 'examples/services.yaml']);
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/^# 4 Services read; 5 IPv4 and 2 IPv6 entries/);
    expect(r.stdout).to.match(/# skipped shop\/behind-proxy: ipModeProxy \(ingress 10\.19\.30\.5\)/);
    expect(r.stdout).to.match(/10\.19\.20\.201 \. tcp \. 9100 comment "monitoring\/metrics" : 10\.231\.7\.9/);
  });

  it('--dry-run --backend=iptables prints the rules commented with namespace/name, and without with --iptables-comments=false', async () => {
    const args = ['--dry-run', '--backend=iptables', '--from-file', 'examples/services.yaml'];
    const commented = await cli(args);
    expect(commented.exitCode, commented.stderr).to.equal(0);
    expect(commented.stdout).to.match(/-d 10\.19\.20\.201\/32 -p tcp -m comment --comment "monitoring\/metrics" /);
    const bare = await cli([...args, '--iptables-comments=false']);
    expect(bare.exitCode, bare.stderr).to.equal(0);
    expect(bare.stdout).to.match(/-d 10\.19\.20\.201\/32 -p tcp -m addrtype /);
    expect(bare.stdout).not.to.include('--comment');
    expect(bare.stdout.replace(/^-A .*$/gm, '')).to.equal(commented.stdout.replace(/^-A .*$/gm, ''));
  });

  it('--from-file - reads kubectl JSON from stdin and picks the Node by --node-name', async () => {
    const list = {
      apiVersion: 'v1',
      kind: 'List',
      items: [...TWO_NODES, SHOP_WEB],
    };
    const r = await cli(['--dry-run', '--from-file', '-', '--node-name', 'b'], JSON.stringify(list));
    expect(r.exitCode, r.stderr).to.equal(0);
    // Node b's pod CIDR, not node a's.
    expect(r.stdout).to.match(/ip saddr 10\.2\.0\.0\/24 ip daddr/);
    expect(r.stdout).to.match(/203\.0\.113\.5 \. tcp \. 443 comment "shop\/web" : 10\.96\.0\.1/);
  });

  it("--from-file: addresses that point at the node, as the file's Node says, are skipped with a reason", async () => {
    const list = {
      apiVersion: 'v1',
      kind: 'List',
      items: [
        {
          kind: 'Node',
          metadata: { name: 'n1' },
          spec: { podCIDRs: ['10.1.0.0/24'] },
          status: {
            addresses: [
              { type: 'InternalIP', address: '192.168.50.1' },
              { type: 'Hostname', address: 'n1' },
            ],
          },
        },
        {
          kind: 'Service',
          metadata: { name: 'grabby', namespace: 'tenant' },
          spec: {
            type: 'LoadBalancer',
            clusterIP: '10.96.0.1',
            externalIPs: ['169.254.169.254', '192.168.50.1', '198.51.100.7', '203.0.113.9'],
            ports: [{ port: 80 }],
          },
          status: { loadBalancer: { ingress: [{ ip: '127.0.0.1' }, { ip: '203.0.113.5' }] } },
        },
      ],
    };
    const r = await cli(
      ['--dry-run', '--from-file', '-', '--node-name', 'n1', '--service-external-ip-range', '198.51.100.0/24'],
      JSON.stringify(list),
    );
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/^# 1 Services read; 2 IPv4 and 0 IPv6 entries/);
    expect(r.stdout).to.include('# skipped tenant/grabby: pointsAtNode (127.0.0.1 is a loopback address)');
    expect(r.stdout).to.include('# skipped tenant/grabby: pointsAtNode (169.254.169.254 is a link-local address)');
    expect(r.stdout).to.include(
      "# skipped tenant/grabby: pointsAtNode (192.168.50.1 is one of the node's own addresses)",
    );
    expect(r.stdout).to.include('# skipped tenant/grabby: externalIpNotAllowed (external IP 203.0.113.9)');
    expect(r.stdout).to.match(/203\.0\.113\.5 \. tcp \. 80 comment "tenant\/grabby" : 10\.96\.0\.1/);
    expect(r.stdout).to.match(/198\.51\.100\.7 \. tcp \. 80 comment "tenant\/grabby" : 10\.96\.0\.1/);
  });

  it("--from-file: a tenant's claim on the ClusterIP of kube-dns or of the API server is skipped", async () => {
    const service = (namespace: string, name: string, spec: object, status: object = {}) => ({
      kind: 'Service',
      metadata: { namespace, name, creationTimestamp: '2024-01-01T00:00:00Z' },
      spec,
      status,
    });
    const items = [
      // The tenant is listed, and was created, before the Services whose ClusterIPs it claims.
      service(
        'tenant',
        'grabby',
        {
          type: 'LoadBalancer',
          clusterIP: '10.96.7.7',
          externalIPs: ['10.96.0.10', '10.100.0.1', '192.168.9.9', '198.51.100.7'],
          ports: [{ port: 53, protocol: 'UDP' }],
        },
        { loadBalancer: { ingress: [{ ip: '10.96.0.1' }] } },
      ),
      service('kube-system', 'kube-dns', { clusterIP: '10.96.0.10', ports: [{ port: 53, protocol: 'UDP' }] }),
      service('default', 'kubernetes', { clusterIP: '10.96.0.1', ports: [{ port: 443 }] }),
    ];
    const r = await cli(
      [
        '--dry-run',
        '--from-file',
        '-',
        '--service-cluster-ip-range',
        '10.96.0.0/12',
        '--node-address-ranges',
        '192.168.9.0/24',
      ],
      JSON.stringify({ kind: 'List', items }),
    );
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/^# 3 Services read; 1 IPv4 and 0 IPv6 entries/);
    for (const detail of [
      '10.96.0.1 is the ClusterIP of a Service',
      '10.96.0.10 is the ClusterIP of a Service',
      '10.100.0.1 is inside the Service CIDR 10.96.0.0/12 (--service-cluster-ip-range)',
      '192.168.9.9 is inside the node address range 192.168.9.0/24 (--node-address-ranges)',
    ]) {
      expect(r.stdout).to.include(`# skipped tenant/grabby: clusterAddress (${detail})`);
    }
    expect(r.stdout).to.match(/198\.51\.100\.7 \. udp \. 53 comment "tenant\/grabby" : 10\.96\.7\.7/);
    expect(r.stdout).to.not.match(/10\.96\.0\.10 \. udp \. 53/);
  });

  it('--service-cluster-ip-range and --node-address-ranges: a bad value is one line and exit code 2', async () => {
    const bad = await cli(['--service-cluster-ip-range', '10.96.0.0/12,10.112.0.0/12']);
    expect(bad.exitCode).to.equal(2);
    expect(bad.stderr.split('\n')[0]).to.equal(
      "ipvs-node-controller: --service-cluster-ip-range: '10.96.0.0/12,10.112.0.0/12' must be one CIDR, or one IPv4 and one IPv6 (e.g. 10.96.0.0/12,fd00:10:96::/108)",
    );
    const notCidr = await cli(['--node-address-ranges', '192.168.9.0/33']);
    expect(notCidr.exitCode).to.equal(2);
    expect(notCidr.stderr.split('\n')[0]).to.equal(
      "ipvs-node-controller: --node-address-ranges: '192.168.9.0/33' is not a CIDR (e.g. 192.168.0.0/24,2001:db8:ffff::/64)",
    );
  });

  it('writes a large ruleset to a pipe completely before it exits', async () => {
    const items = Array.from({ length: 5000 }, (_, i) => ({
      kind: 'Service',
      metadata: { name: `s${i}`, namespace: 'big' },
      spec: { type: 'LoadBalancer', clusterIP: `10.96.${i >> 8}.${i & 255}`, ports: [{ port: 80 }] },
      status: { loadBalancer: { ingress: [{ ip: `172.16.${i >> 8}.${i & 255}` }] } },
    }));
    const r = await cli(['--dry-run', '--from-file', '-'], JSON.stringify({ kind: 'List', items }));
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout.match(/ comment "big\/s\d+" : /g)?.length).to.equal(5000);
    expect(r.stdout, 'the last table is there').to.match(/dnat ip6 to ip6 daddr/);
  });

  it('an unreadable or malformed file is one clear line and exit code 1', async () => {
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'items: [unclosed');
    const r = await cli(['--dry-run', '--from-file', bad]);
    expect(r.exitCode).to.equal(1);
    expect(r.stderr).to.match(/^ipvs-node-controller: --from-file: .*bad\.yaml: not valid YAML/);
    const missing = await cli(['--dry-run', '--from-file', join(dir, 'nope.json')]);
    expect(missing.exitCode).to.equal(1);
    expect(missing.stderr).to.match(/ENOENT|no such file/);
  });

  it('an unreachable API server is one clear line and exit code 1', async () => {
    const kubeconfig = join(dir, 'kubeconfig');
    writeUnreachableKubeconfig(kubeconfig);
    const r = await cli(['--dry-run', '--kubeconfig', kubeconfig]);
    expect(r.exitCode).to.equal(1);
    expect(r.stderr).to.match(/^ipvs-node-controller: cannot list Services from the API server: .*ECONNREFUSED/);
    expect(r.stderr.trim().split('\n')).to.have.lengthOf(1);
  });

  it('--kubeconfig naming a missing file: one line naming the flag, exit 2, before any port is bound', async () => {
    const held = await heldPort();
    try {
      // Were the metrics port bound first, this would fail with the port in use instead.
      const r = await cli(['--kubeconfig', '/nonexistent', `--metrics-bind-address=127.0.0.1:${held.port}`]);
      expect(r.exitCode).to.equal(2);
      expect(r.stderr.split('\n')[0]).to.equal(
        'ipvs-node-controller: --kubeconfig: cannot read /nonexistent: no such file',
      );
      expect(r.stdout, 'no log line: nothing was started').to.equal('');
    } finally {
      held.close();
    }
  });

  it('a --kubeconfig that is not a kubeconfig: exit 2 naming the flag, before any port is bound', async () => {
    const bad = join(dir, 'not-a-kubeconfig');
    writeFileSync(bad, 'clusters: {');
    const held = await heldPort();
    try {
      const r = await cli(['--kubeconfig', bad, `--metrics-bind-address=127.0.0.1:${held.port}`]);
      expect(r.exitCode).to.equal(2);
      expect(r.stderr.split('\n')[0]).to.match(/^ipvs-node-controller: --kubeconfig: /);
      expect(r.stdout).to.equal('');
    } finally {
      held.close();
    }
  });

  it('outside a cluster without any kubeconfig: says so and suggests --kubeconfig or KUBECONFIG, exit 2', async () => {
    const home = mkdtempSync(join(dir, 'home-'));
    const r = await cli([], '', outsideCluster(home));
    expect(r.exitCode).to.equal(2);
    const [line] = r.stderr.split('\n');
    expect(line).to.match(/^ipvs-node-controller: no kubeconfig found .*no in-cluster configuration/);
    expect(line).to.include('--kubeconfig').and.to.include('KUBECONFIG');
    expect(r.stderr).not.to.include('HTTP protocol');
    const viaEnv = await cli([], '', { ...outsideCluster(home), KUBECONFIG: join(home, 'nope') });
    expect(viaEnv.exitCode).to.equal(2);
    expect(viaEnv.stderr.split('\n')[0]).to.equal(
      `ipvs-node-controller: KUBECONFIG: cannot read ${join(home, 'nope')}: no such file`,
    );
  });

  /** A run that cannot bind its metrics port (another holds it): a fatal error, exit 1. */
  async function runWithMetricsPortTaken(name: string, args: string[] = []) {
    const kubeconfig = join(dir, name);
    writeUnreachableKubeconfig(kubeconfig);
    const held = await heldPort();
    try {
      return await cli([
        '--kubeconfig',
        kubeconfig,
        ...args,
        `--metrics-bind-address=127.0.0.1:${held.port}`,
        '--healthz-bind-address=',
      ]);
    } finally {
      held.close();
    }
  }

  it('a fatal error of a run is a JSON log line on stdout and one plain line on stderr, exit 1', async () => {
    const r = await runWithMetricsPortTaken('kubeconfig-fatal');
    expect(r.exitCode).to.equal(1);
    expect(r.stderr.trim().split('\n')).to.have.length(1);
    expect(r.stderr).to.match(/^ipvs-node-controller: .*(EADDRINUSE|in use)/);
    const fatal = r.stdout
      .trim()
      .split('\n')
      .map((l) => JSON.parse(l) as Record<string, any>)
      .at(-1)!;
    expect(fatal).to.include({ level: 'fatal', msg: 'Exiting', exitCode: 1 });
    expect(fatal.err.message).to.equal(r.stderr.trim().replace(/^ipvs-node-controller: /, ''));
    expect(new Date(fatal.time).toISOString()).to.equal(fatal.time);
  });

  it("--log-format=text: klog's text lines on stdout, the fatal one an F line with err and exitCode", async () => {
    const r = await runWithMetricsPortTaken('kubeconfig-fatal-text', ['--log-format=text']);
    expect(r.exitCode).to.equal(1);
    const lines = r.stdout.trim().split('\n');
    const header = /^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +(\d+) ipvs-node-controller\] "[A-Z][^"]*"/;
    for (const line of lines) expect(line).to.match(header);
    expect(lines[0]).to.match(/^I.* "Version info" node="[^"]+" version="[^"]+" /);
    const message = r.stderr.trim().replace(/^ipvs-node-controller: /, '');
    expect(lines.at(-1)).to.match(/^F\d{4} .*\] "Exiting" node="[^"]+" err="(.*)" exitCode=1$/);
    expect(JSON.parse(/ err=("(?:[^"\\]|\\.)*")/.exec(lines.at(-1)!)![1]!)).to.equal(message);
  });

  it('--log-format accepts json and text only: anything else is a usage error, exit 2', async () => {
    const r = await cli(['--log-format=yaml']);
    expect(r.exitCode).to.equal(2);
    expect(r.stderr.split('\n')[0]).to.match(/--log-format.*'yaml'.*json, text/);
    expect(r.stdout).to.equal('');
  });

  it("--node-name that is not in --from-file: one line and exit 1, never another node's pod CIDRs", async () => {
    const list = { kind: 'List', items: TWO_NODES };
    const r = await cli(['--dry-run', '--from-file', '-', '--node-name', 'nosuch'], JSON.stringify(list));
    expect(r.exitCode).to.equal(1);
    expect(r.stderr).to.equal('ipvs-node-controller: --node-name nosuch: no such Node in --from-file (it has a, b)');
    expect(r.stdout).to.equal('');
    const single = await cli(
      ['--dry-run', '--from-file', '-', '--node-name', 'nosuch'],
      JSON.stringify({ kind: 'List', items: [list.items[0]] }),
    );
    expect(single.exitCode, 'a single Node is not this node when --node-name names another').to.equal(1);
    const example = await cli(['--dry-run', '--from-file', 'examples/services.yaml', '--node-name', 'nosuch']);
    expect(example.exitCode).to.equal(1);
    expect(example.stderr).to.include('(it has worker-1)');
  });

  it('without --node-name, a file of several Nodes none of which is this host is an error', async () => {
    const list = { kind: 'List', items: TWO_NODES };
    const env: NodeJS.ProcessEnv = { ...process.env };
    delete env.NODE_NAME;
    const r = await cli(['--dry-run', '--from-file', '-'], JSON.stringify(list), env);
    expect(r.exitCode).to.equal(1);
    expect(r.stderr).to.match(/^ipvs-node-controller: --from-file: no Node named after this host .*pass --node-name$/);
  });

  it('the README preview line runs in the clone: npx resolves to its own build', async function () {
    // npx and a cold start of the bundle: seconds on a loaded machine; the command's own bound is below.
    this.timeout(180_000);
    const list = {
      kind: 'List',
      items: [{ kind: 'Node', metadata: { name: 'worker-1' }, spec: { podCIDRs: ['10.2.0.0/24'] } }, SHOP_WEB],
    };
    const r = await execa(
      'npx',
      ['--no-install', 'ipvs-node-controller', '--dry-run', '--from-file', '-', '--node-name', 'worker-1'],
      { cwd: join(REPO, 'docs'), input: JSON.stringify(list), reject: false, timeout: 150_000 },
    );
    expect(r.exitCode, r.stderr).to.equal(0);
    expect(r.stdout).to.match(/203\.0\.113\.5 \. tcp \. 443 comment "shop\/web" : 10\.96\.0\.1/);
  });
});
