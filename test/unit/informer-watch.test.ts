// The informer's list+watch loop against the API stand-in (real HTTPS, real client library):
// hostile watch lines (not JSON, oversized), 410 Gone, resets, silent and bounded watches, quiet
// updates, jittered backoff, and a retry that keeps the process alive; and against a raw HTTPS
// server for what the stand-in never answers to a watch (HTTP 410, 401, 403, 500).

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { KubeConfig } from '@kubernetes/client-node';
import { expect } from 'chai';
import { listPageJson } from '../../src/kube/cluster.js';
import { Informer, backoffDelay, type InformerOptions } from '../../src/kube/informer.js';
import { sameInfo } from '../../src/kube/store.js';
import { watchTimeoutSeconds } from '../../src/kube/watch-session.js';
import { toNodeInfo, toServiceInfo } from '../../src/kube/objects.js';
import type { NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { MALFORMED_WATCH_LINES } from '../support/fixtures.js';
import { makeTlsFixture, RawApiServer, type TlsFixture } from '../support/raw-api.js';
import { waitFor as waitUntil } from '../support/eventually.js';

function service(name: string, ip: string, extra: { labels?: Record<string, string> } = {}) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: 'default', name, labels: extra.labels ?? {} },
    spec: { type: 'LoadBalancer', clusterIP: '10.96.0.10', ports: [{ protocol: 'TCP', port: 80 }] },
    status: { loadBalancer: { ingress: [{ ip }] } },
  };
}

function node(podCIDR: string, labels: Record<string, string> = {}) {
  return {
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name: 'node-1', labels },
    spec: { podCIDR, podCIDRs: [podCIDR] },
    status: { conditions: [{ type: 'Ready', status: 'True', lastHeartbeatTime: new Date().toISOString() }] },
  };
}

const waitFor = (cond: () => boolean, what: string, ms = 20_000) => waitUntil(cond, what, ms);

interface Recorded {
  decodeErrors: Array<{ problem: string; first: boolean }>;
  errors: Array<{ message: string; retryInMs: number }>;
  changes: number;
}

