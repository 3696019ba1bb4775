// The API stand-in against the real @kubernetes/client-node and the real kubectl.

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
import { ApiStandIn } from '../../testbed/api-server.js';
import { rejectionOf } from '../support/assertions.js';
import { waitFor as waitUntil } from '../support/eventually.js';

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
const waitFor = (cond: () => boolean, what: string, ms = 10_000) => waitUntil(cond, what, ms);

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
      expect([api.status, api.body.kind, api.body.versions]).to.deep.equal([200, 'APIVersions', ['v1']]);
      const groups = await raw(server, 'GET', '/apis');
      expect([groups.body.kind, groups.body.groups]).to.deep.equal(['APIGroupList', []]);
      const v1 = await raw(server, 'GET', '/api/v1');
      expect(v1.body.kind).to.equal('APIResourceList');
      const byName = new Map<string, Json>(v1.body.resources.map((r: Json) => [r.name, r]));
      expect([...byName.keys()].sort()).to.deep.equal([
        'events',
        'namespaces',
        'nodes',
        'nodes/status',
        'services',
        'services/status',
      ]);
      expect(byName.get('services')!.verbs).to.deep.equal([
        'create',
        'delete',
        'get',
        'list',
        'patch',
        'update',
        'watch',
      ]);
      expect([byName.get('services')!.namespaced, byName.get('nodes')!.namespaced]).to.deep.equal([true, false]);
      expect(byName.get('services/status')!.verbs).to.deep.equal(['get', 'patch', 'update']);
      expect(byName.get('events')!.verbs).to.deep.equal(['create', 'get', 'list', 'watch']);
      const version = await raw(server, 'GET', '/version');
      expect([version.body.major, version.body.minor]).to.deep.equal(['1', '34']);
    });

    it('rejects a request without a bearer token with a 401 Status', async () => {
      const res = await raw(server, 'GET', '/api/v1/services', { token: null });
      expect(res.status).to.equal(401);
      expect([res.body.kind, res.body.status, res.body.reason, res.body.code]).to.deep.equal([
        'Status',
        'Failure',
        'Unauthorized',
        401,
      ]);
    });

    it('rejects a client whose kubeconfig has no credentials with 401', async () => {
      const noToken = server.kubeconfig().replace(/user:\n\s+token: .*/, 'user: {}');
      expect(noToken).to.not.match(/token/);
      const kc = new KubeConfig();
      kc.loadFromString(noToken);
      const err = (await rejectionOf(kc.makeApiClient(CoreV1Api).listNamespace())) as Error & { code?: number };
      expect(err.code).to.equal(401);
    });

    it('answers failures as metav1 Status objects with the real codes and reasons', async () => {
      const missing = await raw(server, 'GET', '/api/v1/namespaces/default/services/nope');
      expect([missing.status, missing.body.kind, missing.body.reason, missing.body.code]).to.deep.equal([
        404,
        'Status',
        'NotFound',
        404,
      ]);
      expect(missing.body.details).to.deep.equal({ name: 'nope', kind: 'services' });
      expect(missing.body.message).to.equal('services "nope" not found');

      const body = JSON.stringify(service('default', 'dup'));
      expect((await raw(server, 'POST', '/api/v1/namespaces/default/services', { body })).status).to.equal(201);
      const dup = await raw(server, 'POST', '/api/v1/namespaces/default/services', { body });
      expect([dup.status, dup.body.reason, dup.body.code]).to.deep.equal([409, 'AlreadyExists', 409]);

      const bad = await raw(server, 'POST', '/api/v1/namespaces/default/services', { body: '{"kind": "Serv' });
      expect([bad.status, bad.body.reason]).to.deep.equal([400, 'BadRequest']);

      const deleteCollection = await raw(server, 'DELETE', '/api/v1/services');
      expect([deleteCollection.status, deleteCollection.body.reason]).to.deep.equal([405, 'MethodNotAllowed']);
      const updateEvent = await raw(server, 'PUT', '/api/v1/namespaces/default/events/e', { body: '{}' });
      expect(updateEvent.status).to.equal(405);

      const unknown = await raw(server, 'GET', '/api/v1/pods');
      expect([unknown.status, unknown.body.kind]).to.deep.equal([404, 'Status']);
      const notApi = await raw(server, 'GET', '/openapi/v2');
      expect(notApi.status).to.equal(404);

      const applyPatch = await raw(server, 'PATCH', '/api/v1/namespaces/default/services/dup', {
        body: '{}',
        contentType: 'application/apply-patch+yaml',
      });
      expect(applyPatch.status).to.equal(415);

      const badSelector = await raw(server, 'GET', '/api/v1/services?fieldSelector=spec.clusterIP%3D1.2.3.4');
      expect([badSelector.status, badSelector.body.message]).to.deep.equal([
        400,
        'field label not supported: spec.clusterIP',
      ]);
    });

    it('lists with a global resourceVersion, selectors, and limit/continue chunks', async () => {
      server.apply(service('b', 's1', { labels: { app: 'web' } }));
      server.apply(service('a', 's2', { labels: { app: 'db' } }));
      server.apply(service('a', 's1', { labels: { app: 'web', tier: 'x' } }));
      server.apply(service('c', 's3'));
      const last = server.apply(service('b', 's0'));

      const all = await raw(server, 'GET', '/api/v1/services');
      expect([all.body.kind, all.body.apiVersion]).to.deep.equal(['ServiceList', 'v1']);
      expect(all.body.metadata.resourceVersion).to.equal(last.metadata.resourceVersion);
      const keyOf = (o: Json) => `${o.metadata.namespace}/${o.metadata.name}`;
      expect(all.body.items.map(keyOf)).to.deep.equal(['a/s1', 'a/s2', 'b/s0', 'b/s1', 'c/s3']);
      // As on the real server, list items carry no kind or apiVersion.
      expect(all.body.items[0].kind).to.equal(undefined);

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
        expect(page.body.metadata.resourceVersion).to.equal(last.metadata.resourceVersion);
        pages.push(page.body.items.map(keyOf));
        cont = page.body.metadata.continue ?? '';
      } while (cont);
      expect(pages).to.deep.equal([['a/s1', 'a/s2'], ['b/s0', 'b/s1'], ['c/s3']]);

      const web = await raw(server, 'GET', '/api/v1/services?labelSelector=app%3Dweb');
      expect(web.body.items.map(keyOf)).to.deep.equal(['a/s1', 'b/s1']);
      const notWeb = await raw(server, 'GET', '/api/v1/services?labelSelector=app!%3Dweb,!tier');
      expect(notWeb.body.items.map(keyOf)).to.deep.equal(['a/s00', 'a/s2', 'b/s0', 'c/s3']);
      const inB = await raw(server, 'GET', '/api/v1/services?fieldSelector=metadata.namespace%3Db');
      expect(inB.body.items.map(keyOf)).to.deep.equal(['b/s0', 'b/s1']);
      const nsPath = await raw(server, 'GET', '/api/v1/namespaces/a/services?fieldSelector=metadata.name%3Ds2');
      expect(nsPath.body.items.map(keyOf)).to.deep.equal(['a/s2']);

      const namespaces = await raw(server, 'GET', '/api/v1/namespaces');
      expect(namespaces.body.items.map((n: Json) => n.metadata.name)).to.deep.equal([
        'a',
        'b',
        'c',
        'default',
        'kube-system',
      ]);
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
      expect(created.status).to.equal(201);
      const svc = created.body;
      expect(svc.metadata.uid).to.match(/^[0-9a-f-]{36}$/);
      expect(svc.metadata.namespace).to.equal('shop');
      expect(svc.metadata.generation).to.equal(1);
      expect(svc.spec.clusterIP).to.match(/^10\.96\.\d+\.\d+$/);
      expect(svc.spec.clusterIPs).to.deep.equal([svc.spec.clusterIP]);
      expect(svc.spec.ports[0]).to.deep.equal({ name: 'http', port: 80, protocol: 'TCP', targetPort: 80 });
      expect(server.get('Namespace', undefined, 'shop')?.status).to.deep.equal({ phase: 'Active' });

      const stale = await raw(server, 'PUT', `${path}/web`, {
        body: JSON.stringify({ ...svc, metadata: { ...svc.metadata, resourceVersion: '1' } }),
      });
      expect([stale.status, stale.body.reason]).to.deep.equal([409, 'Conflict']);

      // PUT on the main resource ignores status; PUT on /status changes only status.
      const replaced = await raw(server, 'PUT', `${path}/web`, {
        body: JSON.stringify({
          ...svc,
          spec: { ...svc.spec, externalIPs: ['198.51.100.1'] },
          status: { loadBalancer: { ingress: [{ ip: '203.0.113.9' }] } },
        }),
      });
      expect(replaced.status).to.equal(200);
      expect(replaced.body.spec.externalIPs).to.deep.equal(['198.51.100.1']);
      expect(replaced.body.status).to.deep.equal({ loadBalancer: {} });
      expect(replaced.body.metadata.generation).to.equal(2);
      expect(replaced.body.metadata.creationTimestamp).to.equal(svc.metadata.creationTimestamp);
      expect(Number(replaced.body.metadata.resourceVersion)).to.be.above(Number(svc.metadata.resourceVersion));

      const withStatus = await raw(server, 'PUT', `${path}/web/status`, {
        body: JSON.stringify({
          ...replaced.body,
          spec: { ...replaced.body.spec, externalIPs: [] },
          status: { loadBalancer: { ingress: [{ ip: '203.0.113.9' }] } },
        }),
      });
      expect(withStatus.body.status.loadBalancer.ingress).to.deep.equal([{ ip: '203.0.113.9' }]);
      expect(withStatus.body.spec.externalIPs).to.deep.equal(['198.51.100.1']);
      expect(withStatus.body.metadata.generation).to.equal(2);

      const merged = await raw(server, 'PATCH', `${path}/web`, {
        contentType: 'application/merge-patch+json',
        body: JSON.stringify({ metadata: { labels: { app: 'web' } }, spec: { externalIPs: null } }),
      });
      expect(merged.body.metadata.labels).to.deep.equal({ app: 'web' });
      expect(merged.body.spec.externalIPs).to.equal(undefined);

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
      expect(strategic.body.spec.ports.map((p: Json) => [p.name, p.port, p.protocol, p.targetPort])).to.deep.equal([
        ['https', 443, 'TCP', 8443],
        ['dns', 53, 'UDP', 53],
      ]);

      const jsonPatched = await raw(server, 'PATCH', `${path}/web`, {
        contentType: 'application/json-patch+json',
        body: JSON.stringify([
          { op: 'test', path: '/spec/ports/1/port', value: 53 },
          { op: 'replace', path: '/spec/ports/1/port', value: 5353 },
          { op: 'add', path: '/metadata/labels/tier', value: 'front' },
        ]),
      });
      expect(jsonPatched.body.spec.ports[1].port).to.equal(5353);
      expect(jsonPatched.body.metadata.labels).to.deep.equal({ app: 'web', tier: 'front' });
      const failedTest = await raw(server, 'PATCH', `${path}/web`, {
        contentType: 'application/json-patch+json',
        body: JSON.stringify([{ op: 'test', path: '/spec/type', value: 'ClusterIP' }]),
      });
      expect(failedTest.status).to.equal(422);

      const deleted = await raw(server, 'DELETE', `${path}/web`, {
        body: JSON.stringify({ kind: 'DeleteOptions', apiVersion: 'v1', propagationPolicy: 'Background' }),
      });
      expect([deleted.status, deleted.body.kind, deleted.body.metadata.name]).to.deep.equal([200, 'Service', 'web']);
      expect(server.get('Service', 'shop', 'web')).to.equal(undefined);
      expect((await raw(server, 'GET', `${path}/web`)).status).to.equal(404);
    });

    it('stores Nodes (cluster-scoped) and Events (create only) over HTTP', async () => {
      const created = await raw(server, 'POST', '/api/v1/nodes', { body: JSON.stringify(node('n1', '10.244.1.0/24')) });
      expect([created.status, created.body.metadata.namespace]).to.deep.equal([201, undefined]);
      expect((await raw(server, 'GET', '/api/v1/nodes/n1')).body.spec.podCIDR).to.equal('10.244.1.0/24');
      const gone = await raw(server, 'DELETE', '/api/v1/nodes/n1');
      expect([gone.body.kind, gone.body.status, gone.body.details.name]).to.deep.equal(['Status', 'Success', 'n1']);
      expect(server.list('Node')).to.have.lengthOf(0);

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
      expect(posted.status).to.equal(201);
      expect(posted.body.metadata.name).to.match(/^web\.[0-9a-f]{5}$/);
      const events = server.list('Event');
      expect(events.map((e) => [e.metadata.namespace, e.reason])).to.deep.equal([['shop', 'ExternalIPConflict']]);
      const listed = await raw(server, 'GET', '/api/v1/namespaces/shop/events');
      expect([listed.body.kind, listed.body.items.length]).to.deep.equal(['EventList', 1]);
      // kubectl describe finds an object's events with these field selectors.
      const forWeb = await raw(
        server,
        'GET',
        `/api/v1/events?fieldSelector=${encodeURIComponent('involvedObject.name=web,involvedObject.kind=Service,type=Warning')}`,
      );
      expect(forWeb.body.items.map((e: Json) => e.reason)).to.deep.equal(['ExternalIPConflict']);
      const forApi = await raw(
        server,
        'GET',
        `/api/v1/events?fieldSelector=${encodeURIComponent('involvedObject.name=api')}`,
      );
      expect(forApi.body.items).to.deep.equal([]);
    });

    it('apply() fills metadata, keeps or honours creationTimestamp, and skips no-op replaces', () => {
      const first = server.apply(service('default', 'a'));
      expect(first.metadata.uid).to.match(/^[0-9a-f-]{36}$/);
      expect(first.metadata.creationTimestamp).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);
      expect(first.metadata.generation).to.equal(1);
      const rv = Number(first.metadata.resourceVersion);

      const changed = server.apply(service('default', 'a', { clusterIP: '10.96.1.2' }));
      expect(Number(changed.metadata.resourceVersion)).to.equal(rv + 1);
      expect([changed.metadata.uid, changed.metadata.creationTimestamp, changed.metadata.generation]).to.deep.equal([
        first.metadata.uid,
        first.metadata.creationTimestamp,
        2,
      ]);
      const same = server.apply(service('default', 'a', { clusterIP: '10.96.1.2' }));
      expect(same.metadata.resourceVersion).to.equal(changed.metadata.resourceVersion);

      const old = server.apply({
        ...service('default', 'b'),
        metadata: { name: 'b', creationTimestamp: '2020-01-02T03:04:05Z' },
      });
      expect(old.metadata.creationTimestamp).to.equal('2020-01-02T03:04:05Z');
      expect(old.metadata.namespace).to.equal('default');
      // apply() stores shapes as given: no ClusterIP is allocated.
      const empty = server.apply({ ...service('default', 'c'), spec: { type: 'ClusterIP', clusterIP: '' } });
      expect(empty.spec.clusterIP).to.equal('');

      expect(server.remove('Service', 'default', 'a')).to.equal(true);
      expect(server.remove('Service', 'default', 'a')).to.equal(false);
      expect(names(server.list('Service'))).to.deep.equal(['default/b', 'default/c']);
      expect(() => server.apply({ kind: 'Pod', metadata: { name: 'p' } })).to.throw(/not kind Pod/);
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
      expect(
        w.events.map((e) => [e.type, e.object.kind, e.object.metadata.namespace, e.object.metadata.name]),
      ).to.deep.equal([
        ['ADDED', 'Service', 'default', 'b'],
        ['MODIFIED', 'Service', 'default', 'a'],
        ['DELETED', 'Service', 'default', 'b'],
        ['ADDED', 'Service', 'other', 'c'],
      ]);
      const rvs = w.events.map((e) => Number(e.object.metadata.resourceVersion));
      expect(rvs).to.deep.equal([...rvs].sort((x, y) => x - y));
      expect(w.events[1]!.object.spec.clusterIP).to.equal('10.96.1.9');
      expect(server.stats.watches.services).to.equal(1);
    });

    it('start with the current objects as ADDED when no resourceVersion is given', async () => {
      server.apply(service('default', 'a'));
      server.apply(node('n1', '10.244.0.0/24'));
      const w = await recordWatch(server, '/api/v1/namespaces/default/services', {});
      stopAfter.push(() => w.abort());
      await waitFor(() => w.events.length === 1, 'the initial event');
      expect([w.events[0]!.type, w.events[0]!.object.metadata.name]).to.deep.equal(['ADDED', 'a']);
    });

    it('answer an expired resourceVersion with an ERROR event carrying a 410 Expired Status', async () => {
      const a = server.apply(service('default', 'a'));
      const b = server.apply(service('default', 'b'));
      server.expireHistory();
      // Even the latest version seen before the expiry is too old now.
      const latest = await recordWatch(server, '/api/v1/services', { resourceVersion: b.metadata.resourceVersion });
      await latest.done;
      expect(latest.events.map((e) => [e.type, e.object.code])).to.deep.equal([['ERROR', 410]]);
      const w = await recordWatch(server, '/api/v1/services', { resourceVersion: a.metadata.resourceVersion });
      expect(await w.done).to.equal(null);
      expect(w.events).to.have.lengthOf(1);
      const { type, object } = w.events[0]!;
      expect([type, object.kind, object.status, object.reason, object.code]).to.deep.equal([
        'ERROR',
        'Status',
        'Failure',
        'Expired',
        410,
      ]);
      // A list still works and gives a resourceVersion that can be watched from.
      const list = await raw(server, 'GET', '/api/v1/services');
      expect(list.body.items.length).to.equal(2);
      const again = await recordWatch(server, '/api/v1/services', {
        resourceVersion: list.body.metadata.resourceVersion,
      });
      stopAfter.push(() => again.abort());
      server.apply(service('default', 'c'));
      await waitFor(() => again.events.length === 1, 'the event after the relist');
      expect([again.events[0]!.type, again.events[0]!.object.metadata.name]).to.deep.equal(['ADDED', 'c']);
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
      expect(tooOld.events.map((e) => [e.type, e.object.code])).to.deep.equal([['ERROR', 410]]);
      const kept = await recordWatch(small, '/api/v1/services', {
        resourceVersion: String(Number(first.metadata.resourceVersion) + 1),
      });
      stopAfter.push(() => kept.abort());
      await waitFor(() => kept.events.length === 3, 'the kept events');
      expect(kept.events.map((e) => e.object.spec.clusterIP)).to.deep.equal(['10.96.1.3', '10.96.1.4', '10.96.1.5']);
    });

    it('send bookmarks with only kind, apiVersion and the current resourceVersion', async () => {
      server.apply(service('default', 'a'));
      const w = await recordWatch(server, '/api/v1/services', { resourceVersion: '0', allowWatchBookmarks: true });
      stopAfter.push(() => w.abort());
      // The periodic ones (a watch from 0 is a WatchList from 1.34: its first bookmark is marked).
      const periodic = (e: Json) => e.type === 'BOOKMARK' && e.object.metadata.annotations === undefined;
      await waitFor(() => w.events.some(periodic), 'a bookmark');
      server.apply(node('n1', '10.244.0.0/24'));
      const nodeRv = server.get('Node', undefined, 'n1')!.metadata.resourceVersion;
      await waitFor(
        () => w.events.some((e) => e.type === 'BOOKMARK' && e.object.metadata.resourceVersion === nodeRv),
        'a bookmark at the resourceVersion of the Node write',
      );
      const bookmark = w.events.find(periodic)!.object;
      expect(Object.keys(bookmark).sort()).to.deep.equal(['apiVersion', 'kind', 'metadata']);
      expect([bookmark.kind, bookmark.apiVersion, Object.keys(bookmark.metadata)]).to.deep.equal([
        'Service',
        'v1',
        ['resourceVersion'],
      ]);
      // The Node write itself is not a Service event.
      expect(w.events.filter((e) => e.type !== 'BOOKMARK').map((e) => e.object.metadata.name)).to.deep.equal(['a']);

      const without = await recordWatch(server, '/api/v1/services', { resourceVersion: nodeRv });
      stopAfter.push(() => without.abort());
      server.apply(service('default', 'b'));
      await waitFor(() => without.events.length === 1, 'the event after b');
      expect(without.events.map((e) => e.type)).to.deep.equal(['ADDED']);
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
      expect(w.events.map((e) => [e.type, e.object.metadata.name, e.object.metadata.labels.app])).to.deep.equal([
        ['DELETED', 'a', 'db'],
        ['ADDED', 'a', 'web'],
        ['MODIFIED', 'a', 'web'],
      ]);
    });

    it('end when timeoutSeconds has passed', async () => {
      const w = await recordWatch(server, '/api/v1/nodes', { timeoutSeconds: 1 });
      expect(await w.done).to.equal(null);
      expect(w.events).to.deep.equal([]);
    });

    it('carry raw lines injected into the open watches of one kind, and only those', async () => {
      const services = await recordWatch(server, '/api/v1/services', { resourceVersion: '1' });
      const nodes = await recordWatch(server, '/api/v1/nodes', { resourceVersion: '1' });
      stopAfter.push(
        () => services.abort(),
        () => nodes.abort(),
      );
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
    type ServiceInformer = ReturnType<typeof makeInformer<V1Service>>;
    /** A Service informer on the server, `listen` given it before its start; stopped after the test. */
    async function startServiceInformer(
      listen: (informer: ServiceInformer) => void,
    ): Promise<{ informer: ServiceInformer; core: CoreV1Api }> {
      const { kc, core } = clientFor(server);
      const informer = makeInformer<V1Service>(kc, '/api/v1/services', () => core.listServiceForAllNamespaces());
      listen(informer);
      await informer.start();
      stopAfter.push(() => informer.stop());
      return { informer, core };
    }

    it('a Service informer sees adds, updates and deletes', async () => {
      server.apply(service('default', 'pre', { clusterIP: '10.96.0.50' }));
      const seen: string[] = [];
      const { informer } = await startServiceInformer((informer) => {
        informer.on('add', (s) => seen.push(`add ${s.metadata!.namespace}/${s.metadata!.name} ${s.spec!.clusterIP}`));
        informer.on('update', (s) =>
          seen.push(`update ${s.metadata!.namespace}/${s.metadata!.name} ${s.spec!.clusterIP}`),
        );
        informer.on('delete', (s) => seen.push(`delete ${s.metadata!.namespace}/${s.metadata!.name}`));
        informer.on('error', (err) => seen.push(`error ${String(err)}`));
      });
      await waitFor(() => seen.length === 1, 'the listed Service');

      server.apply(service('shop', 'web', { clusterIP: '10.96.0.60' }));
      await waitFor(() => seen.length === 2, 'the add');
      server.apply(service('shop', 'web', { clusterIP: '10.96.0.61' }));
      await waitFor(() => seen.length === 3, 'the update');
      server.remove('Service', 'default', 'pre');
      await waitFor(() => seen.length === 4, 'the delete');
      expect(seen).to.deep.equal([
        'add default/pre 10.96.0.50',
        'add shop/web 10.96.0.60',
        'update shop/web 10.96.0.61',
        'delete default/pre',
      ]);
      expect(names(informer.list())).to.deep.equal(['shop/web']);
      expect(informer.get('web', 'shop')!.spec!.clusterIP).to.equal('10.96.0.61');
      expect(server.stats.lists.services).to.equal(1);
      expect(server.stats.watches.services).to.equal(1);
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
      expect(seen).to.deep.equal(['add node-a 10.244.1.0/24', 'update node-a 10.244.9.0/24', 'delete node-a']);
    });

    it('emits an error when the server becomes unavailable, and a restart resumes without a relist', async () => {
      server.apply(service('default', 'a'));
      const errors: unknown[] = [];
      const seen: string[] = [];
      const { informer, core } = await startServiceInformer((informer) => {
        informer.on('error', (err) => errors.push(err));
        informer.on('add', (s) => seen.push(`add ${s.metadata!.name}`));
      });
      await waitFor(() => seen.length === 1, 'the listed Service');

      server.setUnavailable(true);
      await waitFor(() => errors.length > 0, 'the informer error');
      expect(await rejectionOf(core.listNamespace())).to.satisfy((err: Error & { code?: string }) => {
        expect(`${err.code} ${err.message}`).to.match(/ECONNRESET|socket hang up/);
        return true;
      });
      server.apply(service('default', 'b'));
      server.setUnavailable(false);
      await informer.start();
      await waitFor(() => seen.length === 2, 'the add of b');
      expect(seen).to.deep.equal(['add a', 'add b']);
      // The restart resumed the watch from the informer's resourceVersion: one list in all.
      expect(server.stats.lists.services).to.equal(1);
    });

    it('relists and converges when restarted after the history expired (410 Gone)', async () => {
      server.apply(service('default', 'a'));
      server.apply(service('default', 'b'));
      const errors: unknown[] = [];
      const seen: string[] = [];
      const { informer } = await startServiceInformer((informer) => {
        informer.on('error', (err) => errors.push(err));
        informer.on('add', (s) => seen.push(`add ${s.metadata!.name}`));
        informer.on('update', (s) => seen.push(`update ${s.metadata!.name} ${s.spec!.clusterIP}`));
        informer.on('delete', (s) => seen.push(`delete ${s.metadata!.name}`));
      });
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
      expect(seen.slice(2).sort()).to.deep.equal(['add c', 'delete a', 'update b 10.96.7.7']);
      expect(server.stats.lists.services).to.equal(2);
      expect(informer.get('b', 'default')!.spec!.clusterIP).to.equal('10.96.7.7');
      // After the relist the informer watches live again.
      server.apply(service('default', 'd'));
      await waitFor(() => seen.length === 6, 'the live add after the relist');
      expect(seen[5]).to.equal('add d');
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
      expect(rows[0]).to.deep.equal(['NAMESPACE', 'NAME', 'TYPE', 'CLUSTER-IP', 'EXTERNAL-IP', 'PORT(S)', 'AGE']);
      expect(rows.slice(1).map((r) => r.slice(0, 6))).to.deep.equal([
        ['kube-system', 'lb', 'LoadBalancer', '10.96.6.6', '203.0.113.6', '443:30443/TCP'],
        ['shop', 'web', 'ClusterIP', '10.96.5.5', '198.51.100.5', '80/TCP'],
      ]);
      const json = JSON.parse(await kubectl('get', 'svc', '-n', 'shop', 'web', '-o', 'json'));
      expect([json.kind, json.spec.clusterIP]).to.deep.equal(['Service', '10.96.5.5']);
      expect(server.stats.requests).to.be.above(0);
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
      expect((await kubectl('apply', '--validate=false', '-f', file)).trim()).to.equal('service/api created');
      const created = server.get('Service', 'shop', 'api')!;
      expect(created.spec.clusterIP).to.match(/^10\.96\./);
      expect(created.spec.externalIPs).to.deep.equal(['198.51.100.7']);

      await writeFile(
        file,
        manifest('  - {name: https, port: 443, targetPort: 9443}\n  - {name: dns, port: 53, protocol: UDP}', '[]'),
      );
      expect((await kubectl('apply', '--validate=false', '-f', file)).trim()).to.equal('service/api configured');
      const configured = server.get('Service', 'shop', 'api')!;
      expect(
        configured.spec.ports.map((p: Json) => `${p.name} ${p.port}/${p.protocol} -> ${p.targetPort}`),
      ).to.deep.equal(['https 443/TCP -> 9443', 'dns 53/UDP -> 53']);
      expect(configured.spec.externalIPs).to.deep.equal([]);
      expect(configured.spec.clusterIP).to.equal(created.spec.clusterIP);
      expect(configured.metadata.uid).to.equal(created.metadata.uid);
      expect(configured.metadata.generation).to.equal(2);
      expect((await kubectl('apply', '--validate=false', '-f', file)).trim()).to.equal('service/api unchanged');
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
      expect(rows[0]!.slice(0, 4)).to.deep.equal(['EVENT', 'NAME', 'TYPE', 'CLUSTER-IP']);
      expect(rows.slice(1).map((r) => [r[0], r[1], r[4]])).to.deep.equal([
        ['ADDED', 'web', '<none>'],
        ['MODIFIED', 'web', '198.51.100.9'],
        ['DELETED', 'web', '198.51.100.9'],
      ]);
    });

    it('delete svc removes the Service', async () => {
      server.apply(service('shop', 'web'));
      server.apply(service('shop', 'keep'));
      expect((await kubectl('delete', 'svc', '-n', 'shop', 'web')).trim()).to.equal('service "web" deleted');
      expect(names(server.list('Service'))).to.deep.equal(['shop/keep']);
      expect((await rejectionOf(kubectl('delete', 'svc', '-n', 'shop', 'web'))).message).to.match(/NotFound|not found/);
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
          join(repoRoot, 'dist/testbed/api-server-main.js'),
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
      expect(out).to.match(/3 objects loaded/);
      const { stdout } = await run('kubectl', ['--kubeconfig', kubeconfig, 'get', 'svc', '-A', '-o', 'name']);
      expect(stdout.trim().split('\n')).to.deep.equal(['service/dns', 'service/web']);
      const nodes = await run('kubectl', [
        '--kubeconfig',
        kubeconfig,
        'get',
        'nodes',
        '-o',
        'jsonpath={.items[*].spec.podCIDR}',
      ]);
      expect(nodes.stdout).to.equal('10.244.1.0/24');
      child.kill('SIGTERM');
      expect(await exited).to.equal(0);
    });
  });
});
