// The metrics registry as the controller feeds it, its HTTP endpoint, and promtool's verdict.

import { expect } from 'chai';
import { ControllerMetrics, METRIC_PREFIX } from '../../src/metrics/controller-metrics.js';
import { startMetricsEndpoint } from '../../src/metrics/metrics-server.js';
import { allControllerObservers, allInformerObservers } from '../../src/operations/observer-fan-out.js';
import { HttpEndpoint } from '../../src/http/endpoint.js';
import { Operations } from '../../src/operations/operations.js';
import { parseConfig } from '../../src/config/options.js';
import { BACKENDS } from '../../src/backends/registry.js';
import { pino } from 'pino';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { SKIP_REASONS, type ServiceInfo } from '../../src/model/types.js';
import type { KubeProxyStatus, SyncReport } from '../../src/controller/controller.js';
import { Exposition, httpGet, promtoolCheckMetrics } from '../support/scrape.js';
import { rejectionOf } from '../support/assertions.js';
import { CONFIG, lbService } from '../support/fixtures.js';

const SERVICES: ServiceInfo[] = [
  {
    namespace: 'default',
    name: 'web',
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIPs: ['10.96.0.10', 'fd00::10'],
    ports: [{ port: 80, protocol: 'TCP' }],
    ingress: [
      { ip: '192.0.2.10' },
      { ip: '2001:db8::10' },
      { ip: '192.0.2.20', ipMode: 'Proxy' },
      { hostname: 'lb.example' },
    ],
  },
  // Loses 192.0.2.10 TCP/80 to the older web.
  lbService(11, { name: 'late', creationTimestamp: '2024-02-01T00:00:00Z', ingress: [{ ip: '192.0.2.10' }] }),
];

async function exposition(metrics: ControllerMetrics): Promise<Exposition> {
  return new Exposition((await metrics.exposition()).text);
}

function report(extra: Partial<SyncReport>): SyncReport {
  return { backend: 'nft', requested: 'full', durationMs: 12, ...extra };
}

