// Every read from the API server is bounded, whatever a Service holds or a server sends: a
// response body (request.ts), a list page (cluster.ts: pages of large objects shrink, a page of
// one object over the bound fails the list), a watch line (watch.ts). Checked against the API
// stand-in (real HTTPS, the real wire protocol) with the production bounds, and against a raw
// server for bodies the stand-in never sends (endless, or announced too long).

import type { ServerResponse } from 'node:http';
import { KubeConfig } from '@kubernetes/client-node';
import { expect } from 'chai';
import {
  createClusterCaches,
  listPager,
  ListPageTooLargeError,
  MAX_LIST_PAGE_BYTES,
  PAGE_SIZE,
} from '../../src/kube/cluster.js';
import type { Informer } from '../../src/kube/informer.js';
import { ListBodyError, ListBodySplitter, ListItemTooLargeError } from '../../src/kube/list-stream.js';
import { apiRequest, MAX_RESPONSE_BYTES, ResponseTooLargeError } from '../../src/kube/request.js';
import { MAX_WATCH_LINE_BYTES } from '../../src/kube/watch.js';
import type { ServiceInfo } from '../../src/model/types.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { makeTlsFixture, RawApiServer, type TlsFixture } from '../support/raw-api.js';
import { waitFor } from '../support/eventually.js';

/** A Service whose annotation makes its JSON about `bytes` long. */
function service(name: string, ip: string, bytes = 0) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: 'default', name, annotations: bytes > 0 ? { filler: 'x'.repeat(bytes) } : {} },
    spec: { type: 'LoadBalancer', clusterIP: '10.96.0.10', ports: [{ protocol: 'TCP', port: 80 }] },
    status: { loadBalancer: { ingress: [{ ip }] } },
  };
}

