// deploy/monitoring in a real Prometheus server (Debian's prometheus), with two nodes' controllers
// as targets (HTTP servers serving their expositions) and kube-state-metrics' node and pod series
// (three Linux nodes, one without a controller, and a Windows and a virtual-kubelet node, which the
// DaemonSet does not run on):
//
// - kube-prometheus-stack's selection: its Prometheus loads only objects labelled
//   `release: <its Helm release>`; deploy/monitoring alone carries none (nothing would load),
//   deploy/monitoring-kube-prometheus-stack adds it to the PodMonitor and the PrometheusRule.
// - the PodMonitor as the Prometheus Operator turns it into a scrape configuration (its relabelling,
//   jobLabel and our `node` relabeling; the pod discovery replaced by static targets that carry the
//   discovery's meta labels), and, the other way the docs name, a plain scrape job without `node`.
// - with each: the rules load, per-node alerts are one per node and name it (or its address),
//   facts of the whole cluster (conflicts, versions) are one alert, every dashboard panel has data,
//   and "Skipped addresses" is one node's count, not the sum over nodes.

import { expect } from 'chai';
import { once } from 'node:events';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import YAML from 'yaml';
import { ControllerMetrics } from '../../src/metrics/controller-metrics.js';
import { registerProbeMetrics } from '../../src/metrics/probe-metrics.js';
import { eventually } from '../support/eventually.js';
import { PrometheusServer } from '../support/prometheus.js';

const run = promisify(execFile);
const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const P = 'ipvs_node_controller_';
type Json = Record<string, any>;

/** kube-prometheus-stack's default selectors: `release: <Helm release name>`. */
const HELM_RELEASE = 'kube-prometheus-stack';

async function kustomize(dir: string): Promise<Json[]> {
  const { stdout } = await run('kubectl', ['kustomize', join(repoRoot, dir)]);
  return YAML.parseAllDocuments(stdout).map((d) => d.toJSON() as Json);
}

const selected = (objects: Json[], kind: string) =>
  objects.filter((o) => o.kind === kind && o.metadata?.labels?.release === HELM_RELEASE);

interface NodeFixture {
  node: string;
  version: string;
  skipped: number;
  conflicts: number;
  /** probe_success of the Service both nodes probe. */
  probe: number;
}

const started = Date.now() / 1000;

/** The series the rules and the dashboard read, as one node's controller exposes them. */
function exposition(f: NodeFixture): string {
  const t = Date.now() / 1000;
  const n = Math.round(t - started); // counters that move between scrapes
  const histogram = (name: string, labels: string) => {
    const l = labels ? `${labels},` : '';
    return [
      `# TYPE ${name} histogram`,
      `${name}_bucket{${l}le="0.01"} ${n}`,
      `${name}_bucket{${l}le="0.1"} ${2 * n}`,
      `${name}_bucket{${l}le="+Inf"} ${2 * n}`,
      `${name}_sum{${labels}} ${0.05 * n}`,
      `${name}_count{${labels}} ${2 * n}`,
    ];
  };
  return [
    `# TYPE ${P}build_info gauge`,
    `${P}build_info{version="${f.version}",revision="r",node_version="v24",kernel="Linux 6.1",kernel_version="#1"} 1`,
    `# TYPE ${P}stepped_aside gauge`,
    `${P}stepped_aside 1`,
    `# TYPE ${P}kube_proxy_mode gauge`,
    `${P}kube_proxy_mode{mode="ipvs"} 1`,
    `# TYPE ${P}backend_info gauge`,
    `${P}backend_info{backend="nft",nft_executor="addon",nft_key_lookup="map",iptables_variant=""} 1`,
    `# TYPE ${P}programmed_entries gauge`,
    `${P}programmed_entries{backend="nft",family="ipv4"} 5`,
    `# TYPE ${P}last_successful_sync_timestamp_seconds gauge`,
    `${P}last_successful_sync_timestamp_seconds ${t}`,
    `# TYPE ${P}syncs_total counter`,
    `${P}syncs_total{backend="nft",mode="partial",fallback_reason=""} ${n}`,
    ...histogram(`${P}sync_duration_seconds`, 'backend="nft",mode="partial"'),
    ...histogram(`${P}network_programming_duration_seconds`, 'backend="nft"'),
    `# TYPE ${P}sync_errors_total counter`,
    `${P}sync_errors_total{backend="nft"} 0`,
    `# TYPE ${P}skipped_addresses gauge`,
    `${P}skipped_addresses{reason="ipModeProxy"} ${f.skipped}`,
    `# TYPE ${P}conflicts gauge`,
    `${P}conflicts{family="ipv4"} ${f.conflicts}`,
    `${P}conflicts{family="ipv6"} 0`,
    `# TYPE ${P}local_pod_detection_missing gauge`,
    `${P}local_pod_detection_missing{family="ipv4"} 0`,
    `# TYPE ${P}translated_connections_total counter`,
    `${P}translated_connections_total{family="ipv4",source="pods"} ${3 * n}`,
    `${P}translated_connections_total{family="ipv4",source="node"} ${n}`,
    `# TYPE ${P}probe_success gauge`,
    `${P}probe_success{service="shop/web",origin="annotation"} ${f.probe}`,
    `# TYPE ${P}probe_duration_seconds gauge`,
    `${P}probe_duration_seconds{service="shop/web"} 0.002`,
    `# TYPE ${P}probes_total counter`,
    `${P}probes_total{service="shop/web",outcome="answered"} ${n}`,
    `# TYPE ${P}conntrack_entries_deleted_total counter`,
    `${P}conntrack_entries_deleted_total ${n}`,
    `# TYPE ${P}conntrack_cleanup_errors_total counter`,
    `${P}conntrack_cleanup_errors_total 0`,
    ...['lists', 'watches', 'errors'].flatMap((what) => [
      `# TYPE ${P}informer_${what}_total counter`,
      `${P}informer_${what}_total{resource="services"} ${what === 'errors' ? 0 : n}`,
    ]),
    '# TYPE process_resident_memory_bytes gauge',
    'process_resident_memory_bytes 60000000',
    '# TYPE process_cpu_seconds_total counter',
    `process_cpu_seconds_total ${0.01 * n}`,
    '# TYPE process_start_time_seconds gauge',
    `process_start_time_seconds ${started}`,
    '',
  ].join('\n');
}