describe('controller metrics', () => {
  it('name every metric of ours under the prefix with HELP text, and include process metrics', async () => {
    const metrics = new ControllerMetrics();
    metrics.describeBackend({ backend: 'nft', nftExecutor: 'addon', nftKeyLookup: 'set' });
    const e = await exposition(metrics);
    const ours = e.families().filter((n) => n.startsWith(METRIC_PREFIX));
    expect(ours.length, `only ${ours.length} metrics of ours`).to.be.at.least(14);
    for (const name of ours) expect((e.help.get(name) ?? '').length, `${name} has no useful HELP`).to.be.above(20);
    expect(e.families()).to.include('process_resident_memory_bytes');
    expect(e.families()).to.include('nodejs_eventloop_lag_seconds');
    expect(
      e.value(`${METRIC_PREFIX}backend_info`, {
        backend: 'nft',
        nft_executor: 'addon',
        nft_key_lookup: 'set',
        iptables_variant: 'none',
      }),
    ).to.equal(1);
    // The kernel, as uname -sr prints it, beside the build.
    const [buildInfo] = [...e.samples].filter(([k]) => k.startsWith(`${METRIC_PREFIX}build_info{`));
    expect(buildInfo?.[0]).to.match(/kernel="Linux \d+\.\d+[^"]*",kernel_version="[^"]+"/);
  });

  it('count current skips and conflicts from the desired state, every reason present', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const desired = buildDesiredState(SERVICES, { name: 'n', podCIDRs: ['10.244.0.0/24'] }, CONFIG);
    metrics.onDesiredState(desired);
    metrics.onNewSkips(desired.skips);
    metrics.onNewConflicts(desired.conflicts);
    const e = await exposition(metrics);
    const skipped = (reason: string) => e.value(`${METRIC_PREFIX}skipped_addresses`, { reason });
    expect(skipped('ipModeProxy')).to.equal(1);
    expect(skipped('hostnameOnly')).to.equal(1);
    for (const r of SKIP_REASONS.filter((r) => r !== 'ipModeProxy' && r !== 'hostnameOnly'))
      expect(skipped(r), r).to.equal(0);
    expect(e.value(`${METRIC_PREFIX}skip_events_total`, { reason: 'ipModeProxy' })).to.equal(1);
    expect(e.value(`${METRIC_PREFIX}conflicts`, { family: 'ipv4' })).to.equal(1);
    expect(e.value(`${METRIC_PREFIX}conflicts`, { family: 'ipv6' })).to.equal(0);
    expect(e.value(`${METRIC_PREFIX}conflict_events_total`)).to.equal(1);
    // The Node has no IPv6 podCIDR while there is an IPv6 entry: pods are not matched for IPv6.
    expect(e.value(`${METRIC_PREFIX}local_pod_detection_missing`, { family: 'ipv6' })).to.equal(1);
    expect(e.value(`${METRIC_PREFIX}local_pod_detection_missing`, { family: 'ipv4' })).to.equal(0);

    // The next desired state without the Proxy address: the gauge follows, the counter stays.
    const fixed = buildDesiredState(SERVICES.slice(1), { name: 'n', podCIDRs: ['10.244.0.0/24'] }, CONFIG);
    metrics.onDesiredState(fixed);
    const after = await exposition(metrics);
    expect(after.value(`${METRIC_PREFIX}skipped_addresses`, { reason: 'ipModeProxy' })).to.equal(0);
    expect(after.value(`${METRIC_PREFIX}skip_events_total`, { reason: 'ipModeProxy' })).to.equal(1);
    expect(after.value(`${METRIC_PREFIX}conflicts`, { family: 'ipv4' })).to.equal(0);
  });

  it('observe syncs by backend and performed mode, entries, latency, errors and the last success', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    metrics.describeBackend({ backend: 'nft', nftExecutor: 'cli' });
    const before = Date.now() / 1000;
    metrics.onSync(report({ result: { mode: 'full', entries: { ipv4: 3, ipv6: 1 } } }));
    // A partial request that the backend had to turn into a full sync counts as full.
    metrics.onSync(
      report({ requested: 'partial', changeLatencyMs: 40, result: { mode: 'full', entries: { ipv4: 4, ipv6: 1 } } }),
    );
    metrics.onSync(
      report({ requested: 'partial', changeLatencyMs: 5, result: { mode: 'partial', entries: { ipv4: 5, ipv6: 1 } } }),
    );
    metrics.onSync(report({ requested: 'partial', result: { mode: 'noop', entries: { ipv4: 5, ipv6: 1 } } }));
    let e = await exposition(metrics);
    const count = (mode: string) => e.value(`${METRIC_PREFIX}sync_duration_seconds_count`, { backend: 'nft', mode });
    expect(count('full')).to.equal(2);
    expect(count('partial')).to.equal(1);
    expect(count('noop')).to.equal(1);
    expect(e.value(`${METRIC_PREFIX}sync_duration_seconds_sum`, { backend: 'nft', mode: 'full' })).to.equal(0.024);
    expect(e.value(`${METRIC_PREFIX}network_programming_duration_seconds_count`, { backend: 'nft' })).to.equal(2);
    expect(e.value(`${METRIC_PREFIX}network_programming_duration_seconds_sum`, { backend: 'nft' })).to.equal(0.045);
    expect(
      e.value(`${METRIC_PREFIX}network_programming_duration_seconds_bucket`, { backend: 'nft', le: '0.005' }),
    ).to.equal(1);
    expect(e.value(`${METRIC_PREFIX}programmed_entries`, { backend: 'nft', family: 'ipv4' })).to.equal(5);
    expect(e.value(`${METRIC_PREFIX}programmed_entries`, { backend: 'nft', family: 'ipv6' })).to.equal(1);
    expect(e.value(`${METRIC_PREFIX}sync_errors_total`, { backend: 'nft' })).to.equal(0);
    const last = e.value(`${METRIC_PREFIX}last_successful_sync_timestamp_seconds`)!;
    expect(last).to.be.at.least(before);
    expect(last).to.be.at.most(Date.now() / 1000);

    // A failure counts, is timed under the requested mode, and leaves entries and timestamp alone.
    metrics.onSync(report({ requested: 'full', error: new Error('nft: no'), changeLatencyMs: 9 }));
    e = await exposition(metrics);
    expect(e.value(`${METRIC_PREFIX}sync_errors_total`, { backend: 'nft' })).to.equal(1);
    expect(count('full')).to.equal(3);
    expect(e.value(`${METRIC_PREFIX}network_programming_duration_seconds_count`, { backend: 'nft' })).to.equal(2);
    expect(e.value(`${METRIC_PREFIX}programmed_entries`, { backend: 'nft', family: 'ipv4' })).to.equal(5);
    expect(e.value(`${METRIC_PREFIX}last_successful_sync_timestamp_seconds`)).to.equal(last);
  });

  it('count informer lists, watches and errors per resource through a fan-out observer', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const seen: string[] = [];
    const observer = allInformerObservers({ onError: (r) => seen.push(r) }, metrics, undefined);
    observer.onList!('services');
    observer.onWatch!('services');
    observer.onWatch!('services');
    observer.onError!('nodes', new Error('gone'), 500);
    const e = await exposition(metrics);
    expect(e.value(`${METRIC_PREFIX}informer_lists_total`, { resource: 'services' })).to.equal(1);
    expect(e.value(`${METRIC_PREFIX}informer_watches_total`, { resource: 'services' })).to.equal(2);
    expect(e.value(`${METRIC_PREFIX}informer_errors_total`, { resource: 'nodes' })).to.equal(1);
    expect(seen).to.deep.equal(['nodes']);

    const calls: string[] = [];
    const both = allControllerObservers(metrics, {
      onSync: () => calls.push('sync'),
      onNewSkips: () => calls.push('skips'),
    });
    both.onSync!(report({ result: { mode: 'full', entries: { ipv4: 0, ipv6: 0 } } }));
    both.onNewSkips!([]);
    expect(calls).to.deep.equal(['sync', 'skips']);
  });

  it("say kube-proxy's mode and version, one series, and its known bug while it applies", async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const info = (e: Exposition) =>
      [...e.samples].filter(([k]) => k.startsWith(`${METRIC_PREFIX}kube_proxy_info{`)).map(([k, v]) => `${k} ${v}`);
    const issue = (e: Exposition) => e.value(`${METRIC_PREFIX}kube_proxy_known_issue`, { issue: 'kubernetes#131765' });
    let e = await exposition(metrics);
    expect(info(e)).to.deep.equal([`${METRIC_PREFIX}kube_proxy_info{mode="unknown",version="unknown"} 1`]);
    expect(issue(e), 'present from the start').to.equal(0);

    const status = (mode: 'ipvs' | 'nftables', version?: string): KubeProxyStatus => ({
      mode: { mode, source: 'proxyMode', detail: '', version },
      steppedAside: mode === 'nftables',
      settings: [],
    });
    metrics.onKubeProxy(status('ipvs', 'v1.33.2'));
    e = await exposition(metrics);
    expect(info(e)).to.deep.equal([`${METRIC_PREFIX}kube_proxy_info{mode="ipvs",version="v1.33.2"} 1`]);
    expect(issue(e), 'IPVS mode').to.equal(0);
    metrics.onKubeProxy(status('nftables', 'v1.33.2'));
    e = await exposition(metrics);
    expect(info(e)).to.deep.equal([`${METRIC_PREFIX}kube_proxy_info{mode="nftables",version="v1.33.2"} 1`]);
    expect(issue(e)).to.equal(1);
    metrics.onKubeProxy(status('nftables', 'v1.34.0'));
    expect(issue(await exposition(metrics)), 'fixed').to.equal(0);
    metrics.onKubeProxy(status('nftables'));
    e = await exposition(metrics);
    expect(info(e)).to.deep.equal([`${METRIC_PREFIX}kube_proxy_info{mode="nftables",version="unknown"} 1`]);
    expect(issue(e), 'version unknown').to.equal(0);
  });

  it('pass promtool check metrics, process metrics included', async function () {
    const metrics = new ControllerMetrics();
    metrics.describeBackend({ backend: 'nft', nftExecutor: 'addon' });
    const desired = buildDesiredState(SERVICES, { name: 'n', podCIDRs: ['10.244.0.0/24'] }, CONFIG);
    metrics.onDesiredState(desired);
    metrics.onSync(report({ changeLatencyMs: 3, result: { mode: 'full', entries: { ipv4: 1, ipv6: 1 } } }));
    metrics.onList('services');
    const { text } = await metrics.exposition();
    const verdict = await promtoolCheckMetrics(text);
    expect(verdict.code, verdict.output).to.equal(0);
    expect(verdict.output.trim(), `promtool has remarks:\n${verdict.output}`).to.equal('');
  });
});

