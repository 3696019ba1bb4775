// Operating the controller end to end: the real CLI, as a child process, against the API
// stand-in, programming this (isolated) network namespace. /metrics is scraped while it works and
// compared with the kernel, promtool and a real Prometheus server read it, and /healthz and
// /readyz are followed through their states: caches not synced, ready, API server gone, kernel
// refusing our changes.

import { expect } from 'chai';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, readFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { setTimeout as sleep } from 'node:timers/promises';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { MAP_NAME, TABLE_NAME } from '../../src/backends/nft/render.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { probe, requireTools, sh } from '../../testbed/node-network.js';
import { Exposition, httpGet, promtoolCheckMetrics, scrapeMetrics } from '../support/scrape.js';
import {
  LB_PATH,
  LB_PROXY,
  LB_V4,
  LB_V6,
  SERVICES,
  Scenario,
  applyScenario,
  tearDownCliRun,
  wireService,
} from './scenario.js';
import { rejectionOf } from '../support/assertions.js';
import { eventually } from '../support/eventually.js';
import { PrometheusServer } from '../support/prometheus.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';

const METRICS = 'http://127.0.0.1:9477';
const HEALTH = 'http://127.0.0.1:9478';
const P = 'ipvs_node_controller_';

async function health(path: '/healthz' | '/readyz'): Promise<{ status: number; detail: string }> {
  const a = await httpGet(HEALTH + path);
  return { status: a.status, detail: String(JSON.parse(a.body).detail) };
}

/** Elements of our IPv4 map, as the kernel lists them. */
function programmedIpv4Elements(): number {
  const listing = JSON.parse(sh('nft', ['-j', 'list', 'map', 'ip', TABLE_NAME, MAP_NAME])) as {
    nftables: Array<{ map?: { elem?: unknown[] } }>;
  };
  return listing.nftables.find((o) => o.map)?.map?.elem?.length ?? 0;
}

function tableExists(): boolean {
  return sh('nft', ['list', 'tables']).includes(`table ip ${TABLE_NAME}`);
}

const syncCount = (e: Exposition) => e.sum(`${P}sync_duration_seconds_count`);

const REPO_ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