/**
 * kube-state-metrics with its default flags (no node labels): three Linux nodes, a controller pod
 * on the first two only, and two nodes the DaemonSet does not run on, without a pod either: a
 * Windows node (its os_image) and a virtual-kubelet (its taint).
 */
function kubeStateMetrics(): string {
  const os: Record<string, string> = {
    n1: 'Ubuntu 22.04.4 LTS',
    n2: 'Debian GNU/Linux 12 (bookworm)',
    n3: 'Flatcar Container Linux by Kinvolk 3815.2.0 (Oklo)',
    'win-1': 'Windows Server 2022 Datacenter',
    'virtual-node-aci-linux': '',
  };
  return [
    '# TYPE kube_node_info gauge',
    ...Object.entries(os).map(([n, image]) => `kube_node_info{node="${n}",os_image="${image}"} 1`),
    '# TYPE kube_node_labels gauge',
    ...Object.keys(os).map((n) => `kube_node_labels{node="${n}"} 1`),
    '# TYPE kube_node_spec_taint gauge',
    'kube_node_spec_taint{node="virtual-node-aci-linux",key="virtual-kubelet.io/provider",value="azure",effect="NoSchedule"} 1',
    '# TYPE kube_pod_info gauge',
    ...['n1', 'n2'].map(
      (n) =>
        `kube_pod_info{namespace="kube-system",pod="ipvs-node-controller-${n}",node="${n}",created_by_kind="DaemonSet",created_by_name="ipvs-node-controller"} 1`,
    ),
    '',
  ].join('\n');
}

async function serve(body: () => string): Promise<{ server: Server; target: string }> {
  const server = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
    res.end(body());
  });
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  return { server, target: `127.0.0.1:${(server.address() as AddressInfo).port}` };
}