describe('backend info from the backends the registry builds', () => {
  it('names the nft executor, its key lookup once probed, and the iptables variant', async () => {
    const config = parseConfig(['--metrics-bind-address=', '--healthz-bind-address='], { NODE_NAME: 'n' });
    const ops = await Operations.start(config, pino({ enabled: false }));
    try {
      const info = async () => {
        const e = new Exposition((await ops.metrics.exposition()).text);
        return [...e.samples].filter(([k]) => k.startsWith(`${METRIC_PREFIX}backend_info{`));
      };
      ops.describeBackend((await BACKENDS.nft.create({ nftExecutor: 'cli' })).description);
      expect(await info()).to.deep.equal([
        [
          `${METRIC_PREFIX}backend_info{backend="nft",iptables_variant="none",nft_executor="cli",nft_key_lookup="none"}`,
          1,
        ],
      ]);
      ops.describeBackend({ backend: 'nft', nftExecutor: 'addon', nftKeyLookup: 'set' });
      expect(await info()).to.deep.equal([
        [
          `${METRIC_PREFIX}backend_info{backend="nft",iptables_variant="none",nft_executor="addon",nft_key_lookup="set"}`,
          1,
        ],
      ]);
      ops.describeBackend((await BACKENDS.iptables.create({ iptablesVariant: 'legacy' })).description);
      expect(await info()).to.deep.equal([
        [
          `${METRIC_PREFIX}backend_info{backend="iptables",iptables_variant="legacy",nft_executor="none",nft_key_lookup="none"}`,
          1,
        ],
      ]);
    } finally {
      await ops.close();
    }
  });
});

