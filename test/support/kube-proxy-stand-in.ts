// A kube-proxy stand-in for kernel tests, in the node namespace (the test process's own): what a
// real kube-proxy leaves on a node in each mode, and on its metrics address GET /proxyMode and
// GET /metrics (the families around kubernetes_build_info as kube-proxy serves them, `version` in
// its git_version label).
//
//   ipvs:     kube-ipvs0 with the ClusterIP and the LoadBalancer IP bound; a server on the
//             ClusterIP (IPVS balancing it) and one on the LoadBalancer IP answering LB_PATH (what
//             an untranslated connection meets: IPVS's virtual service without local endpoints).
//   nftables: no kube-ipvs0; table `ip kube-proxy` DNATs ClusterIP:port and LB IP:port to the
//             endpoint at priority -100 (dstnat) in prerouting and output.
//   iptables: the same DNAT from nat PREROUTING/OUTPUT through a KUBE-SERVICES chain.
// The endpoint is a server in a namespace of its own, reached over a veth, as a pod elsewhere.

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import http from 'node:http';
import { randomBytes } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { NamedServer, sh } from '../../testbed/node-network.js';

export type StandInMode = 'ipvs' | 'nftables' | 'iptables';

export interface StandInService {
  clusterIp: string;
  lbIp: string;
  port: number;
  /** What the ClusterIP server answers in IPVS mode. */
  clusterName: string;
  /** What the LB IP answers when not translated in IPVS mode. */
  lbName: string;
}

export const ENDPOINT = { nodeSide: '10.244.9.1', address: '10.244.9.5', port: 8080, name: 'endpoint' };

/**
 * kube-proxy's /metrics as the Prometheus text format has it (families sorted by name, labels by
 * name, as client_golang writes them): some of what comes before kubernetes_build_info, the build
 * info with `version` as git_version (component-base/metrics/prometheus/version), some of what
 * follows. `histograms` repeats a histogram before it, to make the answer as long as wanted.
 */
export function kubeProxyMetricsText(version: string, histograms = 4): string {
  const [major, minor] = version.replace(/^v/, '').split('.');
  const lines = [
    '# HELP go_goroutines Number of goroutines that currently exist.',
    '# TYPE go_goroutines gauge',
    'go_goroutines 57',
  ];
  const buckets = [
    0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192, 16.384,
  ];
  for (let h = 0; h < histograms; h++) {
    const name = `kubeproxy_sync_proxy_rules_${h === 0 ? '' : `family${h}_`}duration_seconds`;
    lines.push(`# HELP ${name} [ALPHA] SyncProxyRules latency in seconds`, `# TYPE ${name} histogram`);
    for (const le of buckets) lines.push(`${name}_bucket{le="${le}"} ${Math.round(le * 1000)}`);
    lines.push(`${name}_bucket{le="+Inf"} 20000`, `${name}_sum 512.25`, `${name}_count 20000`);
  }
  lines.push(
    "# HELP kubernetes_build_info [ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running.",
    '# TYPE kubernetes_build_info gauge',
    `kubernetes_build_info{build_date="2025-06-17T18:30:14Z",compiler="gc",git_commit="a7245cdf3f69e11356c7e8f92b3e78ca4ee4e757",git_tree_state="clean",git_version="${version}",go_version="go1.24.4",major="${major}",minor="${minor}",platform="linux/amd64"} 1`,
    '# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.',
    '# TYPE process_cpu_seconds_total counter',
    'process_cpu_seconds_total 93.4',
    '# HELP rest_client_requests_total [ALPHA] Number of HTTP requests, partitioned by status code, method, and host.',
    '# TYPE rest_client_requests_total counter',
    'rest_client_requests_total{code="200",host="10.96.0.1:443",method="GET"} 1234',
  );
  return lines.join('\n') + '\n';
}

export class KubeProxyStandIn {
  mode: StandInMode | 'restarting' | undefined;
  /** What /metrics says in kubernetes_build_info's git_version (kube-proxy's own version). */
  version = 'v1.33.2';
  private metrics: http.Server | undefined;
  private servers: NamedServer[] = [];
  private endpoint: ChildProcess | undefined;
  private readonly suffix = randomBytes(3).toString('hex');
  readonly endpointNs = `ep-${this.suffix}`;

  constructor(
    private readonly service: StandInService,
    private readonly metricsPort = 10249,
  ) {}