/** snake_case keys, as Prometheus's configuration writes the PodMonitor's camelCase relabelings. */
function relabeling(r: Json): Json {
  return Object.fromEntries(Object.entries(r).map(([k, v]) => [k.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`), v]));
}

/** The label name kubernetes_sd gives a pod label (__meta_kubernetes_pod_label_<sanitised>). */
const podLabelMeta = (name: string) => `__meta_kubernetes_pod_label_${name.replace(/[^a-zA-Z0-9_]/g, '_')}`;

/**
 * The scrape configuration the Prometheus Operator generates for a PodMonitor's first endpoint
 * (its pod-label keep, port keep, namespace/container/pod/endpoint labels, job from jobLabel, then
 * the PodMonitor's relabelings), with static targets instead of the pod discovery, carrying the
 * meta labels the discovery would give each controller pod.
 */
function operatorScrapeConfig(podMonitor: Json, pods: Array<{ target: string; node: string }>, podLabels: Json): Json {
  const endpoint = podMonitor.spec.podMetricsEndpoints[0] as Json;
  const ns = podMonitor.metadata.namespace as string;
  const keep = Object.entries(podMonitor.spec.selector.matchLabels as Record<string, string>).map(([k, v]) => ({
    action: 'keep',
    source_labels: [podLabelMeta(k)],
    regex: v,
  }));
  return {
    job_name: `podMonitor/${ns}/${podMonitor.metadata.name}/0`,
    metrics_path: endpoint.path,
    static_configs: pods.map((p) => ({
      targets: [p.target],
      labels: {
        __meta_kubernetes_namespace: ns,
        __meta_kubernetes_pod_name: `ipvs-node-controller-${p.node}`,
        __meta_kubernetes_pod_node_name: p.node,
        __meta_kubernetes_pod_container_name: 'controller',
        __meta_kubernetes_pod_container_port_name: 'metrics',
        ...Object.fromEntries(Object.entries(podLabels).map(([k, v]) => [podLabelMeta(k), v])),
      },
    })),
    relabel_configs: [
      ...keep,
      { action: 'keep', source_labels: ['__meta_kubernetes_pod_container_port_name'], regex: endpoint.port },
      { source_labels: ['__meta_kubernetes_namespace'], target_label: 'namespace' },
      { source_labels: ['__meta_kubernetes_pod_container_name'], target_label: 'container' },
      { source_labels: ['__meta_kubernetes_pod_name'], target_label: 'pod' },
      { target_label: 'job', replacement: `${ns}/${podMonitor.metadata.name}` },
      {
        source_labels: [podLabelMeta(podMonitor.spec.jobLabel)],
        target_label: 'job',
        regex: '(.+)',
        replacement: '${1}',
      },
      { target_label: 'endpoint', replacement: endpoint.port },
      ...((endpoint.relabelings ?? []) as Json[]).map(relabeling),
    ],
  };
}

describe('deploy/monitoring in a real Prometheus, two nodes (kube-prometheus-stack selection, with and without the node label)', function () {
  this.timeout(180_000);
  const fixtures: NodeFixture[] = [
    { node: 'n1', version: '0.4.0', skipped: 3, conflicts: 1, probe: 1 },
    { node: 'n2', version: '0.3.0', skipped: 3, conflicts: 1, probe: 0 },
  ];
  const servers: Server[] = [];
  const targets: Array<{ target: string; node: string }> = [];
  let ksm: string;
  let dir: string;
  let withLabel: Json[];
  let plain: Json[];
  let dashboard: {
    panels: Array<{ type: string; title: string; targets?: Array<{ expr: string }> }>;
    templating: Json;
  };
  let podLabels: Json;

  before(async function () {
    if ((await run('sh', ['-c', 'command -v prometheus']).catch(() => undefined)) === undefined) {
      throw new Error('prometheus is not installed (bash scripts/install-system-packages.sh)');
    }
    dir = await mkdtemp(join(tmpdir(), 'monitoring-prometheus-'));
    for (const f of fixtures) {
      const s = await serve(() => exposition(f));
      servers.push(s.server);
      targets.push({ target: s.target, node: f.node });
    }
    const k = await serve(kubeStateMetrics);
    servers.push(k.server);
    ksm = k.target;
    plain = await kustomize('deploy/monitoring');
    withLabel = await kustomize('deploy/monitoring-kube-prometheus-stack');
    dashboard = JSON.parse(await readFile(join(repoRoot, 'deploy', 'monitoring', 'dashboard.json'), 'utf8'));
    const ds = (await kustomize('deploy/overlays/nft')).find((o) => o.kind === 'DaemonSet')!;
    podLabels = ds.spec.template.metadata.labels;
  });

  after(async () => {
    for (const s of servers) s.close();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it("the fixture's series are the controller's: same names and types as its registry", async () => {
    // As the nft backend runs it: with the counts of translated connections.
    const controller = new ControllerMetrics();
    controller.countTranslations(async () => []);
    registerProbeMetrics(controller.registry);
    const real = new Map(
      [...(await controller.exposition()).text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1], m[2]]),
    );
    const ours = [...exposition(fixtures[0]!).matchAll(/^# TYPE (\S+) (\S+)$/gm)];
    expect(ours.length).to.be.greaterThan(15);
    for (const [, name, type] of ours) expect(real.get(name), name).to.equal(type);
  });

  it('kube-prometheus-stack selects nothing of deploy/monitoring alone, and both objects with the documented label', () => {
    expect(selected(plain, 'PodMonitor')).to.have.lengthOf(0);
    expect(selected(plain, 'PrometheusRule')).to.have.lengthOf(0);
    expect(selected(withLabel, 'PodMonitor')).to.have.lengthOf(1);
    expect(selected(withLabel, 'PrometheusRule')).to.have.lengthOf(1);
    // The label is the objects' own; the PodMonitor still selects the controller's pods.
    const pm = selected(withLabel, 'PodMonitor')[0]!;
    expect(pm.spec.selector).to.deep.equal(plain.find((o) => o.kind === 'PodMonitor')!.spec.selector);
  });

  for (const way of ['PodMonitor (the operator, node label)', 'plain scrape job (no node label)'] as const) {
    describe(way, () => {
      const prometheus = new PrometheusServer();
      const byPodMonitor = way.startsWith('PodMonitor');
      const who = (i: number) => (byPodMonitor ? fixtures[i]!.node : targets[i]!.target);

      before(async () => {
        const rule = selected(withLabel, 'PrometheusRule')[0]!;
        const scrape = byPodMonitor
          ? operatorScrapeConfig(selected(withLabel, 'PodMonitor')[0]!, targets, podLabels)
          : // docs/operations.md, "Without the Prometheus Operator": a job of that name, no node label.
            { job_name: 'ipvs-node-controller', static_configs: [{ targets: targets.map((t) => t.target) }] };
        const sub = await mkdtemp(join(dir, 'p-'));
        await prometheus.start(
          sub,
          {
            scrape_configs: [
              scrape,
              { job_name: 'kube-state-metrics', honor_labels: true, static_configs: [{ targets: [ksm] }] },
            ],
          },
          { groups: rule.spec.groups },
        );
      });
      after(() => prometheus.stop());

      it('scrapes both nodes under job="ipvs-node-controller"', async () => {
        const up = await eventually(
          'two targets up',
          async () => {
            const r = await prometheus.query('up{job="ipvs-node-controller"} == 1');
            return r.length === 2 && r;
          },
          60_000,
        );
        const nodes = up.map((r) => r.metric.node).sort();
        expect(nodes).to.deep.equal(byPodMonitor ? ['n1', 'n2'] : [undefined, undefined]);
        if (byPodMonitor) expect(up.map((r) => r.metric.namespace)).to.deep.equal(['kube-system', 'kube-system']);
      });

      it('loads every rule: per-node alerts once per node, naming it; cluster facts once; Missing for the Linux node without a pod only', async () => {
        const groups = await prometheus.rules();
        expect(groups.flatMap((g) => g.rules as Json[]).filter((r) => r.health !== 'ok')).to.deep.equal([]);
        const count = (alerts: Json[], name: string) => alerts.filter((a) => a.labels.alertname === name);
        const alerts = await eventually(
          'the alerts pending',
          async () => {
            const a = await prometheus.alerts();
            return count(a, 'IpvsNodeControllerSteppedAside').length === 2 &&
              count(a, 'IpvsNodeControllerConflicts').length === 1 &&
              count(a, 'IpvsNodeControllerVersionsDiffer').length === 1 &&
              count(a, 'IpvsNodeControllerProbeFailingOnSomeNodes').length === 1 &&
              count(a, 'IpvsNodeControllerMissing').length === 1
              ? a
              : undefined;
          },
          60_000,
        );
        // Waited for above, and nothing more than that appears after a few more evaluations.
        await new Promise((r) => setTimeout(r, 3000));
        const later = await prometheus.alerts();
        for (const name of [
          'IpvsNodeControllerConflicts',
          'IpvsNodeControllerVersionsDiffer',
          'IpvsNodeControllerMissing',
          'IpvsNodeControllerProbeFailingOnSomeNodes',
        ])
          expect(count(later, name), name).to.have.lengthOf(1);
        const probe = count(alerts, 'IpvsNodeControllerProbeFailingOnSomeNodes')[0]!;
        expect(probe.labels.service).to.equal('shop/web');
        expect(probe.annotations.description).to.match(/^The probe of Service shop\/web has failed on 1 nodes /);
        expect(count(later, 'IpvsNodeControllerSteppedAside')).to.have.lengthOf(2);
        const stepped = count(alerts, 'IpvsNodeControllerSteppedAside').map((a) => a.annotations.description as string);
        expect(stepped.sort()).to.deep.equal(
          [0, 1]
            .map(
              (i) =>
                `kube-proxy on ${who(i)} has not been in IPVS mode for a day, so the controller there programs nothing. If the cluster has left IPVS mode for good, uninstall the controller.`,
            )
            .sort(),
        );
        // Not the Windows node nor the virtual-kubelet, which have no pod either.
        expect(count(later, 'IpvsNodeControllerMissing').map((a) => a.labels.node)).to.deep.equal(['n3']);
        expect(count(alerts, 'IpvsNodeControllerConflicts')[0]!.annotations.description).to.match(/^1 claims /);
        expect(count(alerts, 'IpvsNodeControllerVersionsDiffer')[0]!.annotations.description).to.include(
          'in 2 versions',
        );
        // Nothing fires that the fixture does not call for: both nodes sync and answer.
        const names = new Set(later.map((a) => a.labels.alertname as string));
        expect([...names].sort()).to.deep.equal([
          'IpvsNodeControllerConflicts',
          'IpvsNodeControllerMissing',
          'IpvsNodeControllerProbeFailingOnSomeNodes',
          'IpvsNodeControllerSteppedAside',
          'IpvsNodeControllerVersionsDiffer',
        ]);
      });

      it("every dashboard panel has data with the variables at All; the node picker lists the nodes' names (the address picker their addresses); skipped addresses are not summed over nodes", async () => {
        const variable = (name: string) => (dashboard.templating.list as Json[]).find((v) => v.name === name)!;
        const asGrafana = (expr: string, values: Record<string, string> = {}) =>
          expr
            .replaceAll('$cluster', variable('cluster').allValue)
            .replaceAll('$node', values.node ?? variable('node').allValue)
            .replaceAll('$instance', variable('instance').allValue)
            .replaceAll('$__rate_interval', '1m');
        const values = async (name: string, picked: Record<string, string> = {}) => {
          const [, series, label] = /^label_values\((.+), (\w+)\)$/.exec(variable(name).definition)!;
          expect(label).to.equal(name);
          const r = await prometheus.query(asGrafana(series!, picked));
          return [...new Set(r.map((x) => x.metric[label!]).filter((v) => v !== undefined))].sort();
        };
        // Grafana lists a label's values; series without the label add none (the plain job: only All).
        expect(await values('node')).to.deep.equal(byPodMonitor ? ['n1', 'n2'] : []);
        expect(await values('instance')).to.deep.equal(targets.map((t) => t.target).sort());
        if (byPodMonitor) expect(await values('instance', { node: 'n2' })).to.deep.equal([targets[1]!.target]);
        // Every panel that follows the address picker follows the node picker too.
        for (const panel of dashboard.panels)
          for (const target of panel.targets ?? [])
            if (target.expr.includes('$instance')) expect(target.expr, panel.title).to.include('node=~"$node"');
        let missing: string[] = [];
        await eventually(
          'data in every panel',
          async () => {
            missing = [];
            for (const panel of dashboard.panels.filter((p) => p.type !== 'row'))
              for (const target of panel.targets ?? []) {
                const r = await prometheus.query(asGrafana(target.expr));
                if (!r.some((x) => Number.isFinite(Number(x.value[1])))) missing.push(`${panel.title}: ${target.expr}`);
              }
            return missing.length === 0;
          },
          30_000,
        ).catch((err: Error) => {
          throw new Error(`${err.message}; without data: ${missing.join(' | ')}`);
        });
        const expr = (title: string) => asGrafana(dashboard.panels.find((p) => p.title === title)!.targets![0]!.expr);
        if (byPodMonitor) {
          // One node picked: the panels show that node's controller only.
          const versions = dashboard.panels.find((p) => p.title === 'Versions running')!.targets![0]!.expr;
          const picked = await prometheus.query(asGrafana(versions, { node: 'n2' }));
          expect(picked.map((r) => r.metric.version)).to.deep.equal(['0.3.0']);
        }
        const skipped = await prometheus.query(expr('Skipped addresses by reason'));
        expect(skipped.map((r) => Number(r.value[1]))).to.deep.equal([3]);
        const conflicts = await prometheus.query(expr('Conflicts'));
        expect(conflicts.map((r) => [r.metric.family, Number(r.value[1])]).sort()).to.deep.equal([
          ['ipv4', 1],
          ['ipv6', 0],
        ]);
      });
    });
  }
});