describe('metrics endpoint', () => {
  let endpoint: HttpEndpoint | undefined;
  afterEach(async () => {
    await endpoint?.close();
    endpoint = undefined;
  });

  it('serves the exposition on GET /metrics, 404 elsewhere, 405 for other methods', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    metrics.onList('nodes');
    endpoint = await startMetricsEndpoint({ host: '127.0.0.1', port: 0 }, metrics);
    const base = `http://127.0.0.1:${endpoint.address.port}`;
    const ok = await httpGet(`${base}/metrics`);
    expect(ok.status).to.equal(200);
    expect(ok.contentType).to.match(/^text\/plain; version=0\.0\.4/);
    expect(new Exposition(ok.body).value(`${METRIC_PREFIX}informer_lists_total`, { resource: 'nodes' })).to.equal(1);
    expect((await httpGet(`${base}/metrics?x=1`)).status).to.equal(200);
    expect((await httpGet(`${base}/`)).status).to.equal(404);
    expect((await httpGet(`${base}/metrics`, 'POST')).status).to.equal(405);
    const head = await httpGet(`${base}/metrics`, 'HEAD');
    expect(head.status).to.equal(200);
    expect(head.body).to.equal('');
  });

  it('fails to start with one line naming the flag when the port is taken', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    endpoint = await startMetricsEndpoint({ host: '127.0.0.1', port: 0 }, metrics);
    const taken = { host: '127.0.0.1', port: endpoint.address.port };
    expect((await rejectionOf(HttpEndpoint.start(taken, '--metrics-bind-address', {}))).message).to.equal(
      `cannot listen on --metrics-bind-address 127.0.0.1:${taken.port}: the port is in use by another process; ` +
        'choose another with --metrics-bind-address',
    );
  });
});

describe('docs/operations.md', () => {
  it('documents every metric of ours, every skip reason and the operational flags', async () => {
    const { readFile } = await import('node:fs/promises');
    const { fileURLToPath } = await import('node:url');
    const docs = await readFile(fileURLToPath(new URL('../../../docs/operations.md', import.meta.url)), 'utf8');
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const names = new Exposition((await metrics.exposition()).text).families();
    expect(names.length).to.be.at.least(14);
    for (const name of names) expect(docs, `${name} is not in the metrics reference`).to.include(`| \`${name}\` |`);
    for (const reason of SKIP_REASONS)
      expect(docs, `${reason} is not in the troubleshooting table`).to.include(`| \`${reason}\` |`);
    for (const flag of ['--metrics-bind-address', '--healthz-bind-address', '--emit-events'])
      expect(docs, flag).to.include(`| \`${flag}\` |`);
  });
});
