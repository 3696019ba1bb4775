// The streaming watch request (src/kube/watch.ts) over real HTTPS: credentials and TLS from the
// kubeconfig, lines split anywhere, lines that are not JSON, an oversized line, HTTP error
// statuses, the ways a connection ends, and an abort that leaves nothing to hold the process up.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { setTimeout as sleep } from 'node:timers/promises';
import { fileURLToPath } from 'node:url';
import { KubeConfig } from '@kubernetes/client-node';
import { expect } from 'chai';
import {
  LineSplitter,
  MAX_WATCH_LINE_BYTES,
  startWatch,
  type WatchStreamError,
  type WatchStreamHandlers,
} from '../../src/kube/watch.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { makeTlsFixture, RawApiServer, type TlsFixture } from '../support/raw-api.js';
import { waitFor as waitUntil } from '../support/eventually.js';

const waitFor = (cond: () => boolean, what: string, ms = 20_000) => waitUntil(cond, what, ms);

/** Everything a watch reported, and a promise of its end. */
function record() {
  const seen = {
    opened: 0,
    values: [] as unknown[],
    undecodable: [] as string[],
    ended: undefined as { err?: WatchStreamError } | undefined,
  };
  const handlers: WatchStreamHandlers = {
    onOpen: () => seen.opened++,
    onValue: (v) => seen.values.push(v),
    onUndecodable: (p) => seen.undecodable.push(p),
    onEnd: (err) => {
      if (seen.ended) throw new Error('onEnd called twice');
      seen.ended = { err };
    },
  };
  return { seen, handlers, ended: () => waitFor(() => seen.ended !== undefined, 'the end of the watch') };
}

const utf8 = (s: string) => Buffer.from(s, 'utf8');

describe('LineSplitter', () => {
  it('yields the same lines wherever the chunks are cut, inside multi-byte characters too', () => {
    const lines = ['{"name":"café"}', '', '{"note":"日本語 🙂 ü"}', 'not json é'];
    const bytes = utf8(lines.join('\n') + '\n');
    let cuts = 0;
    for (let i = 0; i <= bytes.length; i++) {
      for (let j = i; j <= bytes.length; j++) {
        const splitter = new LineSplitter();
        const out: string[] = [];
        for (const chunk of [bytes.subarray(0, i), bytes.subarray(i, j), bytes.subarray(j)]) {
          expect(splitter.push(chunk, (l) => void out.push(l))).to.equal(true);
        }
        expect(out, `cut at ${i} and ${j}`).to.deep.equal(lines);
        expect(splitter.end()).to.equal('');
        cuts++;
      }
    }
    expect(cuts).to.be.greaterThan(1000);
  });

  it('takes a line of exactly its cap and refuses one byte more, even before its newline', () => {
    const ok = new LineSplitter(8);
    const out: string[] = [];
    expect(ok.push(utf8('abcd'), (l) => void out.push(l))).to.equal(true);
    expect(ok.push(utf8('efgh\nxy'), (l) => void out.push(l))).to.equal(true);
    expect(out).to.deep.equal(['abcdefgh']);
    expect(ok.end()).to.equal('xy');

    const tooLong = new LineSplitter(8);
    expect(tooLong.push(utf8('abcdefg'), () => undefined)).to.equal(true);
    expect(tooLong.push(utf8('hi'), () => undefined)).to.equal(false);
    // Counted in bytes, not characters: four 3-byte characters are 12 bytes.
    expect(new LineSplitter(8).push(utf8('日本語日\n'), () => undefined)).to.equal(false);
  });

  it('stops handing lines over when told to', () => {
    const splitter = new LineSplitter();
    const out: string[] = [];
    splitter.push(utf8('a\nb\nc\n'), (l) => {
      out.push(l);
      return l !== 'b';
    });
    expect(out).to.deep.equal(['a', 'b']);
  });
});