  /** The endpoint's namespace and server; the metrics endpoint (answering from the first mode on). */
  async start(): Promise<void> {
    const ns = this.endpointNs;
    const nodeIf = `ve${this.suffix}`;
    sh('ip', ['netns', 'add', ns]);
    sh('ip', ['link', 'add', nodeIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
    sh('ip', ['addr', 'add', `${ENDPOINT.nodeSide}/24`, 'dev', nodeIf]);
    sh('ip', ['link', 'set', nodeIf, 'up']);
    const n = ['netns', 'exec', ns];
    sh('ip', [...n, 'ip', 'link', 'set', 'lo', 'up']);
    sh('ip', [...n, 'ip', 'addr', 'add', `${ENDPOINT.address}/24`, 'dev', 'eth0']);
    sh('ip', [...n, 'ip', 'link', 'set', 'eth0', 'up']);
    sh('ip', [...n, 'ip', 'route', 'add', 'default', 'via', ENDPOINT.nodeSide]);
    const script =
      `require('net').createServer((s) => { s.on('error', () => {}); s.end('${ENDPOINT.name}\\n'); })` +
      `.listen(${ENDPOINT.port}, '${ENDPOINT.address}', () => console.log('listening'));`;
    this.endpoint = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-e', script], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    await once(this.endpoint.stdout!, 'data');

    this.metrics = http.createServer((req, res) => {
      const answering = this.mode && this.mode !== 'restarting';
      if (req.url === '/proxyMode' && answering) res.end(this.mode);
      else if (req.url === '/metrics' && answering) {
        res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4; charset=utf-8' });
        res.end(kubeProxyMetricsText(this.version));
      } else res.writeHead(404).end();
    });
    this.metrics.listen(this.metricsPort, '127.0.0.1');
    await once(this.metrics, 'listening');
  }

  /** kube-proxy comes up in `mode`: its kernel state, then its /proxyMode answer. */
  async enter(mode: StandInMode): Promise<void> {
    const { clusterIp, lbIp, port } = this.service;
    const to = `${ENDPOINT.address}:${ENDPOINT.port}`;
    if (mode === 'ipvs') {
      sh('ip', ['link', 'add', 'kube-ipvs0', 'type', 'bridge']);
      sh('ip', ['link', 'set', 'kube-ipvs0', 'up']);
      for (const a of [clusterIp, lbIp]) sh('ip', ['addr', 'add', `${a}/32`, 'dev', 'kube-ipvs0']);
      this.servers.push(await NamedServer.start(clusterIp, port, this.service.clusterName));
      this.servers.push(await NamedServer.start(lbIp, port, this.service.lbName));
    } else if (mode === 'nftables') {
      sh(
        'nft',
        ['-f', '-'],
        `table ip kube-proxy {
          map service-ips { type ipv4_addr . inet_proto . inet_service : verdict
            elements = { ${clusterIp} . tcp . ${port} : goto svc-web, ${lbIp} . tcp . ${port} : goto svc-web } }
          chain svc-web { meta l4proto tcp dnat to ${to}; }
          chain services { ip daddr . meta l4proto . th dport vmap @service-ips; }
          chain nat-prerouting { type nat hook prerouting priority -100; policy accept; jump services; }
          chain nat-output { type nat hook output priority -100; policy accept; jump services; }
        }\n`,
      );
    } else {
      sh(
        'iptables-restore',
        ['--noflush', '-w'],
        `*nat
:KUBE-SERVICES - [0:0]
:KUBE-SVC-WEB - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A KUBE-SERVICES -d ${clusterIp}/32 -p tcp --dport ${port} -j KUBE-SVC-WEB
-A KUBE-SERVICES -d ${lbIp}/32 -p tcp --dport ${port} -j KUBE-SVC-WEB
-A KUBE-SVC-WEB -p tcp -j DNAT --to-destination ${to}
COMMIT
`,
      );
    }
    this.mode = mode;
  }

  /** kube-proxy stops: /proxyMode stops answering; its kernel state stays, as a real one's does. */
  stopAnswering(): void {
    this.mode = 'restarting';
  }

  /**
   * kube-proxy restarts as another build (an upgrade) in the same mode: it stops answering for
   * pauseMs, then answers with `version`; its kernel state stays, as a real one's does.
   */
  async restart(version: string, pauseMs: number): Promise<void> {
    const mode = this.mode as StandInMode;
    this.stopAnswering();
    await sleep(pauseMs);
    this.version = version;
    this.mode = mode;
  }

  /** What kube-proxy's start in another mode removes: the state of `mode`. */
  async leave(mode: StandInMode): Promise<void> {
    if (this.mode === mode) this.mode = undefined;
    if (mode === 'ipvs') {
      for (const s of this.servers.splice(0)) await s.stop();
      sh('ip', ['link', 'del', 'kube-ipvs0']);
    } else if (mode === 'nftables') {
      sh('nft', ['delete', 'table', 'ip', 'kube-proxy']);
    } else {
      for (const hook of ['PREROUTING', 'OUTPUT']) {
        sh('iptables', [
          '-w',
          '-t',
          'nat',
          '-D',
          hook,
          '-m',
          'comment',
          '--comment',
          'kubernetes service portals',
          '-j',
          'KUBE-SERVICES',
        ]);
      }
      for (const chain of ['KUBE-SERVICES', 'KUBE-SVC-WEB']) {
        sh('iptables', ['-w', '-t', 'nat', '-F', chain]);
        sh('iptables', ['-w', '-t', 'nat', '-X', chain]);
      }
    }
  }

  /**
   * A restart into another mode, as an operator does it: stop answering, (after a pause) remove
   * the old mode's state, set up the new one, answer again. Returns when the switch is done.
   */
  async switchMode(to: StandInMode, pauseMs: number): Promise<void> {
    const from = this.mode as StandInMode;
    this.stopAnswering();
    await sleep(pauseMs);
    await this.leave(from);
    await sleep(pauseMs);
    await this.enter(to);
  }

  async stop(): Promise<void> {
    const mode = this.mode;
    if (mode && mode !== 'restarting') {
      try {
        await this.leave(mode);
      } catch {
        // already gone
      }
    }
    for (const s of this.servers.splice(0)) await s.stop();
    if (this.metrics) {
      this.metrics.closeAllConnections();
      await new Promise((r) => this.metrics!.close(r));
    }
    if (this.endpoint && this.endpoint.exitCode === null) {
      this.endpoint.kill('SIGTERM');
      await once(this.endpoint, 'exit');
    }
    try {
      sh('ip', ['netns', 'del', this.endpointNs]);
    } catch {
      // already gone
    }
  }
}