describe('informer list+watch loop', function () {
  this.timeout(60_000);
  let server: ApiStandIn;
  let kc: KubeConfig;
  const informers: Array<Informer<unknown>> = [];

  beforeEach(async () => {
    server = await ApiStandIn.start({ bookmarkIntervalMs: 200 });
    kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
  });
  afterEach(async () => {
    for (const i of informers.splice(0)) await i.stop();
    await server.stop();
  });

  function serviceInformer(rec: Recorded, extra: Partial<InformerOptions<ServiceInfo>> = {}): Informer<ServiceInfo> {
    const informer = new Informer<ServiceInfo>(kc, {
      resource: 'services',
      path: '/api/v1/services',
      listPage: (token) => listPageJson(kc, '/api/v1/services', { limit: '2', continue: token }),
      strip: toServiceInfo,
      onChange: () => rec.changes++,
      observer: {
        onDecodeError: (_r, problem, first) => rec.decodeErrors.push({ problem, first }),
        onError: (_r, err, retryInMs) => rec.errors.push({ message: err.message, retryInMs }),
      },
      ...extra,
    });
    informers.push(informer as Informer<unknown>);
    return informer;
  }

  /** A started informer, synced, with its watch open on the stand-in. */
  async function watchingInformer(
    rec: Recorded,
    extra: Partial<InformerOptions<ServiceInfo>> = {},
  ): Promise<Informer<ServiceInfo>> {
    const informer = serviceInformer(rec, extra);
    informer.start();
    await informer.waitForSync();
    await waitFor(() => server.openWatchCount('Service') === 1, 'an open watch');
    return informer;
  }

  const fresh = (): Recorded => ({ decodeErrors: [], errors: [], changes: 0 });
  /** Service a on 198.18.0.1, and a watching informer (watchingInformer) recording into a fresh record. */
  async function watchingServiceA(extra: Partial<InformerOptions<ServiceInfo>> = {}) {
    server.apply(service('a', '198.18.0.1'));
    const rec = fresh();
    return { rec, informer: await watchingInformer(rec, extra) };
  }
  const ipOf = (informer: Informer<ServiceInfo>, name: string) =>
    informer.list().find((s) => s.name === name)?.ingress?.[0]?.ip;

  it('skips and counts each line that is not a watch event, and loses nothing around it', async () => {
    for (let i = 0; i < 5; i++) server.apply(service(`svc-${i}`, `198.18.0.${i}`));
    const rec = fresh();
    const informer = serviceInformer(rec);
    informer.start();
    await informer.waitForSync();
    expect(informer.list()).to.have.length(5);
    for (const [n, line] of MALFORMED_WATCH_LINES.entries()) {
      await waitFor(() => server.openWatchCount('Service') === 1, 'an open watch');
      const watches = server.stats.watches.services ?? 0;
      expect(server.injectWatchLine('Service', line)).to.equal(1);
      await waitFor(() => rec.decodeErrors.length === n + 1, `line ${line} to be counted`);
      if (line.includes('ERROR')) await waitFor(() => (server.stats.watches.services ?? 0) > watches, 'a new watch');
      // A change after the bad line still arrives.
      server.apply(service('svc-0', `198.18.1.${n}`));
      await waitFor(() => ipOf(informer, 'svc-0') === `198.18.1.${n}`, `the change after ${line}`);
    }
    // Logged once per stream: the first eight came on one stream, which the first ERROR without
    // a status ended; the ninth came on its replacement.
    expect(rec.decodeErrors.map((d) => d.first)).to.deep.equal([
      true,
      false,
      false,
      false,
      false,
      false,
      false,
      false,
      true,
    ]);
    // The two ERROR events without a status made the informer replace the stream.
    expect(rec.errors.filter((e) => /ERROR event without a status/.test(e.message))).to.have.length(2);
    expect(informer.list()).to.have.length(5);
  });

  it('counts lines that are not JSON as decode errors, and loses nothing around them', async () => {
    const { rec, informer } = await watchingServiceA();
    const watches = server.stats.watches.services ?? 0;
    for (const line of ['this is not JSON', '{"type":"MODIFIED","object":', '\u00ff\u00fe']) {
      expect(server.injectWatchLine('Service', line)).to.equal(1);
    }
    await waitFor(() => rec.decodeErrors.length === 3, 'three decode errors');
    expect(rec.decodeErrors.map((d) => d.problem)).to.deep.equal([
      'not JSON: "this is not JSON"',
      'not JSON: "{\\"type\\":\\"MODIFIED\\",\\"object\\":"',
      'not JSON: "\u00ff\u00fe"',
    ]);
    expect(rec.decodeErrors.map((d) => d.first)).to.deep.equal([true, false, false]);
    server.apply(service('a', '198.18.0.2'));
    await waitFor(() => ipOf(informer, 'a') === '198.18.0.2', 'the change after them');
    expect(server.stats.watches.services ?? 0, 'the same stream').to.equal(watches);
    expect(rec.errors).to.deep.equal([]);
  });

  it('replaces a stream whose line grows past 16 MiB, and resumes where it was without a relist', async () => {
    const { rec, informer } = await watchingServiceA({ backoff: { initialMs: 10, maxMs: 50 } });
    const lists = server.stats.lists.services ?? 0;
    const watches = server.stats.watches.services ?? 0;
    expect(server.injectWatchLine('Service', '"' + 'x'.repeat(16 << 20) + '"')).to.equal(1);
    await waitFor(() => (server.stats.watches.services ?? 0) > watches, 'a new watch');
    expect(rec.errors.map((e) => e.message)).to.deep.equal([
      'watching /api/v1/services: a watch line longer than 16 MiB: the stream is broken',
    ]);
    server.apply(service('a', '198.18.0.2'));
    await waitFor(() => ipOf(informer, 'a') === '198.18.0.2', 'a change on the new watch');
    expect(server.stats.lists.services ?? 0).to.equal(lists);
    expect(rec.decodeErrors).to.deep.equal([]);
  });

  it('resumes from its resourceVersion after the connection is reset, without a relist', async () => {
    const { rec, informer } = await watchingServiceA({ backoff: { initialMs: 10, maxMs: 50 } });
    const lists = server.stats.lists.services ?? 0;
    server.setUnavailable(true);
    server.apply(service('a', '198.18.0.2'));
    await waitFor(() => rec.errors.length > 0, 'the reset to be seen');
    server.setUnavailable(false);
    await waitFor(() => ipOf(informer, 'a') === '198.18.0.2', 'the change made during the outage');
    expect(server.stats.lists.services ?? 0).to.equal(lists);
  });

  it('reports the first bad line of a stream as first, the others only for counting', async () => {
    const rec = fresh();
    await watchingInformer(rec);
    for (const line of ['42', '{}', '[1, 2]']) server.injectWatchLine('Service', line);
    await waitFor(() => rec.decodeErrors.length === 3, 'three decode errors');
    expect(rec.decodeErrors.map((d) => d.first)).to.deep.equal([true, false, false]);
    expect(rec.errors).to.deep.equal([]);
  });

  it('replaces a stream that sends nothing but garbage', async () => {
    const rec = fresh();
    const informer = await watchingInformer(rec, { backoff: { initialMs: 10, maxMs: 50 } });
    const watches = server.stats.watches.services ?? 0;
    for (let i = 0; i < 150; i++) server.injectWatchLine('Service', String(i));
    await waitFor(() => (server.stats.watches.services ?? 0) > watches, 'a new watch');
    expect(rec.errors.some((e) => /stream is unusable/.test(e.message))).to.equal(true);
    server.apply(service('after', '198.18.2.1'));
    await waitFor(() => ipOf(informer, 'after') === '198.18.2.1', 'a change on the new watch');
  });

  it('relists on 410 Gone and records only what differs', async () => {
    for (let i = 0; i < 20; i++) server.apply(service(`svc-${i}`, `198.18.0.${i}`));
    const rec = fresh();
    const informer = serviceInformer(rec);
    informer.start();
    await informer.waitForSync();
    const lists = server.stats.lists.services ?? 0;
    const mark = informer.changes.cursor;
    const before = informer.list();
    server.setUnavailable(true);
    server.apply(service('svc-3', '198.18.9.9'));
    server.remove('Service', 'default', 'svc-4');
    server.expireHistory();
    server.setUnavailable(false);
    await waitFor(() => ipOf(informer, 'svc-3') === '198.18.9.9' && informer.list().length === 19, 'the relist');
    expect(server.stats.lists.services ?? 0).to.be.greaterThan(lists);
    const changes = informer.changes.changesSince(mark);
    expect(changes?.removed.map((s) => `${s.name} ${s.ingress?.[0]?.ip}`).sort()).to.deep.equal([
      'svc-3 198.18.0.3',
      'svc-4 198.18.0.4',
    ]);
    expect(changes?.added.map((s) => `${s.name} ${s.ingress?.[0]?.ip}`)).to.deep.equal(['svc-3 198.18.9.9']);
    // Unchanged objects keep their identity through the relist.
    const kept = new Set(informer.list());
    expect(before.filter((s) => kept.has(s))).to.have.length(18);
  });

  it('relists on an ERROR event with code 410 inside a stream', async () => {
    const { rec, informer } = await watchingServiceA();
    const lists = server.stats.lists.services ?? 0;
    server.injectWatchLine(
      'Service',
      JSON.stringify({
        type: 'ERROR',
        object: { kind: 'Status', apiVersion: 'v1', status: 'Failure', code: 410, reason: 'Expired', message: 'gone' },
      }),
    );
    await waitFor(() => (server.stats.lists.services ?? 0) > lists, 'a relist');
    expect(rec.decodeErrors).to.deep.equal([]);
    server.apply(service('a', '198.18.0.2'));
    await waitFor(() => ipOf(informer, 'a') === '198.18.0.2', 'a change after the relist');
  });

  it('takes a watch that delivers nothing for too long for dead and resumes from where it was', async () => {
    // Bookmarks every 200 ms keep a live watch busy; the deadline is far above that.
    const { rec, informer } = await watchingServiceA({
      watchIdleTimeoutMs: 1500,
      backoff: { initialMs: 10, maxMs: 50 },
    });
    const lists = server.stats.lists.services ?? 0;
    expect(server.silenceOpenWatches('Service')).to.equal(1);
    server.apply(service('a', '198.18.0.2'));
    server.apply(service('b', '198.18.0.3'));
    await waitFor(() => ipOf(informer, 'a') === '198.18.0.2' && ipOf(informer, 'b') === '198.18.0.3', 'the changes');
    expect(rec.errors.some((e) => /delivered nothing/.test(e.message))).to.equal(true);
    // Resumed from the last resourceVersion: no relist was needed.
    expect(server.stats.lists.services ?? 0).to.equal(lists);
  });

  it('asks for bounded watches and re-watches when the server ends them, with no error', async () => {
    const rec = fresh();
    const informer = serviceInformer(rec, { minWatchTimeoutMs: 1000 });
    informer.start();
    await informer.waitForSync();
    await waitFor(() => (server.stats.watches.services ?? 0) >= 3, 'the server to end two watches', 15_000);
    expect(rec.errors).to.deep.equal([]);
    server.apply(service('a', '198.18.0.7'));
    await waitFor(() => ipOf(informer, 'a') === '198.18.0.7', 'a change on a later watch');
  });

  it('ignores updates that change nothing it keeps: no change recorded, no onChange', async () => {
    server.apply(node('10.244.1.0/24'));
    server.apply(service('a', '198.18.0.1'));
    let nodeChanges = 0;
    const nodes = new Informer<NodeInfo>(kc, {
      resource: 'nodes',
      path: '/api/v1/nodes',
      fieldSelector: 'metadata.name=node-1',
      listPage: (token) =>
        listPageJson(kc, '/api/v1/nodes', { fieldSelector: 'metadata.name=node-1', continue: token }),
      strip: toNodeInfo,
      onChange: () => nodeChanges++,
    });
    informers.push(nodes as Informer<unknown>);
    const rec = fresh();
    const services = serviceInformer(rec);
    nodes.start();
    services.start();
    await Promise.all([nodes.waitForSync(), services.waitForSync()]);
    const nodeMark = nodes.changes.cursor;
    const serviceMark = services.changes.cursor;
    const changesBefore = { nodes: nodeChanges, services: rec.changes };

    // Heartbeats and labels: not what we keep.
    for (let i = 0; i < 5; i++) server.apply(node('10.244.1.0/24', { beat: String(i) }));
    server.apply(service('a', '198.18.0.1', { labels: { touched: 'yes' } }));
    // Then real changes, which arrive after the quiet ones on the same streams.
    server.apply(node('10.244.2.0/24', { beat: 'last' }));
    server.apply(service('a', '198.18.0.2', { labels: { touched: 'yes' } }));
    await waitFor(() => nodes.list()[0]?.podCIDRs?.[0] === '10.244.2.0/24', 'the pod CIDR change');
    await waitFor(() => ipOf(services, 'a') === '198.18.0.2', 'the ingress change');

    expect(nodeChanges - changesBefore.nodes).to.equal(1);
    expect(rec.changes - changesBefore.services).to.equal(1);
    const nodeDiff = nodes.changes.changesSince(nodeMark);
    expect(nodeDiff?.removed.map((n) => n.podCIDRs)).to.deep.equal([['10.244.1.0/24']]);
    expect(nodeDiff?.added.map((n) => n.podCIDRs)).to.deep.equal([['10.244.2.0/24']]);
    const serviceDiff = services.changes.changesSince(serviceMark);
    expect(serviceDiff?.removed).to.have.length(1);
    expect(serviceDiff?.added).to.have.length(1);
  });

  it('retries an unreachable API server with jittered, growing delays', async () => {
    server.setUnavailable(true);
    const rec = fresh();
    const backoff = { initialMs: 20, maxMs: 160 };
    const informer = serviceInformer(rec, { backoff });
    informer.start();
    await waitFor(() => rec.errors.length >= 8, 'eight retries');
    await informer.stop();
    const delays = rec.errors.slice(0, 8).map((e) => e.retryInMs);
    for (const [i, delay] of delays.entries()) {
      const d = Math.min(backoff.maxMs, backoff.initialMs * 2 ** i);
      expect(delay, `retry ${i + 1}`)
        .to.be.at.least(d / 2)
        .and.below(d);
    }
    server.setUnavailable(false);
    expect(informer.hasSynced()).to.equal(false);
  });
});