describe('streaming watch over HTTPS', function () {
  this.timeout(60_000);
  let tls: TlsFixture;
  let server: RawApiServer;
  const aborts: Array<() => void> = [];

  before(async () => {
    tls = await makeTlsFixture();
  });
  beforeEach(async () => {
    server = await RawApiServer.start(tls);
  });
  afterEach(async () => {
    for (const abort of aborts.splice(0)) abort();
    await server.stop();
  });

  function kubeConfig(user: { token?: string; clientCert?: boolean } = { token: 'tok' }, ca?: string): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromOptions(server.kubeconfigOptions(user, ca));
    return kc;
  }

  function watch(kc: KubeConfig, query: Record<string, string | number | boolean> = {}) {
    const r = record();
    aborts.push(startWatch(kc, '/api/v1/services', query, r.handlers));
    return r;
  }

  const stream = (write: (res: import('node:http').ServerResponse) => unknown) => {
    server.handler = (_req, res) => {
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.flushHeaders();
      res.socket?.setNoDelay(true);
      void write(res);
    };
  };

  it("sends the kubeconfig's bearer token and client certificate, trusts its CA, and asks for a watch", async () => {
    stream((res) => res.end('{"type":"BOOKMARK"}\n'));
    const w = watch(kubeConfig({ token: 'secret-token', clientCert: true }), {
      resourceVersion: '42',
      timeoutSeconds: 300,
      allowWatchBookmarks: true,
    });
    await w.ended();
    expect(w.seen.ended?.err).to.equal(undefined);
    expect(w.seen.opened).to.equal(1);
    expect(w.seen.values).to.deep.equal([{ type: 'BOOKMARK' }]);
    const [req] = server.requests;
    expect(req?.headers.authorization).to.equal('Bearer secret-token');
    expect(req?.clientCN).to.equal('watch-client');
    expect(req?.clientAuthorized, 'a certificate the CA signed').to.equal(true);
    expect(req?.url.pathname).to.equal('/api/v1/services');
    expect(Object.fromEntries(req!.url.searchParams)).to.deep.equal({
      watch: 'true',
      resourceVersion: '42',
      timeoutSeconds: '300',
      allowWatchBookmarks: 'true',
    });
  });

  it("refuses a server that a CA other than the kubeconfig's signed", async () => {
    stream((res) => res.end('{}\n'));
    const w = watch(kubeConfig({ token: 't' }, tls.otherCaPem));
    await w.ended();
    expect(w.seen.ended?.err?.message).to.match(/certificate/);
    expect(w.seen.opened).to.equal(0);
    expect(w.seen.values).to.deep.equal([]);
  });

  it('joins lines written a byte at a time, multi-byte characters included', async () => {
    const events = [
      { type: 'ADDED', object: { metadata: { name: 'café-日本-🙂' } } },
      { type: 'BOOKMARK', object: { metadata: { resourceVersion: '7' } } },
    ];
    const body = utf8(events.map((e) => JSON.stringify(e) + '\n').join(''));
    stream(async (res) => {
      for (const byte of body) {
        res.write(Buffer.from([byte]));
        await new Promise((r) => setImmediate(r));
      }
      res.end();
    });
    const w = watch(kubeConfig());
    await w.ended();
    expect(w.seen.ended?.err).to.equal(undefined);
    expect(w.seen.values).to.deep.equal(events);
    expect(w.seen.undecodable).to.deep.equal([]);
  });

  it('reports each line that is not JSON and goes on with the next; blank lines are skipped', async () => {
    stream((res) => res.end('this is not JSON\n\r\n\n{"type":"ADDED","object":\n{"type":"BOOKMARK"}\n'));
    const w = watch(kubeConfig());
    await w.ended();
    expect(w.seen.undecodable).to.have.length(2);
    expect(w.seen.undecodable[0]).to.match(/^not JSON: "this is not JSON"$/);
    expect(w.seen.undecodable[1]).to.match(/^not JSON: /);
    expect(w.seen.values).to.deep.equal([{ type: 'BOOKMARK' }]);
  });

  it('hands over a last line that lacks its newline when the server ends the stream', async () => {
    stream((res) => res.end('{"a":1}\n{"b":2}'));
    const w = watch(kubeConfig());
    await w.ended();
    expect(w.seen.ended?.err).to.equal(undefined);
    expect(w.seen.values).to.deep.equal([{ a: 1 }, { b: 2 }]);
  });

  it(`takes a line of ${MAX_WATCH_LINE_BYTES >> 20} MiB and ends the stream at a longer one`, async () => {
    const atCap = '"' + 'x'.repeat(MAX_WATCH_LINE_BYTES - 2) + '"';
    stream(async (res) => {
      res.write(atCap + '\n');
      // Never ended by a newline: the watch must give up before the server stops writing.
      const block = 'y'.repeat(1 << 20);
      for (let i = 0; i < 32 && !res.destroyed; i++) {
        if (!res.write(block)) await once(res, 'drain').catch(() => undefined);
      }
    });
    const w = watch(kubeConfig());
    await w.ended();
    expect(w.seen.values).to.have.length(1);
    expect((w.seen.values[0] as string).length).to.equal(MAX_WATCH_LINE_BYTES - 2);
    expect(w.seen.ended?.err?.message).to.match(/a watch line longer than 16 MiB: the stream is broken/);
    await waitFor(() => server.sockets.size === 0, 'the connection to be closed');
  });

  for (const [code, body, message] of [
    [
      410,
      '{"kind":"Status","apiVersion":"v1","status":"Failure","message":"too old resource version: 3 (9)","reason":"Expired","code":410}',
      'watching /api/v1/services: too old resource version: 3 (9)',
    ],
    [
      403,
      '{"kind":"Status","apiVersion":"v1","status":"Failure","message":"services is forbidden: User \\"x\\" cannot watch resource \\"services\\"","reason":"Forbidden","code":403}',
      'watching /api/v1/services: services is forbidden: User "x" cannot watch resource "services"',
    ],
    [500, '<html>oops</html>', 'watching /api/v1/services: HTTP 500'],
  ] as const) {
    it(`ends a watch answered with HTTP ${code} with the status and the server's message`, async () => {
      server.handler = (_req, res) => res.writeHead(code, { 'Content-Type': 'application/json' }).end(body);
      const w = watch(kubeConfig());
      await w.ended();
      expect(w.seen.opened).to.equal(0);
      expect(w.seen.ended?.err?.statusCode).to.equal(code);
      expect(w.seen.ended?.err?.message).to.equal(message);
    });
  }

  it('ends with an error when the connection is reset or cut in the middle of the stream', async () => {
    for (const cut of ['reset', 'close'] as const) {
      stream((res) => {
        res.write('{"type":"BOOKMARK"}\n{"type":"ADD');
        setImmediate(() => (cut === 'reset' ? server.resetConnections() : res.socket?.destroy()));
      });
      const w = watch(kubeConfig());
      await w.ended();
      expect(w.seen.values, cut).to.deep.equal([{ type: 'BOOKMARK' }]);
      expect(w.seen.undecodable, cut).to.deep.equal([]);
      expect(w.seen.ended?.err?.message, cut).to.match(/closed before the stream ended|stream failed|socket hang up/);
    }
  });

  it("a kubeconfig without credentials gets the API stand-in's 401 with its message", async () => {
    const api = await ApiStandIn.start();
    try {
      const kc = new KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: 'c', server: api.url, caData: Buffer.from(api.caPem).toString('base64') }],
        users: [{ name: 'nobody' }],
        contexts: [{ name: 'x', cluster: 'c', user: 'nobody' }],
        currentContext: 'x',
      });
      const w = watch(kc);
      await w.ended();
      expect(w.seen.ended?.err?.statusCode).to.equal(401);
      expect(w.seen.ended?.err?.message).to.equal('watching /api/v1/services: Unauthorized');
    } finally {
      await api.stop();
    }
  });

  it('after abort, calls no handler and holds neither a socket nor a timer', async function () {
    // Lines keep coming after the abort; the child must neither see them nor stay alive.
    server.handler = (_req, res) => {
      res.writeHead(200);
      res.flushHeaders();
      const timer = setInterval(() => res.write('{"type":"BOOKMARK"}\n'), 20);
      res.on('close', () => clearInterval(timer));
    };
    const watchModule = fileURLToPath(new URL('../../src/kube/watch.js', import.meta.url));
    const script = `
      import { KubeConfig } from '@kubernetes/client-node';
      const { startWatch } = await import(${JSON.stringify(watchModule)});
      const kc = new KubeConfig();
      kc.loadFromOptions(JSON.parse(process.env.KC));
      let aborted = false;
      const late = () => { if (aborted) { console.log('handler called after abort'); process.exitCode = 3; } };
      // One aborted before it connects, one after its first line.
      const early = startWatch(kc, '/api/v1/services', {}, { onOpen: late, onValue: late, onUndecodable: late, onEnd: late });
      early();
      const abort = startWatch(kc, '/api/v1/services', {}, {
        onOpen: late, onUndecodable: late, onEnd: late,
        onValue: () => {
          late();
          if (aborted) return;
          aborted = true;
          abort();
          console.log('aborted');
          // Not holding the process up itself: it only says what does, if anything does.
          setTimeout(() => console.log('still held by ' + process.getActiveResourcesInfo().join(',')), 3000).unref();
        },
      });
      process.on('exit', () => console.log('exited'));
    `;
    const child = spawn(process.execPath, ['--input-type=module', '-e', script], {
      cwd: fileURLToPath(new URL('../../../', import.meta.url)),
      env: { ...process.env, KC: JSON.stringify(server.kubeconfigOptions({ token: 't' })) },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    try {
      const [code] = (await Promise.race([once(child, 'exit'), sleep(20_000).then(() => ['still running'])])) as [
        unknown,
      ];
      expect(out).to.equal('aborted\nexited\n');
      expect(code, 'exited on its own, with nothing left to do').to.equal(0);
    } finally {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill('SIGKILL');
        await once(child, 'exit');
      }
    }
  });
});