describe('operating the controller (real CLI, API stand-in, metrics, health, Prometheus)', function () {
  this.timeout(180_000);
  const scenario = new Scenario();
  let api: ApiStandIn;
  let dir: string;
  let controller: ChildProcess | undefined;
  const prometheus = new PrometheusServer();
  let tableHolder: ChildProcess | undefined;
  const logLines: string[] = [];

  before(async () => {
    requireTools('nft', 'promtool', 'prometheus');
    await scenario.setUp();
    dir = await mkdtemp(join(tmpdir(), 'e2e-ops-'));
    api = await ApiStandIn.start({ bookmarkIntervalMs: 200 });
    applyScenario(api);
    await api.writeKubeconfig(join(dir, 'kubeconfig'));
  });

  afterEach(function () {
    if (this.currentTest?.state === 'failed') console.log(`controller log:\n${logLines.join('\n')}`);
  });

  after(async () => {
    await prometheus.stop();
    await tearDownCliRun([tableHolder, controller], api, scenario, dir);
  });

  it('before the caches sync: alive, not ready, and the kernel untouched', async () => {
    api.setUnavailable(true);
    controller = spawn(
      process.execPath,
      shippedArgs([
        `--kubeconfig=${join(dir, 'kubeconfig')}`,
        '--node-name=node-1',
        '--sync-period=1s',
        '--min-sync-period=0s',
        '--metrics-bind-address=127.0.0.1:9477',
        '--healthz-bind-address=127.0.0.1:9478',
        '--emit-events',
        // Its probe series for the dashboard, and no connection the counters would count: the
        // node translates nothing of an ipMode Proxy Service, so nothing of it is tried.
        '--probe-service=default/svc-proxy',
      ]),
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    let partial = '';
    controller.stdout!.on('data', (d: Buffer) => {
      const lines = (partial + d.toString()).split('\n');
      partial = lines.pop()!;
      logLines.push(...lines);
    });
    const readyz = await eventually('an unreachable API server on /readyz', async () => {
      const r = await health('/readyz');
      return r.detail.includes('unreachable') && r;
    });
    expect(readyz.status).to.equal(503);
    expect(readyz.detail).to.match(
      /^waiting for the Service and Node caches to sync: the API server has been unreachable/,
    );
    const healthz = await health('/healthz');
    expect(healthz.status).to.equal(200);
    expect(healthz.detail).to.match(/^waiting for the Service and Node caches to sync/);
    expect(tableExists()).to.equal(false);
    const e = await scrapeMetrics(METRICS);
    expect(e.sum(`${P}informer_errors_total`)).to.be.at.least(1);
    expect(syncCount(e)).to.equal(0);
  });

  it('after the first sync: ready, and the entries gauge equals what the kernel holds', async () => {
    api.setUnavailable(false);
    await eventually('/readyz 200', async () => (await health('/readyz')).status === 200);
    expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80)).to.equal('svc-a');

    const e = await scrapeMetrics(METRICS);
    const ipv4 = e.value(`${P}programmed_entries`, { backend: 'nft', family: 'ipv4' });
    expect(ipv4).to.equal(programmedIpv4Elements());
    expect(ipv4).to.equal(4); // svc-a TCP+UDP/80, svc-b TCP/8080, svc-ext TCP/443
    expect(e.value(`${P}programmed_entries`, { backend: 'nft', family: 'ipv6' })).to.equal(2);
    expect(e.value(`${P}skipped_addresses`, { reason: 'ipModeProxy' })).to.equal(1);
    expect(e.value(`${P}skipped_addresses`, { reason: 'hostnameOnly' })).to.equal(1);
    // The key lookup is the kernel's: the map where it takes it, else the key set.
    const info = [...e.samples].filter(([k]) => k.startsWith(`${P}backend_info{`));
    expect(info).to.have.lengthOf(1);
    expect(info[0]![0]).to.match(
      /\{backend="nft",iptables_variant="none",nft_executor="addon",nft_key_lookup="(map|set)"\}$/,
    );
    expect(info[0]![1]).to.equal(1);
    expect(e.value(`${P}informer_lists_total`, { resource: 'services' })!).to.be.at.least(1);
    expect(e.value(`${P}informer_watches_total`, { resource: 'nodes' })!).to.be.at.least(1);
    const last = e.value(`${P}last_successful_sync_timestamp_seconds`)!;
    expect(Math.abs(last - Date.now() / 1000), `implausible timestamp ${last}`).to.be.below(3600);
    expect(e.value('process_resident_memory_bytes')!).to.be.above(0);
  });

  it('the translated-connections counter moves by exactly the connections made, by family and source', async () => {
    const count = (e: Exposition, family: string, source: string) =>
      e.value(`${P}translated_connections_total`, { family, source }) ?? 0;
    const rows = [
      ['ipv4', 'pods'],
      ['ipv4', 'node'],
      ['ipv6', 'pods'],
      ['ipv6', 'node'],
    ] as const;
    // A scrape within a second of the last read shares it: the first read after this wait is
    // the kernel's count now.
    await sleep(1_100);
    const before = await eventually('the counters of both families', async () => {
      const e = await scrapeMetrics(METRICS);
      return (
        rows.every(
          ([family, source]) => e.value(`${P}translated_connections_total`, { family, source }) !== undefined,
        ) && e
      );
    });
    const pod = scenario.network.pod.ns;
    const made = { 'ipv4 pods': 0, 'ipv4 node': 0, 'ipv6 pods': 0, 'ipv6 node': 0 };
    const connect = async (
      ns: string | undefined,
      protocol: 'tcp' | 'udp',
      address: string,
      key: keyof typeof made,
    ) => {
      expect(await probe(ns, protocol, address, 80)).to.match(/^svc-a/);
      made[key]++;
    };
    for (let i = 0; i < 3; i++) await connect(pod, 'tcp', LB_V4, 'ipv4 pods');
    await connect(pod, 'udp', LB_V4, 'ipv4 pods');
    for (let i = 0; i < 2; i++) await connect(undefined, 'tcp', LB_V4, 'ipv4 node');
    await connect(pod, 'tcp', LB_V6, 'ipv6 pods');
    await connect(undefined, 'tcp', LB_V6, 'ipv6 node');
    // A connection to an address we do not translate counts nowhere.
    expect(await probe(pod, 'tcp', LB_PROXY, 80)).to.equal(LB_PATH);
    const wanted = (family: string, source: string) =>
      count(before, family, source) + made[`${family} ${source}` as keyof typeof made];
    const after = await eventually('the counters moved by the connections made', async () => {
      const e = await scrapeMetrics(METRICS);
      return rows.every(([f, s]) => count(e, f, s) >= wanted(f, s)) && e;
    });
    for (const [family, source] of rows) {
      expect(count(after, family, source), `${family} ${source}`).to.equal(wanted(family, source));
    }
  });

  it('a Service change moves the counters: syncs, programming latency, entries, skips, Events', async () => {
    const before = await scrapeMetrics(METRICS);
    api.apply({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { namespace: 'default', name: 'svc-new' },
      spec: {
        type: 'LoadBalancer',
        clusterIP: '10.96.0.11',
        clusterIPs: ['10.96.0.11'],
        ports: [{ port: 9090, protocol: 'TCP' }],
      },
      status: { loadBalancer: { ingress: [{ ip: LB_V4 }, { ip: '192.0.2.30', ipMode: 'Proxy' }] } },
    });
    const after = await eventually('the new entry in the metrics', async () => {
      const e = await scrapeMetrics(METRICS);
      return e.value(`${P}programmed_entries`, { backend: 'nft', family: 'ipv4' }) === 5 && e;
    });
    expect(programmedIpv4Elements()).to.equal(5);
    expect(syncCount(after)).to.be.above(syncCount(before));
    const latency = (e: Exposition) =>
      e.value(`${P}network_programming_duration_seconds_count`, { backend: 'nft' }) ?? 0;
    expect(latency(after), 'the change was timed').to.be.above(latency(before));
    expect(after.value(`${P}skipped_addresses`, { reason: 'ipModeProxy' })).to.equal(2);
    expect(after.value(`${P}skip_events_total`, { reason: 'ipModeProxy' })).to.equal(2);

    const events = await eventually('the Event on svc-new', async () => {
      const found = api.list('Event').filter((ev) => ev.involvedObject.name === 'svc-new');
      return found.length > 0 && found;
    });
    expect(events).to.have.lengthOf(1);
    expect(events[0]!.type).to.equal('Normal');
    expect(events[0]!.message).to.match(/^ingress 192\.0\.2\.30: not translated/);
  });

  it('full resyncs go on without a log line each', async () => {
    const start = syncCount(await scrapeMetrics(METRICS));
    const linesBefore = logLines.length;
    await eventually('three more syncs', async () => syncCount(await scrapeMetrics(METRICS)) >= start + 3);
    expect(logLines.slice(linesBefore)).to.deep.equal([]);
  });

  it('promtool check metrics passes on the live exposition', async () => {
    const { text } = await scrapeMetrics(METRICS);
    const verdict = await promtoolCheckMetrics(text);
    expect(verdict.code, verdict.output).to.equal(0);
    expect(verdict.output.trim()).to.equal('');
  });

  it('a Prometheus server scrapes it: up == 1, and our series are queryable', async () => {
    await prometheus.start(dir, {
      scrape_configs: [
        {
          job_name: 'ipvs-node-controller',
          // As the PodMonitor's relabeling names the series: by the node.
          static_configs: [{ targets: ['127.0.0.1:9477'], labels: { node: 'node-1' } }],
        },
      ],
    });
    const up = await eventually(
      'up{job="ipvs-node-controller"} == 1',
      async () => {
        const r = await prometheus.query('up{job="ipvs-node-controller"}');
        return r.length === 1 && r[0]!.value[1] === '1' && r;
      },
      60_000,
    );
    expect(up[0]!.metric.instance).to.equal('127.0.0.1:9477');
    const entries = await prometheus.query(`${P}programmed_entries{family="ipv4"}`);
    expect(entries).to.have.lengthOf(1);
    expect(entries[0]!.value[1]).to.equal('5');
    expect(entries[0]!.metric.backend).to.equal('nft');
  });

  it('every panel of the Grafana dashboard (deploy/monitoring) returns data from that Prometheus', async () => {
    const dashboard = JSON.parse(await readFile(join(REPO_ROOT, 'deploy', 'monitoring', 'dashboard.json'), 'utf8')) as {
      panels: Array<{ type: string; title: string; targets?: Array<{ expr: string }> }>;
      templating: { list: Array<{ name: string; definition?: string }> };
    };
    const panels = dashboard.panels.filter((p) => p.type !== 'row');
    expect(panels.length).to.be.greaterThan(10);
    // The address selector offers this node's controller (by its scrape address; a plain scrape
    // job gives no `node` label, so the node selector has only All here).
    const nodeVariable = dashboard.templating.list.find((v) => v.name === 'instance')!;
    const metric = /^label_values\((.+), instance\)$/.exec(nodeVariable.definition ?? '')?.[1];
    expect(metric, nodeVariable.definition).to.be.a('string');
    // A Service change while Prometheus scrapes: programming latency and sync counters move in the window.
    api.apply(wireService({ ...SERVICES[0]!, name: 'dashboard-change', ingress: [{ ip: '10.19.99.1' }] }));
    // Grafana's variables as a user with "All" nodes sees them.
    const asGrafana = (expr: string) =>
      expr
        .replaceAll('$cluster', '.*')
        .replaceAll('$node', '.*')
        .replaceAll('$instance', '.*')
        .replaceAll('$__rate_interval', '1m');
    let missing: string[] = [];
    await eventually(
      'data from every panel',
      async () => {
        const values = await prometheus.query(asGrafana(metric!));
        missing = values.some((r) => r.metric.instance === '127.0.0.1:9477') ? [] : ['the node variable'];
        for (const panel of panels) {
          expect(panel.targets?.length, panel.title).to.be.greaterThan(0);
          for (const target of panel.targets!) {
            const result = await prometheus.query(asGrafana(target.expr));
            if (!result.some((r) => Number.isFinite(Number(r.value[1]))))
              missing.push(`${panel.title}: ${target.expr}`);
          }
        }
        return missing.length === 0;
      },
      90_000,
    ).catch((err: Error) => {
      throw new Error(`${err.message}; without data: ${missing.join(' | ')}`);
    });
    api.remove('Service', SERVICES[0]!.namespace, 'dashboard-change');
    await eventually('the change undone in the kernel', async () => programmedIpv4Elements() === 5);
  });

  it('API server gone longer than 2 x sync-period: not ready, still alive, rules kept and resynced', async () => {
    const before = await scrapeMetrics(METRICS);
    api.setUnavailable(true);
    const readyz = await eventually('/readyz 503', async () => {
      const r = await health('/readyz');
      return r.status === 503 && r;
    });
    expect(readyz.detail).to.match(
      /^the API server has been unreachable for \S+ \((services|nodes): .*\); the last programmed rules are kept$/,
    );
    expect((await health('/healthz')).status).to.equal(200);
    expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80)).to.equal('svc-a');
    const during = await eventually('a resync from the cache', async () => {
      const e = await scrapeMetrics(METRICS);
      return syncCount(e) > syncCount(before) && e;
    });
    expect(during.sum(`${P}informer_errors_total`)).to.be.above(before.sum(`${P}informer_errors_total`));
    expect(during.value(`${P}programmed_entries`, { backend: 'nft', family: 'ipv4' })).to.equal(5);

    api.setUnavailable(false);
    await eventually('/readyz 200 again', async () => (await health('/readyz')).status === 200);
    const back = await scrapeMetrics(METRICS);
    expect(back.sum(`${P}informer_watches_total`)).to.be.above(before.sum(`${P}informer_watches_total`));
  });

  it('kernel refusing our changes longer than 2 x sync-period: not ready, still alive (the loop works), and recovers', async () => {
    const before = await scrapeMetrics(METRICS);
    // Another process takes a table of our name with the owner flag: the kernel refuses every
    // change to it from anyone else (EPERM) until that process closes its netlink socket.
    tableHolder = spawn('nft', ['-i'], { stdio: ['pipe', 'ignore', 'ignore'] });
    tableHolder.stdin!.write(`delete table ip ${TABLE_NAME}; add table ip ${TABLE_NAME} { flags owner; }\n`);
    const readyz = await eventually('/readyz 503 for the refused syncs', async () => {
      const r = await health('/readyz');
      return r.status === 503 && r.detail.startsWith('no successful sync') && r;
    });
    expect(readyz.detail).to.match(
      /^no successful sync for \S+ \(limit: 2 x --sync-period = 2\.0s\): .*Operation not permitted/,
    );
    // Liveness is the loop's: syncs end (refused), so a restart would not help.
    const healthz = await health('/healthz');
    expect(healthz.status, healthz.detail).to.equal(200);
    expect(healthz.detail).to.match(/^last sync ended \S+ ago$/);
    const failing = await scrapeMetrics(METRICS);
    expect(failing.value(`${P}sync_errors_total`, { backend: 'nft' })!).to.be.above(
      before.value(`${P}sync_errors_total`, { backend: 'nft' }) ?? 0,
    );
    expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80), 'no translation while the table is taken').to.equal(
      LB_PATH,
    );

    tableHolder.stdin!.end();
    await once(tableHolder, 'exit');
    await eventually('/readyz 200 again', async () => (await health('/readyz')).status === 200);
    expect((await health('/healthz')).detail).to.match(/^last successful sync \S+ ago$/);
    expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80)).to.equal('svc-a');
    expect(programmedIpv4Elements()).to.equal(5);
  });

  it('SIGTERM: exits 0 and leaves the rules in place', async () => {
    controller!.kill('SIGTERM');
    const [code] = (await once(controller!, 'exit')) as [number | null];
    expect(code).to.equal(0);
    expect(programmedIpv4Elements()).to.equal(5);
    expect((await rejectionOf(httpGet(`${METRICS}/metrics`))).message).to.match(/ECONNREFUSED/);
  });
});