describe('informer against watch answers the API stand-in never gives', function () {
  this.timeout(60_000);
  let tls: TlsFixture;
  let raw: RawApiServer;
  let informer: Informer<ServiceInfo> | undefined;
  const fresh = (): Recorded => ({ decodeErrors: [], errors: [], changes: 0 });

  before(async () => {
    tls = await makeTlsFixture();
  });
  beforeEach(async () => {
    raw = await RawApiServer.start(tls);
  });
  afterEach(async () => {
    await informer?.stop();
    informer = undefined;
    await raw.stop();
  });

  /** Lists answer with the Services `items()` returns; each watch is answered by `watch(n)`. */
  function serve(
    items: () => unknown[],
    watch: (n: number, res: import('node:http').ServerResponse, url: URL) => void,
  ): { lists: () => number; watches: () => number } {
    let lists = 0;
    let watches = 0;
    raw.handler = (_req, res, url) => {
      if (url.searchParams.get('watch') === 'true') {
        watch(++watches, res, url);
        return;
      }
      lists++;
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.end(JSON.stringify({ kind: 'ServiceList', metadata: { resourceVersion: '10' }, items: items() }));
    };
    return { lists: () => lists, watches: () => watches };
  }

  function start(rec: Recorded): Informer<ServiceInfo> {
    const kc = new KubeConfig();
    kc.loadFromOptions(raw.kubeconfigOptions({ token: 'raw-token' }));
    informer = new Informer<ServiceInfo>(kc, {
      resource: 'services',
      path: '/api/v1/services',
      listPage: (token) => listPageJson(kc, '/api/v1/services', { continue: token }),
      strip: toServiceInfo,
      onChange: () => rec.changes++,
      backoff: { initialMs: 20, maxMs: 80 },
      observer: {
        onDecodeError: (_r, problem, first) => rec.decodeErrors.push({ problem, first }),
        onError: (_r, err, retryInMs) => rec.errors.push({ message: err.message, retryInMs }),
      },
    });
    informer.start();
    return informer;
  }

  const status = (code: number, reason: string, message: string) =>
    JSON.stringify({ kind: 'Status', apiVersion: 'v1', status: 'Failure', code, reason, message });
  const open = (res: import('node:http').ServerResponse) => {
    res.writeHead(200, { 'Content-Type': 'application/json' });
    res.flushHeaders();
  };

  it('relists at once when a watch is answered with HTTP 410 Gone', async () => {
    let ip = '198.18.0.1';
    const from: string[] = [];
    const counts = serve(
      () => [service('a', ip)],
      (n, res, url) => {
        from.push(url.searchParams.get('resourceVersion') ?? '');
        // The first watch delivers an event and ends; resuming from it is answered 410.
        if (n === 1) {
          const object = service('a', '198.18.0.5');
          const event = {
            type: 'MODIFIED',
            object: { ...object, metadata: { ...object.metadata, resourceVersion: '11' } },
          };
          res.writeHead(200, { 'Content-Type': 'application/json' });
          res.end(JSON.stringify(event) + '\n');
        } else if (n === 2) {
          res.writeHead(410, { 'Content-Type': 'application/json' });
          res.end(status(410, 'Expired', 'too old resource version: 11 (12)'));
        } else open(res);
      },
    );
    const rec = fresh();
    const inf = start(rec);
    await inf.waitForSync();
    ip = '198.18.0.9';
    await waitFor(() => counts.lists() === 2 && counts.watches() >= 3, 'a relist and a new watch');
    await waitFor(() => inf.list()[0]?.ingress?.[0]?.ip === '198.18.0.9', 'the relisted state');
    expect(from.slice(0, 3)).to.deep.equal(['10', '11', '10']);
    expect(rec.errors, 'a relist, not a failure').to.deep.equal([]);
  });

  for (const [code, body, message] of [
    [
      403,
      status(
        403,
        'Forbidden',
        'services is forbidden: User "system:serviceaccount:x:y" cannot watch resource "services"',
      ),
      'watching /api/v1/services: services is forbidden: User "system:serviceaccount:x:y" cannot watch resource "services"',
    ],
    [401, status(401, 'Unauthorized', 'Unauthorized'), 'watching /api/v1/services: Unauthorized'],
    [500, 'upstream connect error', 'watching /api/v1/services: HTTP 500'],
  ] as const) {
    it(`retries a watch answered with HTTP ${code} with growing delays, the server's message in the error`, async () => {
      const counts = serve(
        () => [service('a', '198.18.0.1')],
        (n, res) => {
          if (n <= 3) res.writeHead(code, { 'Content-Type': 'application/json' }).end(body);
          else open(res);
        },
      );
      const rec = fresh();
      const inf = start(rec);
      await waitFor(() => counts.watches() >= 4, 'the fourth watch');
      expect(rec.errors.map((e) => e.message)).to.deep.equal([message, message, message]);
      for (const [i, e] of rec.errors.entries()) {
        const d = Math.min(80, 20 * 2 ** i);
        expect(e.retryInMs, `retry ${i + 1}`)
          .to.be.at.least(d / 2)
          .and.below(d);
      }
      // Resumed from the list's resourceVersion each time: the cache was kept, no relist.
      expect(counts.lists()).to.equal(1);
      expect(inf.list()).to.have.length(1);
      expect(raw.requests.every((r) => r.headers.authorization === 'Bearer raw-token')).to.equal(true);
    });
  }
});

