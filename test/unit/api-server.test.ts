// The API stand-in against the real @kubernetes/client-node and the real kubectl.

import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import type { IncomingHttpHeaders } from 'node:http';
import https from 'node:https';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import {
  CoreV1Api,
  KubeConfig,
  ListWatch,
  Watch,
  makeInformer,
  type KubernetesObject,
  type V1Node,
  type V1Service,
} from '@kubernetes/client-node';
import { expect } from 'chai';
import { ApiStandIn } from '../support/api-server.js';

const here = dirname(fileURLToPath(import.meta.url));
const repoRoot = join(here, '..', '..', '..');
const run = promisify(execFile);

// eslint-style any is the wire format here: tests read raw JSON.
type Json = Record<string, any>;

function service(namespace: string, name: string, extra: Json = {}): Json {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace, name, labels: extra.labels ?? {} },
    spec: {
      type: 'ClusterIP',
      clusterIP: extra.clusterIP ?? '10.96.1.1',
      ports: [{ name: 'http', protocol: 'TCP', port: 80 }],
      ...(extra.spec ?? {}),
    },
  };
}

function node(name: string, podCIDR: string): Json {
  return { apiVersion: 'v1', kind: 'Node', metadata: { name }, spec: { podCIDR, podCIDRs: [podCIDR] } };
}

function clientFor(server: ApiStandIn): { kc: KubeConfig; core: CoreV1Api } {
  const kc = new KubeConfig();
  kc.loadFromString(server.kubeconfig());
  return { kc, core: kc.makeApiClient(CoreV1Api) };
}

interface RawResponse {
  status: number;
  headers: IncomingHttpHeaders;
  body: Json;
}

/** One HTTPS request on a fresh connection, answering the parsed JSON body. */
function raw(
  server: ApiStandIn,
  method: string,
  path: string,
  opts: { body?: string; contentType?: string; token?: string | null; accept?: string } = {},
): Promise<RawResponse> {
  const headers: Record<string, string> = { Accept: opts.accept ?? 'application/json' };
  if (opts.token !== null) headers.Authorization = `Bearer ${opts.token ?? 'test'}`;
  if (opts.body !== undefined) {
    headers['Content-Type'] = opts.contentType ?? 'application/json';
    headers['Content-Length'] = String(Buffer.byteLength(opts.body));
  }
  return new Promise((resolve, reject) => {
    const req = https.request(new URL(path, server.url), { method, headers, ca: server.caPem, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('error', reject);
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString('utf8');
        try {
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: text ? JSON.parse(text) : {} });
        } catch (err) {
          reject(new Error(`not JSON (${res.statusCode}): ${text}: ${String(err)}`));
        }
      });
    });
    req.on('error', reject);
    if (opts.body !== undefined) req.write(opts.body);
    req.end();
  });
}

/** Polls until cond holds; the bound only keeps a broken run from hanging. */
async function waitFor(cond: () => boolean, what: string, limitMs = 10_000): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

interface WatchRecording {
  events: Array<{ type: string; object: Json }>;
  done: Promise<unknown>;
  abort(): void;
}

async function recordWatch(server: ApiStandIn, path: string, query: Json): Promise<WatchRecording> {
  const { kc } = clientFor(server);
  const events: WatchRecording['events'] = [];
  let finish!: (err: unknown) => void;
  const done = new Promise<unknown>((resolve) => (finish = resolve));
  const controller = await new Watch(kc).watch(
    path,
    query,
    (type, object) => events.push({ type, object }),
    (err) => finish(err),
  );
  return { events, done, abort: () => controller.abort() };
}

function names(objs: readonly KubernetesObject[]): string[] {
  return objs.map((o) => `${o.metadata?.namespace ?? ''}/${o.metadata?.name}`).sort();
}