describe('bounded reads from the API server', function () {
  this.timeout(120_000);

  it('one bound for a response, a list page and a watch line: as large as one object can be in JSON', () => {
    // etcd stores at most 1.5 MiB per object; escaping can make its JSON 6 times longer.
    expect(MAX_RESPONSE_BYTES).to.be.at.least(1.5 * 6 * (1 << 20));
    expect(MAX_LIST_PAGE_BYTES).to.equal(MAX_RESPONSE_BYTES);
    expect(MAX_WATCH_LINE_BYTES).to.equal(MAX_RESPONSE_BYTES);
  });

  describe('a response body', () => {
    let tls: TlsFixture;
    let raw: RawApiServer;
    let kc: KubeConfig;

    before(async () => {
      tls = await makeTlsFixture();
      raw = await RawApiServer.start(tls);
      kc = new KubeConfig();
      kc.loadFromOptions(raw.kubeconfigOptions({ token: 't' }));
    });
    after(() => raw.stop());

    it('longer than the bound is an error naming the path and the bound, read no further (an endless body)', async () => {
      let written = 0;
      let closed = false;
      raw.handler = (_req, res: ServerResponse) => {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        const chunk = Buffer.alloc(64 << 10, 0x20);
        res.on('close', () => (closed = true));
        const pump = () => {
          while (!closed && res.write(chunk)) written += chunk.length;
          if (!closed) res.once('drain', pump);
        };
        pump();
      };
      let error: unknown;
      await apiRequest(kc, '/api/v1/services', { maxResponseBytes: 1 << 20 }).catch((err: unknown) => (error = err));
      expect(error).to.be.instanceOf(ResponseTooLargeError);
      expect((error as Error).message).to.equal(
        'the response to /api/v1/services is larger than 1 MiB, the most this controller reads',
      );
      await waitFor(() => closed, 'the connection to be closed');
      // What the server got out before it saw the close: the bound plus what sockets buffer.
      expect(written).to.be.below(64 << 20);
    });

    it('announced longer than the bound is an error before any of it is read', async () => {
      raw.handler = (_req, res: ServerResponse) => {
        res.writeHead(200, { 'Content-Type': 'application/json', 'Content-Length': String(2 << 20) });
        res.flushHeaders();
        // The body never comes: a client that waited for it would hang.
      };
      let error: unknown;
      await apiRequest(kc, '/api/v1/services', { maxResponseBytes: 1 << 20, timeoutMs: 60_000 }).catch(
        (err: unknown) => (error = err),
      );
      expect(error).to.be.instanceOf(ResponseTooLargeError);
    });

    it('up to the bound is read whole', async () => {
      const body = JSON.stringify({ items: [], filler: 'y'.repeat((1 << 20) - 24) });
      expect(body.length).to.equal(1 << 20);
      raw.handler = (_req, res: ServerResponse) => {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end(body);
      };
      const response = await apiRequest(kc, '/api/v1/services', { maxResponseBytes: 1 << 20 });
      expect(response.bytes).to.equal(1 << 20);
      expect((response.json as { filler: string }).filler).to.have.length((1 << 20) - 24);
    });
  });

  describe('a list read object by object', () => {
    const body = JSON.stringify({
      kind: 'ServiceList',
      apiVersion: 'v1',
      metadata: { resourceVersion: '42', continue: 'x"}]{[' },
      items: [
        { metadata: { name: 'a', annotations: { tricky: '"}],{[\\"' } }, n: -1.5e3, t: true, z: null },
        { metadata: { name: 'b' }, nested: [[{}], [], [1, 2]] },
        { metadata: { name: 'ünïcode ✓' } },
      ],
      trailing: 7,
    });
    const split = (chunks: Buffer[], max = 1 << 20) => {
      const items: unknown[] = [];
      const splitter = new ListBodySplitter('/api/v1/services', max, (item) => items.push(item));
      for (const chunk of chunks) splitter.push(chunk);
      splitter.end();
      return { items, members: splitter.members };
    };

    it('hands over each item and keeps the other members, however the body is cut', () => {
      const bytes = Buffer.from(body);
      const whole = JSON.parse(body) as { items: unknown[]; metadata: unknown; trailing: number };
      for (let cut = 0; cut <= bytes.length; cut++) {
        const { items, members } = split([bytes.subarray(0, cut), bytes.subarray(cut)]);
        expect(items, `cut at ${cut}`).to.deep.equal(whole.items);
        expect(members.metadata, `cut at ${cut}`).to.deep.equal(whole.metadata);
        expect(members.trailing).to.equal(7);
      }
      const bytewise = split([...bytes].map((b) => Buffer.from([b])));
      expect(bytewise.items).to.deep.equal(whole.items);
    });

    it('bounds each object, not the list: an object over the bound ends the read', () => {
      const items = Array.from({ length: 50 }, (_, i) => ({ metadata: { name: `s${i}` }, pad: 'p'.repeat(900) }));
      const list = Buffer.from(JSON.stringify({ metadata: {}, items }));
      expect(split([list], 1024).items).to.have.length(50);
      const big = Buffer.from(JSON.stringify({ metadata: {}, items: [...items, { pad: 'p'.repeat(2000) }] }));
      expect(() => split([big], 1024)).to.throw(
        ListItemTooLargeError,
        'listing /api/v1/services: an object longer than 1 KiB, the most this controller reads',
      );
    });

    it('refuses what is not a whole list', () => {
      for (const [text, problem] of [
        ['[]', 'the response is not a JSON object'],
        ['{"items": [{"a": 1}', 'the response ended early'],
        ['{"metadata": {}}', 'the response has no items'],
        ['{"items": [{"a": }]}', 'the response is not valid JSON'],
        ['{"items": []} {}', 'the response has data after its end'],
      ] as const) {
        expect(() => split([Buffer.from(text)]), text).to.throw(ListBodyError, `listing /api/v1/services: ${problem}`);
      }
    });
  });

  describe('a list', () => {
    let server: ApiStandIn;
    let kc: KubeConfig;

    beforeEach(async () => {
      server = await ApiStandIn.start({ bookmarkIntervalMs: 200 });
      kc = new KubeConfig();
      kc.loadFromString(server.kubeconfig());
    });
    afterEach(() => server.stop());

    it('of large objects shrinks its pages to the bound and reads every object', async () => {
      // 30 Services of about 200 KiB: 6 MiB, in pages of at most 1 MiB.
      for (let i = 0; i < 30; i++) server.apply(service(`big-${String(i).padStart(2, '0')}`, '198.18.0.1', 200 << 10));
      for (let i = 0; i < 1500; i++) server.apply(service(`small-${String(i).padStart(4, '0')}`, '198.18.0.2'));
      const listPage = listPager(kc, '/api/v1/services', {}, 1 << 20);
      const pages: Array<{ items: number; bytes: number }> = [];
      const names: string[] = [];
      let token: string | undefined;
      do {
        const page = await listPage(token);
        pages.push({ items: page.items.length, bytes: page.bytes });
        for (const item of page.items) names.push((item as { metadata: { name: string } }).metadata.name);
        token = page.continue;
      } while (token);
      expect(names).to.have.length(1530);
      expect(new Set(names).size).to.equal(1530);
      for (const page of pages) expect(page.bytes).to.be.at.most(1 << 20);
      // The large objects came a few per page; the small ones after them in pages growing back to PAGE_SIZE.
      expect(pages[0]!.items).to.be.below(6);
      expect(Math.max(...pages.map((p) => p.items))).to.equal(PAGE_SIZE);
    });

    it('whose page of one object is over the bound fails, naming the path and the bound', async () => {
      server.apply(service('a', '198.18.0.1'));
      server.apply(service('huge', '198.18.0.1', 2 << 20));
      const listPage = listPager(kc, '/api/v1/services', {}, 1 << 20);
      let error: unknown;
      const names: string[] = [];
      try {
        let token: string | undefined;
        do {
          const page = await listPage(token);
          for (const item of page.items) names.push((item as { metadata: { name: string } }).metadata.name);
          token = page.continue;
        } while (token);
      } catch (err) {
        error = err;
      }
      expect(names, 'the page before it').to.deep.equal(['a']);
      expect(error).to.be.instanceOf(ListPageTooLargeError);
      expect((error as Error).message).to.match(
        /^listing \/api\/v1\/services: a page of one object \(limit=1\) is larger than 1 MiB, the most one page may hold/,
      );
    });
  });

  for (const { version, how } of [
    { version: '1.34' as const, how: 'a WatchList stream' },
    { version: '1.30' as const, how: 'lists from the watch cache' },
  ]) {
    describe(`the Service informer, with the production bounds, built by ${how} (${version})`, () => {
      let server: ApiStandIn;
      let services: Informer<ServiceInfo> | undefined;
      const errors: string[] = [];

      beforeEach(async () => {
        server = await ApiStandIn.start({ bookmarkIntervalMs: 200, serverVersion: version });
        errors.length = 0;
      });
      afterEach(async () => {
        await services?.stop();
        await server.stop();
      });

      function start(): Informer<ServiceInfo> {
        const kc = new KubeConfig();
        kc.loadFromString(server.kubeconfig());
        const caches = createClusterCaches(kc, 'node-1', {
          onError: (_resource, err) => errors.push(err.message),
        });
        services = caches.services;
        services.start();
        return services;
      }
      const oversized = () => service('big', '198.18.0.2', MAX_LIST_PAGE_BYTES + (1 << 20));
      const ipOf = (informer: Informer<ServiceInfo>, name: string) =>
        informer.list().find((s) => s.name === name)?.ingress?.[0]?.ip;
      const lineTooLong = 'watching /api/v1/services: a watch line longer than 16 MiB: the stream is broken';
      const itemTooLarge = 'listing /api/v1/services: an object longer than 16 MiB, the most this controller reads';
      /** How building the cache fails on the object over the bound. */
      const startTooLarge = version === '1.34' ? lineTooLong : itemTooLarge;

      it('fails the start with an object over the bound, retries, and syncs once the object is back to normal size', async () => {
        server.apply(service('a', '198.18.0.1'));
        server.apply(oversized());
        const informer = start();
        await waitFor(() => errors.length >= 2, 'two failed starts');
        expect(errors.slice(0, 2)).to.deep.equal([startTooLarge, startTooLarge]);
        expect(informer.hasSynced()).to.equal(false);
        server.apply(service('big', '198.18.0.3'));
        await informer.waitForSync();
        expect(ipOf(informer, 'a')).to.equal('198.18.0.1');
        expect(ipOf(informer, 'big')).to.equal('198.18.0.3');
        // Never page by page from etcd.
        expect(server.readsByClient().default!.etcdListReads).to.equal(0);
      });

      it('keeps its cache while an object over the bound fails the watch and the rebuild, and catches up after', async () => {
        server.apply(service('a', '198.18.0.1'));
        server.apply(service('big', '198.18.0.2'));
        const informer = start();
        await informer.waitForSync();
        await waitFor(() => server.openWatchCount('Service') === 1, 'an open watch');
        server.apply(oversized());
        // The event is a watch line over the bound (twice: it is in the history the watch resumes
        // from), then building the cache again meets the object.
        await waitFor(() => errors.length >= 3, 'a failed rebuild');
        expect(errors.slice(0, 3)).to.deep.equal([lineTooLong, lineTooLong, startTooLarge]);
        // What the cache held before the object grew: the last rules stay.
        expect(informer.list().map((s) => s.name)).to.have.members(['a', 'big']);
        expect(ipOf(informer, 'big')).to.equal('198.18.0.2');
        server.apply(service('big', '198.18.0.4'));
        await waitFor(() => ipOf(informer, 'big') === '198.18.0.4', 'the object back to normal size');
        await waitFor(() => server.openWatchCount('Service') === 1, 'a watch open again');
        server.apply(service('a', '198.18.0.5'));
        await waitFor(() => ipOf(informer, 'a') === '198.18.0.5', 'a change on the new watch');
        expect(server.readsByClient().default!.etcdListReads).to.equal(0);
      });
    });
  }
});