describe('informer helpers', () => {
  it('backoff: exponential with equal jitter, within [d/2, d), capped', () => {
    const b = { initialMs: 500, maxMs: 30_000 };
    expect(backoffDelay(1, b, () => 0)).to.equal(250);
    expect(backoffDelay(1, b, () => 0.999999)).to.equal(499);
    expect(backoffDelay(3, b, () => 0)).to.equal(1000);
    expect(backoffDelay(20, b, () => 0)).to.equal(15_000);
    expect(backoffDelay(20, b, () => 0.999999)).to.equal(29_999);
    const samples = Array.from({ length: 200 }, () => backoffDelay(4, b));
    for (const s of samples) expect(s).to.be.at.least(2000).and.below(4000);
    expect(new Set(samples).size, 'jittered, not in step').to.be.greaterThan(50);
  });

  it('watch timeouts are randomised in [min, 2*min), as client-go', () => {
    expect(watchTimeoutSeconds(300_000, () => 0)).to.equal(300);
    expect(watchTimeoutSeconds(300_000, () => 0.999999)).to.equal(599);
    const samples = Array.from({ length: 200 }, () => watchTimeoutSeconds(300_000));
    for (const s of samples) expect(s).to.be.at.least(300).and.below(600);
    expect(new Set(samples).size).to.be.greaterThan(50);
  });

  it('compares stripped infos by value', () => {
    expect(sameInfo({ a: [1, { b: 'x' }], c: undefined }, { a: [1, { b: 'x' }] })).to.equal(true);
    expect(sameInfo({ a: [1, { b: 'x' }] }, { a: [1, { b: 'y' }] })).to.equal(false);
    expect(sameInfo({ a: [1] }, { a: [1, 2] })).to.equal(false);
    expect(sameInfo({ a: 1 }, { a: 1, b: 2 })).to.equal(false);
    expect(sameInfo([], {})).to.equal(false);
  });

  it('keeps the process alive while it waits to retry an unreachable API server', async function () {
    const informerModule = fileURLToPath(new URL('../../src/kube/informer.js', import.meta.url));
    const clusterModule = fileURLToPath(new URL('../../src/kube/cluster.js', import.meta.url));
    // Nothing but the informer in the process; port 9 on loopback refuses connections.
    const script = `
      import { KubeConfig } from '@kubernetes/client-node';
      const { Informer } = await import(${JSON.stringify(informerModule)});
      const { listPageJson } = await import(${JSON.stringify(clusterModule)});
      const kc = new KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: 'c', server: 'https://127.0.0.1:9', skipTLSVerify: true }],
        users: [{ name: 'u', token: 't' }],
        contexts: [{ name: 'x', cluster: 'c', user: 'u' }],
        currentContext: 'x',
      });
      const informer = new Informer(kc, {
        resource: 'services', path: '/api/v1/services',
        listPage: (t) => listPageJson(kc, '/api/v1/services', { continue: t }),
        strip: (o) => o, onChange: () => {},
        backoff: { initialMs: 400, maxMs: 800 },
        observer: { onError: () => process.stdout.write('retry\\n') },
      });
      informer.start();
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      cwd: fileURLToPath(new URL('../../../', import.meta.url)),
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    try {
      await waitFor(() => (out.match(/retry/g) ?? []).length >= 4 || child.exitCode !== null, 'four retries');
      expect(child.exitCode, 'still running').to.equal(null);
    } finally {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await once(child, 'exit');
      }
    }
  });
});