describe('Kubernetes API stand-in', function () {
  this.timeout(30_000);
  let server: ApiStandIn;
  const stopAfter: Array<() => unknown> = [];

  beforeEach(async () => {
    server = await ApiStandIn.start({ bookmarkIntervalMs: 50 });
  });

  afterEach(async () => {
    for (const stop of stopAfter.splice(0)) await stop();
    await server.stop();
  });

  describe('wire protocol', () => {
    it('serves discovery for core/v1 and the version', async () => {
      const api = await raw(server, 'GET', '/api');
      assert.deepEqual([api.status, api.body.kind, api.body.versions], [200, 'APIVersions', ['v1']]);
      const groups = await raw(server, 'GET', '/apis');
      assert.deepEqual([groups.body.kind, groups.body.groups], ['APIGroupList', []]);
      const v1 = await raw(server, 'GET', '/api/v1');
      assert.equal(v1.body.kind, 'APIResourceList');
      const byName = new Map<string, Json>(v1.body.resources.map((r: Json) => [r.name, r]));
      assert.deepEqual([...byName.keys()].sort(), [
        'events',
        'namespaces',
        'nodes',
        'nodes/status',
        'services',
        'services/status',
      ]);
      assert.deepEqual(byName.get('services')!.verbs, ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch']);
      assert.deepEqual([byName.get('services')!.namespaced, byName.get('nodes')!.namespaced], [true, false]);
      assert.deepEqual(byName.get('services/status')!.verbs, ['get', 'patch', 'update']);
      assert.deepEqual(byName.get('events')!.verbs, ['create', 'get', 'list', 'watch']);
      const version = await raw(server, 'GET', '/version');
      assert.deepEqual([version.body.major, version.body.minor], ['1', '32']);
    });

    it('rejects a request without a bearer token with a 401 Status', async () => {
      const res = await raw(server, 'GET', '/api/v1/services', { token: null });
      assert.equal(res.status, 401);
      assert.deepEqual(
        [res.body.kind, res.body.status, res.body.reason, res.body.code],
        ['Status', 'Failure', 'Unauthorized', 401],
      );
    });

    it('rejects a client whose kubeconfig has no credentials with 401', async () => {
      const noToken = server.kubeconfig().replace(/user:\n\s+token: .*/, 'user: {}');
      assert.doesNotMatch(noToken, /token/);
      const kc = new KubeConfig();
      kc.loadFromString(noToken);
      await assert.rejects(kc.makeApiClient(CoreV1Api).listNamespace(), (err: Error & { code?: number }) => {
        assert.equal(err.code, 401);
        return true;
      });
    });

    it('answers failures as metav1 Status objects with the real codes and reasons', async () => {
      const missing = await raw(server, 'GET', '/api/v1/namespaces/default/services/nope');
      assert.deepEqual(
        [missing.status, missing.body.kind, missing.body.reason, missing.body.code],
        [404, 'Status', 'NotFound', 404],
      );
      assert.deepEqual(missing.body.details, { name: 'nope', kind: 'services' });
      assert.equal(missing.body.message, 'services "nope" not found');

      const body = JSON.stringify(service('default', 'dup'));
      assert.equal((await raw(server, 'POST', '/api/v1/namespaces/default/services', { body })).status, 201);
      const dup = await raw(server, 'POST', '/api/v1/namespaces/default/services', { body });
      assert.deepEqual([dup.status, dup.body.reason, dup.body.code], [409, 'AlreadyExists', 409]);

      const bad = await raw(server, 'POST', '/api/v1/namespaces/default/services', { body: '{"kind": "Serv' });
      assert.deepEqual([bad.status, bad.body.reason], [400, 'BadRequest']);

      const deleteCollection = await raw(server, 'DELETE', '/api/v1/services');
      assert.deepEqual([deleteCollection.status, deleteCollection.body.reason], [405, 'MethodNotAllowed']);
      const updateEvent = await raw(server, 'PUT', '/api/v1/namespaces/default/events/e', { body: '{}' });
      assert.equal(updateEvent.status, 405);

      const unknown = await raw(server, 'GET', '/api/v1/pods');
      assert.deepEqual([unknown.status, unknown.body.kind], [404, 'Status']);
      const notApi = await raw(server, 'GET', '/openapi/v2');
      assert.equal(notApi.status, 404);

      const applyPatch = await raw(server, 'PATCH', '/api/v1/namespaces/default/services/dup', {
        body: '{}',
        contentType: 'application/apply-patch+yaml',
      });
      assert.equal(applyPatch.status, 415);

      const badSelector = await raw(server, 'GET', '/api/v1/services?fieldSelector=spec.clusterIP%3D1.2.3.4');
      assert.deepEqual(
        [badSelector.status, badSelector.body.message],
        [400, 'field label not supported: spec.clusterIP'],
      );
    });

    it('lists with a global resourceVersion, selectors, and limit/continue chunks', async () => {
      server.apply(service('b', 's1', { labels: { app: 'web' } }));
      server.apply(service('a', 's2', { labels: { app: 'db' } }));
      server.apply(service('a', 's1', { labels: { app: 'web', tier: 'x' } }));
      server.apply(service('c', 's3'));
      const last = server.apply(service('b', 's0'));

      const all = await raw(server, 'GET', '/api/v1/services');
      assert.deepEqual([all.body.kind, all.body.apiVersion], ['ServiceList', 'v1']);
      assert.equal(all.body.metadata.resourceVersion, last.metadata.resourceVersion);
      const keyOf = (o: Json) => `${o.metadata.namespace}/${o.metadata.name}`;
      assert.deepEqual(all.body.items.map(keyOf), ['a/s1', 'a/s2', 'b/s0', 'b/s1', 'c/s3']);
      // As on the real server, list items carry no kind or apiVersion.
      assert.equal(all.body.items[0].kind, undefined);

      const pages: string[][] = [];
      let cont = '';
      do {
        const page = await raw(
          server,
          'GET',
          `/api/v1/services?limit=2${cont ? `&continue=${encodeURIComponent(cont)}` : ''}`,
        );
        // A write between pages does not show in the remaining pages: they come from one snapshot.
        if (pages.length === 0) server.apply(service('a', 's00'));
        assert.equal(page.body.metadata.resourceVersion, last.metadata.resourceVersion);
        pages.push(page.body.items.map(keyOf));
        cont = page.body.metadata.continue ?? '';
      } while (cont);
      assert.deepEqual(pages, [['a/s1', 'a/s2'], ['b/s0', 'b/s1'], ['c/s3']]);

      const web = await raw(server, 'GET', '/api/v1/services?labelSelector=app%3Dweb');
      assert.deepEqual(web.body.items.map(keyOf), ['a/s1', 'b/s1']);
      const notWeb = await raw(server, 'GET', '/api/v1/services?labelSelector=app!%3Dweb,!tier');
      assert.deepEqual(notWeb.body.items.map(keyOf), ['a/s00', 'a/s2', 'b/s0', 'c/s3']);
      const inB = await raw(server, 'GET', '/api/v1/services?fieldSelector=metadata.namespace%3Db');
      assert.deepEqual(inB.body.items.map(keyOf), ['b/s0', 'b/s1']);
      const nsPath = await raw(server, 'GET', '/api/v1/namespaces/a/services?fieldSelector=metadata.name%3Ds2');
      assert.deepEqual(nsPath.body.items.map(keyOf), ['a/s2']);

      const namespaces = await raw(server, 'GET', '/api/v1/namespaces');
      assert.deepEqual(
        namespaces.body.items.map((n: Json) => n.metadata.name),
        ['a', 'b', 'c', 'default', 'kube-system'],
      );
    });

    it('creates, replaces, patches, updates status and deletes Services over HTTP', async () => {
      const path = '/api/v1/namespaces/shop/services';
      const created = await raw(server, 'POST', path, {
        body: JSON.stringify({
          apiVersion: 'v1',
          kind: 'Service',
          metadata: { name: 'web' },
          spec: {
            type: 'LoadBalancer',
            ports: [
              { name: 'http', port: 80 },
              { name: 'https', port: 443 },
            ],
          },
        }),
      });
      assert.equal(created.status, 201);
      const svc = created.body;
      assert.match(svc.metadata.uid, /^[0-9a-f-]{36}$/);
      assert.equal(svc.metadata.namespace, 'shop');
      assert.equal(svc.metadata.generation, 1);
      assert.match(svc.spec.clusterIP, /^10\.96\.\d+\.\d+$/);
      assert.deepEqual(svc.spec.clusterIPs, [svc.spec.clusterIP]);
      assert.deepEqual(svc.spec.ports[0], { name: 'http', port: 80, protocol: 'TCP', targetPort: 80 });
      assert.deepEqual(server.get('Namespace', undefined, 'shop')?.status, { phase: 'Active' });

      const stale = await raw(server, 'PUT', `${path}/web`, {
        body: JSON.stringify({ ...svc, metadata: { ...svc.metadata, resourceVersion: '1' } }),
      });
      assert.deepEqual([stale.status, stale.body.reason], [409, 'Conflict']);

      // PUT on the main resource ignores status; PUT on /status changes only status.
      const replaced = await raw(server, 'PUT', `${path}/web`, {
        body: JSON.stringify({
          ...svc,
          spec: { ...svc.spec, externalIPs: ['198.51.100.1'] },
          status: { loadBalancer: { ingress: [{ ip: '203.0.113.9' }] } },
        }),
      });
      assert.equal(replaced.status, 200);
      assert.deepEqual(replaced.body.spec.externalIPs, ['198.51.100.1']);
      assert.deepEqual(replaced.body.status, { loadBalancer: {} });
      assert.equal(replaced.body.metadata.generation, 2);
      assert.equal(replaced.body.metadata.creationTimestamp, svc.metadata.creationTimestamp);
      assert.ok(Number(replaced.body.metadata.resourceVersion) > Number(svc.metadata.resourceVersion));

      const withStatus = await raw(server, 'PUT', `${path}/web/status`, {
        body: JSON.stringify({
          ...replaced.body,
          spec: { ...replaced.body.spec, externalIPs: [] },
          status: { loadBalancer: { ingress: [{ ip: '203.0.113.9' }] } },
        }),
      });
      assert.deepEqual(withStatus.body.status.loadBalancer.ingress, [{ ip: '203.0.113.9' }]);
      assert.deepEqual(withStatus.body.spec.externalIPs, ['198.51.100.1']);
      assert.equal(withStatus.body.metadata.generation, 2);

      const merged = await raw(server, 'PATCH', `${path}/web`, {
        contentType: 'application/merge-patch+json',
        body: JSON.stringify({ metadata: { labels: { app: 'web' } }, spec: { externalIPs: null } }),
      });
      assert.deepEqual(merged.body.metadata.labels, { app: 'web' });
      assert.equal(merged.body.spec.externalIPs, undefined);

      const strategic = await raw(server, 'PATCH', `${path}/web`, {
        contentType: 'application/strategic-merge-patch+json',
        body: JSON.stringify({
          spec: {
            ports: [
              { port: 443, targetPort: 8443 },
              { port: 80, $patch: 'delete' },
              { name: 'dns', port: 53, protocol: 'UDP' },
            ],
          },
        }),
      });
      assert.deepEqual(
        strategic.body.spec.ports.map((p: Json) => [p.name, p.port, p.protocol, p.targetPort]),
        [
          ['https', 443, 'TCP', 8443],
          ['dns', 53, 'UDP', 53],
        ],
      );

      const jsonPatched = await raw(server, 'PATCH', `${path}/web`, {
        contentType: 'application/json-patch+json',
        body: JSON.stringify([
          { op: 'test', path: '/spec/ports/1/port', value: 53 },
          { op: 'replace', path: '/spec/ports/1/port', value: 5353 },
          { op: 'add', path: '/metadata/labels/tier', value: 'front' },
        ]),
      });
      assert.equal(jsonPatched.body.spec.ports[1].port, 5353);
      assert.deepEqual(jsonPatched.body.metadata.labels, { app: 'web', tier: 'front' });
      const failedTest = await raw(server, 'PATCH', `${path}/web`, {
        contentType: 'application/json-patch+json',
        body: JSON.stringify([{ op: 'test', path: '/spec/type', value: 'ClusterIP' }]),
      });
      assert.equal(failedTest.status, 422);

      const deleted = await raw(server, 'DELETE', `${path}/web`, {
        body: JSON.stringify({ kind: 'DeleteOptions', apiVersion: 'v1', propagationPolicy: 'Background' }),
      });
      assert.deepEqual([deleted.status, deleted.body.kind, deleted.body.metadata.name], [200, 'Service', 'web']);
      assert.equal(server.get('Service', 'shop', 'web'), undefined);
      assert.equal((await raw(server, 'GET', `${path}/web`)).status, 404);
    });

    it('stores Nodes (cluster-scoped) and Events (create only) over HTTP', async () => {
      const created = await raw(server, 'POST', '/api/v1/nodes', { body: JSON.stringify(node('n1', '10.244.1.0/24')) });
      assert.deepEqual([created.status, created.body.metadata.namespace], [201, undefined]);
      assert.equal((await raw(server, 'GET', '/api/v1/nodes/n1')).body.spec.podCIDR, '10.244.1.0/24');
      const gone = await raw(server, 'DELETE', '/api/v1/nodes/n1');
      assert.deepEqual([gone.body.kind, gone.body.status, gone.body.details.name], ['Status', 'Success', 'n1']);
      assert.equal(server.list('Node').length, 0);

      const event = {
        apiVersion: 'v1',
        kind: 'Event',
        metadata: { generateName: 'web.' },
        involvedObject: { kind: 'Service', namespace: 'shop', name: 'web' },
        reason: 'ExternalIPConflict',
        message: 'lost 203.0.113.9:80/TCP to shop/api',
        type: 'Warning',
      };
      const posted = await raw(server, 'POST', '/api/v1/namespaces/shop/events', { body: JSON.stringify(event) });
      assert.equal(posted.status, 201);
      assert.match(posted.body.metadata.name, /^web\.[0-9a-f]{5}$/);
      const events = server.list('Event');
      assert.deepEqual(
        events.map((e) => [e.metadata.namespace, e.reason]),
        [['shop', 'ExternalIPConflict']],
      );
      const listed = await raw(server, 'GET', '/api/v1/namespaces/shop/events');
      assert.deepEqual([listed.body.kind, listed.body.items.length], ['EventList', 1]);
      // kubectl describe finds an object's events with these field selectors.
      const forWeb = await raw(
        server,
        'GET',
        `/api/v1/events?fieldSelector=${encodeURIComponent('involvedObject.name=web,involvedObject.kind=Service,type=Warning')}`,
      );
      assert.deepEqual(
        forWeb.body.items.map((e: Json) => e.reason),
        ['ExternalIPConflict'],
      );
      const forApi = await raw(
        server,
        'GET',
        `/api/v1/events?fieldSelector=${encodeURIComponent('involvedObject.name=api')}`,
      );
      assert.deepEqual(forApi.body.items, []);
    });

    it('apply() fills metadata, keeps or honours creationTimestamp, and skips no-op replaces', () => {
      const first = server.apply(service('default', 'a'));
      assert.match(first.metadata.uid, /^[0-9a-f-]{36}$/);
      assert.match(first.metadata.creationTimestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
      assert.equal(first.metadata.generation, 1);
      const rv = Number(first.metadata.resourceVersion);

      const changed = server.apply(service('default', 'a', { clusterIP: '10.96.1.2' }));
      assert.equal(Number(changed.metadata.resourceVersion), rv + 1);
      assert.deepEqual(
        [changed.metadata.uid, changed.metadata.creationTimestamp, changed.metadata.generation],
        [first.metadata.uid, first.metadata.creationTimestamp, 2],
      );
      const same = server.apply(service('default', 'a', { clusterIP: '10.96.1.2' }));
      assert.equal(same.metadata.resourceVersion, changed.metadata.resourceVersion);

      const old = server.apply({
        ...service('default', 'b'),
        metadata: { name: 'b', creationTimestamp: '2020-01-02T03:04:05Z' },
      });
      assert.equal(old.metadata.creationTimestamp, '2020-01-02T03:04:05Z');
      assert.equal(old.metadata.namespace, 'default');
      // apply() stores shapes as given: no ClusterIP is allocated.
      const empty = server.apply({ ...service('default', 'c'), spec: { type: 'ClusterIP', clusterIP: '' } });
      assert.equal(empty.spec.clusterIP, '');

      assert.equal(server.remove('Service', 'default', 'a'), true);
      assert.equal(server.remove('Service', 'default', 'a'), false);
      assert.deepEqual(names(server.list('Service')), ['default/b', 'default/c']);
      assert.throws(() => server.apply({ kind: 'Pod', metadata: { name: 'p' } }), /not kind Pod/);
    });
  });

  describe('watch streams', () => {
    it('replay the changes after a resourceVersion, then stream live ones', async () => {
      const a = server.apply(service('default', 'a'));
      server.apply(service('default', 'b'));
      server.apply(service('default', 'a', { clusterIP: '10.96.1.9' }));
      server.remove('Service', 'default', 'b');

      const w = await recordWatch(server, '/api/v1/services', { resourceVersion: a.metadata.resourceVersion });
      stopAfter.push(() => w.abort());
      await waitFor(() => w.events.length === 3, 'the replayed events');
      server.apply(service('other', 'c'));
      await waitFor(() => w.events.length === 4, 'the live event');
      assert.deepEqual(
        w.events.map((e) => [e.type, e.object.kind, e.object.metadata.namespace, e.object.metadata.name]),
        [
          ['ADDED', 'Service', 'default', 'b'],
          ['MODIFIED', 'Service', 'default', 'a'],
          ['DELETED', 'Service', 'default', 'b'],
          ['ADDED', 'Service', 'other', 'c'],
        ],
      );
      const rvs = w.events.map((e) => Number(e.object.metadata.resourceVersion));
      assert.deepEqual(
        rvs,
        [...rvs].sort((x, y) => x - y),
      );
      assert.equal(w.events[1]!.object.spec.clusterIP, '10.96.1.9');
      assert.equal(server.stats.watches.services, 1);
    });

    it('start with the current objects as ADDED when no resourceVersion is given', async () => {
      server.apply(service('default', 'a'));
      server.apply(node('n1', '10.244.0.0/24'));
      const w = await recordWatch(server, '/api/v1/namespaces/default/services', {});
      stopAfter.push(() => w.abort());
      await waitFor(() => w.events.length === 1, 'the initial event');
      assert.deepEqual([w.events[0]!.type, w.events[0]!.object.metadata.name], ['ADDED', 'a']);
    });

    it('answer an expired resourceVersion with an ERROR event carrying a 410 Expired Status', async () => {
      const a = server.apply(service('default', 'a'));
      const b = server.apply(service('default', 'b'));
      server.expireHistory();
      // Even the latest version seen before the expiry is too old now.
      const latest = await recordWatch(server, '/api/v1/services', { resourceVersion: b.metadata.resourceVersion });
      await latest.done;
      assert.deepEqual(
        latest.events.map((e) => [e.type, e.object.code]),
        [['ERROR', 410]],
      );
      const w = await recordWatch(server, '/api/v1/services', { resourceVersion: a.metadata.resourceVersion });
      assert.equal(await w.done, null);
      assert.equal(w.events.length, 1);
      const { type, object } = w.events[0]!;
      assert.deepEqual(
        [type, object.kind, object.status, object.reason, object.code],
        ['ERROR', 'Status', 'Failure', 'Expired', 410],
      );
      // A list still works and gives a resourceVersion that can be watched from.
      const list = await raw(server, 'GET', '/api/v1/services');
      assert.equal(list.body.items.length, 2);
      const again = await recordWatch(server, '/api/v1/services', {
        resourceVersion: list.body.metadata.resourceVersion,
      });
      stopAfter.push(() => again.abort());
      server.apply(service('default', 'c'));
      await waitFor(() => again.events.length === 1, 'the event after the relist');
      assert.deepEqual([again.events[0]!.type, again.events[0]!.object.metadata.name], ['ADDED', 'c']);
    });

    it('expire when more changes happened than the history keeps', async () => {
      const small = await ApiStandIn.start({ historyLimit: 3 });
      stopAfter.push(() => small.stop());
      const first = small.apply(service('default', 'a'));
      // Four changes after the first: the history of three no longer holds the first of them.
      for (const ip of ['10.96.1.2', '10.96.1.3', '10.96.1.4', '10.96.1.5']) {
        small.apply(service('default', 'a', { clusterIP: ip }));
      }
      const tooOld = await recordWatch(small, '/api/v1/services', { resourceVersion: first.metadata.resourceVersion });
      await tooOld.done;
      assert.deepEqual(
        tooOld.events.map((e) => [e.type, e.object.code]),
        [['ERROR', 410]],
      );
      const kept = await recordWatch(small, '/api/v1/services', {
        resourceVersion: String(Number(first.metadata.resourceVersion) + 1),
      });
      stopAfter.push(() => kept.abort());
      await waitFor(() => kept.events.length === 3, 'the kept events');
      assert.deepEqual(
        kept.events.map((e) => e.object.spec.clusterIP),
        ['10.96.1.3', '10.96.1.4', '10.96.1.5'],
      );
    });

    it('send bookmarks with only kind, apiVersion and the current resourceVersion', async () => {
      server.apply(service('default', 'a'));
      const w = await recordWatch(server, '/api/v1/services', { resourceVersion: '0', allowWatchBookmarks: true });
      stopAfter.push(() => w.abort());
      await waitFor(() => w.events.some((e) => e.type === 'BOOKMARK'), 'a bookmark');
      server.apply(node('n1', '10.244.0.0/24'));
      const nodeRv = server.get('Node', undefined, 'n1')!.metadata.resourceVersion;
      await waitFor(
        () => w.events.some((e) => e.type === 'BOOKMARK' && e.object.metadata.resourceVersion === nodeRv),
        'a bookmark at the resourceVersion of the Node write',
      );
      const bookmark = w.events.find((e) => e.type === 'BOOKMARK')!.object;
      assert.deepEqual(Object.keys(bookmark).sort(), ['apiVersion', 'kind', 'metadata']);
      assert.deepEqual(
        [bookmark.kind, bookmark.apiVersion, Object.keys(bookmark.metadata)],
        ['Service', 'v1', ['resourceVersion']],
      );
      // The Node write itself is not a Service event.
      assert.deepEqual(
        w.events.filter((e) => e.type !== 'BOOKMARK').map((e) => e.object.metadata.name),
        ['a'],
      );

      const without = await recordWatch(server, '/api/v1/services', { resourceVersion: nodeRv });
      stopAfter.push(() => without.abort());
      server.apply(service('default', 'b'));
      await waitFor(() => without.events.length === 1, 'the event after b');
      assert.deepEqual(
        without.events.map((e) => e.type),
        ['ADDED'],
      );
    });

    it('show an object leaving a label selection as DELETED and entering it as ADDED', async () => {
      const start = server.apply(service('default', 'a', { labels: { app: 'web' } }));
      const w = await recordWatch(server, '/api/v1/services', {
        resourceVersion: start.metadata.resourceVersion,
        labelSelector: 'app=web',
      });
      stopAfter.push(() => w.abort());
      server.apply(service('default', 'a', { labels: { app: 'db' } }));
      server.apply(service('default', 'b', { labels: { app: 'db' } }));
      server.apply(service('default', 'a', { labels: { app: 'web' }, clusterIP: '10.96.1.5' }));
      server.apply(service('default', 'a', { labels: { app: 'web' }, clusterIP: '10.96.1.6' }));
      await waitFor(() => w.events.length === 3, 'three events');
      assert.deepEqual(
        w.events.map((e) => [e.type, e.object.metadata.name, e.object.metadata.labels.app]),
        [
          ['DELETED', 'a', 'db'],
          ['ADDED', 'a', 'web'],
          ['MODIFIED', 'a', 'web'],
        ],
      );
    });

    it('end when timeoutSeconds has passed', async () => {
      const w = await recordWatch(server, '/api/v1/nodes', { timeoutSeconds: 1 });
      assert.equal(await w.done, null);
      assert.deepEqual(w.events, []);
    });

    it('carry raw lines injected into the open watches of one kind, and only those', async () => {
      const services = await recordWatch(server, '/api/v1/services', { resourceVersion: '1' });
      const nodes = await recordWatch(server, '/api/v1/nodes', { resourceVersion: '1' });
      stopAfter.push(() => services.abort(), () => nodes.abort());
      await waitFor(() => server.openWatchCount('Service') === 1 && server.openWatchCount('Node') === 1, 'two watches');
      expect(server.injectWatchLine('Service', '{"type":"ODD","object":{"x":1}}')).to.equal(1);
      expect(server.injectWatchLine('Service', '42')).to.equal(1);
      server.apply(service('default', 'after'));
      await waitFor(() => services.events.length === 3, 'three lines');
      expect(services.events.map((e) => e.type)).to.deep.equal(['ODD', undefined, 'ADDED']);
      expect(nodes.events).to.deep.equal([]);
    });

    it('hold a silenced watch open with nothing on it: no event, no bookmark, no end at its timeout', async () => {
      const w = await recordWatch(server, '/api/v1/services', {
        resourceVersion: '1',
        allowWatchBookmarks: true,
        timeoutSeconds: 1,
      });
      stopAfter.push(() => w.abort());
      await waitFor(() => server.openWatchCount('Service') === 1, 'the watch');
      expect(server.silenceOpenWatches('Service')).to.equal(1);
      server.apply(service('default', 'unseen'));
      let ended = false;
      void w.done.then(() => (ended = true));
      await new Promise((resolve) => setTimeout(resolve, 1500));
      expect(w.events).to.deep.equal([]);
      expect(ended, 'still open past timeoutSeconds').to.equal(false);
      expect(server.openWatchCount('Service')).to.equal(1);
      // A new watch works, and replays what the silent one missed.
      const next = await recordWatch(server, '/api/v1/services', { resourceVersion: '1' });
      stopAfter.push(() => next.abort());
      await waitFor(() => next.events.length === 1, 'the replay');
      expect(next.events[0]!.object.metadata.name).to.equal('unseen');
    });
  });

  describe('with the client-node informer', () => {
    it('a Service informer sees adds, updates and deletes', async () => {
      server.apply(service('default', 'pre', { clusterIP: '10.96.0.50' }));
      const { kc, core } = clientFor(server);
      const informer = makeInformer<V1Service>(kc, '/api/v1/services', () => core.listServiceForAllNamespaces());
      const seen: string[] = [];
      informer.on('add', (s) => seen.push(`add ${s.metadata!.namespace}/${s.metadata!.name} ${s.spec!.clusterIP}`));
      informer.on('update', (s) =>
        seen.push(`update ${s.metadata!.namespace}/${s.metadata!.name} ${s.spec!.clusterIP}`),
      );
      informer.on('delete', (s) => seen.push(`delete ${s.metadata!.namespace}/${s.metadata!.name}`));
      informer.on('error', (err) => seen.push(`error ${String(err)}`));
      await informer.start();
      stopAfter.push(() => informer.stop());
      await waitFor(() => seen.length === 1, 'the listed Service');

      server.apply(service('shop', 'web', { clusterIP: '10.96.0.60' }));
      await waitFor(() => seen.length === 2, 'the add');
      server.apply(service('shop', 'web', { clusterIP: '10.96.0.61' }));
      await waitFor(() => seen.length === 3, 'the update');
      server.remove('Service', 'default', 'pre');
      await waitFor(() => seen.length === 4, 'the delete');
      assert.deepEqual(seen, [
        'add default/pre 10.96.0.50',
        'add shop/web 10.96.0.60',
        'update shop/web 10.96.0.61',
        'delete default/pre',
      ]);
      assert.deepEqual(names(informer.list()), ['shop/web']);
      assert.equal(informer.get('web', 'shop')!.spec!.clusterIP, '10.96.0.61');
      assert.equal(server.stats.lists.services, 1);
      assert.equal(server.stats.watches.services, 1);
    });

    it('a Node informer with fieldSelector metadata.name sees only its Node', async () => {
      server.apply(node('node-a', '10.244.1.0/24'));
      server.apply(node('node-b', '10.244.2.0/24'));
      const { kc, core } = clientFor(server);
      const selector = 'metadata.name=node-a';
      const informer = new ListWatch<V1Node>(
        '/api/v1/nodes',
        new Watch(kc),
        () => core.listNode({ fieldSelector: selector }),
        false,
        undefined,
        selector,
      );
      const seen: string[] = [];
      informer.on('add', (n) => seen.push(`add ${n.metadata!.name} ${n.spec!.podCIDR}`));
      informer.on('update', (n) => seen.push(`update ${n.metadata!.name} ${n.spec!.podCIDR}`));
      informer.on('delete', (n) => seen.push(`delete ${n.metadata!.name}`));
      await informer.start();
      stopAfter.push(() => informer.stop());
      await waitFor(() => seen.length === 1, 'the listed Node');
      server.apply(node('node-b', '10.244.3.0/24'));
      server.apply(node('node-a', '10.244.9.0/24'));
      server.remove('Node', undefined, 'node-b');
      server.remove('Node', undefined, 'node-a');
      await waitFor(() => seen.length === 3, 'the update and delete of node-a');
      assert.deepEqual(seen, ['add node-a 10.244.1.0/24', 'update node-a 10.244.9.0/24', 'delete node-a']);
    });

    it('emits an error when the server becomes unavailable, and a restart resumes without a relist', async () => {
      server.apply(service('default', 'a'));
      const { kc, core } = clientFor(server);
      const informer = makeInformer<V1Service>(kc, '/api/v1/services', () => core.listServiceForAllNamespaces());
      const errors: unknown[] = [];
      const seen: string[] = [];
      informer.on('error', (err) => errors.push(err));
      informer.on('add', (s) => seen.push(`add ${s.metadata!.name}`));
      await informer.start();
      stopAfter.push(() => informer.stop());
      await waitFor(() => seen.length === 1, 'the listed Service');

      server.setUnavailable(true);
      await waitFor(() => errors.length > 0, 'the informer error');
      await assert.rejects(core.listNamespace(), (err: Error & { code?: string }) => {
        assert.match(`${err.code} ${err.message}`, /ECONNRESET|socket hang up/);
        return true;
      });
      server.apply(service('default', 'b'));
      server.setUnavailable(false);
      await informer.start();
      await waitFor(() => seen.length === 2, 'the add of b');
      assert.deepEqual(seen, ['add a', 'add b']);
      // The restart resumed the watch from the informer's resourceVersion: one list in all.
      assert.equal(server.stats.lists.services, 1);
    });

    it('relists and converges when restarted after the history expired (410 Gone)', async () => {
      server.apply(service('default', 'a'));
      server.apply(service('default', 'b'));
      const { kc, core } = clientFor(server);
      const informer = makeInformer<V1Service>(kc, '/api/v1/services', () => core.listServiceForAllNamespaces());
      const errors: unknown[] = [];
      const seen: string[] = [];
      informer.on('error', (err) => errors.push(err));
      informer.on('add', (s) => seen.push(`add ${s.metadata!.name}`));
      informer.on('update', (s) => seen.push(`update ${s.metadata!.name} ${s.spec!.clusterIP}`));
      informer.on('delete', (s) => seen.push(`delete ${s.metadata!.name}`));
      await informer.start();
      stopAfter.push(() => informer.stop());
      await waitFor(() => seen.length === 2, 'the listed Services');

      // Cut the watch, change things while the informer is away, and lose the history.
      server.setUnavailable(true);
      await waitFor(() => errors.length > 0, 'the informer error');
      server.remove('Service', 'default', 'a');
      server.apply(service('default', 'b', { clusterIP: '10.96.7.7' }));
      server.apply(service('default', 'c'));
      server.expireHistory();
      server.setUnavailable(false);

      await informer.start();
      await waitFor(() => names(informer.list()).join() === 'default/b,default/c', 'the informer to converge');
      await waitFor(() => seen.length === 5, 'the relist events');
      assert.deepEqual(seen.slice(2).sort(), ['add c', 'delete a', 'update b 10.96.7.7']);
      assert.equal(server.stats.lists.services, 2);
      assert.equal(informer.get('b', 'default')!.spec!.clusterIP, '10.96.7.7');
      // After the relist the informer watches live again.
      server.apply(service('default', 'd'));
      await waitFor(() => seen.length === 6, 'the live add after the relist');
      assert.equal(seen[5], 'add d');
    });
  });

  describe('with kubectl', () => {
    let dir: string;
    let kubeconfig: string;
    const kubectl = async (...args: string[]) => (await run('kubectl', ['--kubeconfig', kubeconfig, ...args])).stdout;

    beforeEach(async () => {
      dir = await mkdtemp(join(tmpdir(), 'api-stand-in-test-'));
      kubeconfig = join(dir, 'kubeconfig');
      await server.writeKubeconfig(kubeconfig);
    });
    afterEach(async () => {
      await rm(dir, { recursive: true, force: true });
    });

    it('get svc -A prints the Services of every namespace', async () => {
      server.apply(service('shop', 'web', { clusterIP: '10.96.5.5', spec: { externalIPs: ['198.51.100.5'] } }));
      server.apply({
        ...service('kube-system', 'lb', { clusterIP: '10.96.6.6' }),
        spec: {
          type: 'LoadBalancer',
          clusterIP: '10.96.6.6',
          ports: [{ port: 443, protocol: 'TCP', nodePort: 30443 }],
        },
        status: { loadBalancer: { ingress: [{ ip: '203.0.113.6' }] } },
      });
      const rows = (await kubectl('get', 'svc', '-A'))
        .trim()
        .split('\n')
        .map((l) => l.trim().split(/\s+/));
      assert.deepEqual(rows[0], ['NAMESPACE', 'NAME', 'TYPE', 'CLUSTER-IP', 'EXTERNAL-IP', 'PORT(S)', 'AGE']);
      assert.deepEqual(
        rows.slice(1).map((r) => r.slice(0, 6)),
        [
          ['kube-system', 'lb', 'LoadBalancer', '10.96.6.6', '203.0.113.6', '443:30443/TCP'],
          ['shop', 'web', 'ClusterIP', '10.96.5.5', '198.51.100.5', '80/TCP'],
        ],
      );
      const json = JSON.parse(await kubectl('get', 'svc', '-n', 'shop', 'web', '-o', 'json'));
      assert.deepEqual([json.kind, json.spec.clusterIP], ['Service', '10.96.5.5']);
      assert.ok(server.stats.requests > 0);
    });

    it('apply --validate=false creates, then configures with a strategic merge patch', async () => {
      const manifest = (ports: string, externalIPs: string) => `apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: shop
spec:
  type: LoadBalancer
  selector: {app: api}
  externalIPs: ${externalIPs}
  ports:
${ports}
`;
      const file = join(dir, 'svc.yaml');
      await writeFile(
        file,
        manifest('  - {name: http, port: 80, targetPort: 8080}\n  - {name: https, port: 443}', '[198.51.100.7]'),
      );
      assert.equal((await kubectl('apply', '--validate=false', '-f', file)).trim(), 'service/api created');
      const created = server.get('Service', 'shop', 'api')!;
      assert.match(created.spec.clusterIP, /^10\.96\./);
      assert.deepEqual(created.spec.externalIPs, ['198.51.100.7']);

      await writeFile(
        file,
        manifest('  - {name: https, port: 443, targetPort: 9443}\n  - {name: dns, port: 53, protocol: UDP}', '[]'),
      );
      assert.equal((await kubectl('apply', '--validate=false', '-f', file)).trim(), 'service/api configured');
      const configured = server.get('Service', 'shop', 'api')!;
      assert.deepEqual(
        configured.spec.ports.map((p: Json) => `${p.name} ${p.port}/${p.protocol} -> ${p.targetPort}`),
        ['https 443/TCP -> 9443', 'dns 53/UDP -> 53'],
      );
      assert.deepEqual(configured.spec.externalIPs, []);
      assert.equal(configured.spec.clusterIP, created.spec.clusterIP);
      assert.equal(configured.metadata.uid, created.metadata.uid);
      assert.equal(configured.metadata.generation, 2);
      assert.equal((await kubectl('apply', '--validate=false', '-f', file)).trim(), 'service/api unchanged');
    });

    it('get -w prints watch events as server-side table rows', async () => {
      server.apply(service('shop', 'web', { clusterIP: '10.96.5.5' }));
      const child = spawn(
        'kubectl',
        ['--kubeconfig', kubeconfig, 'get', 'svc', '-n', 'shop', '-w', '--output-watch-events'],
        {
          stdio: ['ignore', 'pipe', 'pipe'],
        },
      );
      stopAfter.push(() => child.kill('SIGKILL'));
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      await waitFor(() => /ADDED\s+web/.test(out), `the initial row (got: ${out})`);
      server.apply(service('shop', 'web', { clusterIP: '10.96.5.5', spec: { externalIPs: ['198.51.100.9'] } }));
      await waitFor(() => /MODIFIED\s+web/.test(out), `the modified row (got: ${out})`);
      server.remove('Service', 'shop', 'web');
      await waitFor(() => /DELETED\s+web/.test(out), `the deleted row (got: ${out})`);
      const rows = out
        .trim()
        .split('\n')
        .map((l) => l.trim().split(/\s+/));
      assert.deepEqual(rows[0]!.slice(0, 4), ['EVENT', 'NAME', 'TYPE', 'CLUSTER-IP']);
      assert.deepEqual(
        rows.slice(1).map((r) => [r[0], r[1], r[4]]),
        [
          ['ADDED', 'web', '<none>'],
          ['MODIFIED', 'web', '198.51.100.9'],
          ['DELETED', 'web', '198.51.100.9'],
        ],
      );
    });

    it('delete svc removes the Service', async () => {
      server.apply(service('shop', 'web'));
      server.apply(service('shop', 'keep'));
      assert.equal((await kubectl('delete', 'svc', '-n', 'shop', 'web')).trim(), 'service "web" deleted');
      assert.deepEqual(names(server.list('Service')), ['shop/keep']);
      await assert.rejects(kubectl('delete', 'svc', '-n', 'shop', 'web'), /NotFound|not found/);
    });
  });

  describe('standalone command', () => {
    it('loads objects, writes a kubeconfig kubectl can use, and exits on SIGTERM', async () => {
      const dir = await mkdtemp(join(tmpdir(), 'api-stand-in-main-'));
      stopAfter.push(() => rm(dir, { recursive: true, force: true }));
      const kubeconfig = join(dir, 'kubeconfig');
      const child = spawn(
        process.execPath,
        [
          join(repoRoot, 'dist/test/support/api-server-main.js'),
          '--port',
          '0',
          '--kubeconfig-out',
          kubeconfig,
          '--objects',
          join(repoRoot, 'test/support/fixtures/demo-objects.yaml'),
        ],
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
      stopAfter.push(() => child.kill('SIGKILL'));
      let out = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString()));
      child.stderr.on('data', (d: Buffer) => (out += d.toString()));
      await waitFor(() => /listening on https:\/\/127\.0\.0\.1:\d+/.test(out), `the start line (got: ${out})`);
      assert.match(out, /3 objects loaded/);
      const { stdout } = await run('kubectl', ['--kubeconfig', kubeconfig, 'get', 'svc', '-A', '-o', 'name']);
      assert.deepEqual(stdout.trim().split('\n'), ['service/dns', 'service/web']);
      const nodes = await run('kubectl', [
        '--kubeconfig',
        kubeconfig,
        'get',
        'nodes',
        '-o',
        'jsonpath={.items[*].spec.podCIDR}',
      ]);
      assert.equal(nodes.stdout, '10.244.1.0/24');
      child.kill('SIGTERM');
      assert.equal(await exited, 0);
    });
  });
});
