// kube-proxy's mode from its signals, the /proxyMode client against real HTTP servers on loopback
// (good answers, garbage, errors, silence), the monitor's confirmation before a change, and the
// version the monitor reads beside the mode (and what a /metrics that misbehaves does to the mode).

import { expect } from 'chai';
import http from 'node:http';
import net from 'node:net';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import {
  ModeMonitor,
  fetchProxyMode,
  hasIpvsInterface,
  isNonIpvsMode,
  judgeMode,
  type ModeVerdict,
} from '../../src/kubeproxy/mode.js';
import type { BindAddress } from '../../src/http/endpoint.js';
import { linesLogger } from '../support/log-lines.js';
import { closedLoopbackPort, LocalHttpServer } from '../support/local-http-server.js';
import { kubeProxyMetricsText } from '../support/kube-proxy-stand-in.js';

describe('kube-proxy mode: judging the signals', () => {
  it('the /proxyMode answer decides when there is one, even against a leftover kube-ipvs0', () => {
    expect(judgeMode({ live: 'nftables', ipvsInterface: true, configured: 'ipvs' })).to.include({
      mode: 'nftables',
      source: 'proxyMode',
    });
    expect(judgeMode({ live: 'ipvs', ipvsInterface: false, configured: 'nftables' })).to.include({
      mode: 'ipvs',
      source: 'proxyMode',
    });
  });
  it('without an answer, kube-ipvs0 says IPVS (IPVS still answers in the kernel while kube-proxy restarts)', () => {
    expect(judgeMode({ liveProblem: 'connection refused', ipvsInterface: true, configured: 'nftables' })).to.include({
      mode: 'ipvs',
      source: 'kube-ipvs0',
    });
  });
  it('without an answer or kube-ipvs0, the configured mode decides; with none of them, unknown', () => {
    expect(judgeMode({ ipvsInterface: false, configured: 'iptables' })).to.include({
      mode: 'iptables',
      source: 'kube-proxy-config',
    });
    const unknown = judgeMode({ liveProblem: 'connection refused', ipvsInterface: false });
    expect(unknown).to.include({ mode: 'unknown', source: 'none' });
    expect(unknown.detail).to.include('connection refused');
  });
  it('only iptables and nftables are positively not IPVS', () => {
    expect(
      ['ipvs', 'iptables', 'nftables', 'kernelspace', 'unknown'].filter((m) => isNonIpvsMode(m as never)),
    ).to.deep.equal(['iptables', 'nftables']);
  });
  it('finds kube-ipvs0 in /proc/net/dev', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'procnet-'));
    try {
      const header = 'Inter-|   Receive\n face |bytes\n';
      writeFileSync(join(dir, 'with'), `${header}    lo: 0 0\nkube-ipvs0: 0 0\n`);
      writeFileSync(join(dir, 'without'), `${header}    lo: 0 0\n  kube-ipvs01x: 0\n`);
      expect(await hasIpvsInterface(join(dir, 'with'))).to.equal(true);
      expect(await hasIpvsInterface(join(dir, 'without'))).to.equal(false);
      expect(await hasIpvsInterface(join(dir, 'absent'))).to.equal(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

describe('kube-proxy mode: GET /proxyMode', function () {
  let server: LocalHttpServer;
  before(async () => (server = await LocalHttpServer.start((_req, res) => res.end('ipvs'))));
  after(() => server.stop());

  it('reads each mode, with or without a newline, in any case', async () => {
    for (const [body, mode] of [
      ['ipvs', 'ipvs'],
      ['nftables\n', 'nftables'],
      ['IPTABLES', 'iptables'],
    ] as const) {
      server.handler = (_req, res) => res.end(body);
      expect(await fetchProxyMode(server.address, 1000)).to.deep.equal({ live: mode });
    }
  });

  it('garbage, errors, endless answers and silence are "no answer", within the timeout', async () => {
    const cases: Array<[(res: http.ServerResponse) => void, RegExp]> = [
      [(res) => res.end('<html>hello</html>'), /no mode/],
      [(res) => res.end(''), /no mode/],
      [(res) => res.end('unknown'), /no mode/],
      [(res) => res.writeHead(500).end('ipvs'), /HTTP 500/],
      [(res) => res.writeHead(404).end(), /HTTP 404/],
      [(res) => res.end('x'.repeat(100_000)), /too long/],
      [(res) => res.end(Buffer.from([0xff, 0xfe, 0x00, 0x01])), /no mode/],
      [() => undefined, /no answer within 300ms/], // accepts and never answers
      [(res) => res.socket?.destroy(), /ECONNRESET|socket hang up/],
      [
        (res) => {
          res.writeHead(200);
          res.write('ipv'); // then stalls mid-body
        },
        /no answer within 300ms/,
      ],
    ];
    for (const [behaviour, problem] of cases) {
      server.handler = (_req, res) => behaviour(res);
      const started = Date.now();
      const r = await fetchProxyMode(server.address, 300);
      expect(r.live, String(behaviour)).to.equal(undefined);
      expect(r.liveProblem).to.match(problem);
      expect(Date.now() - started).to.be.below(5000); // bounded by the timeout, generously
    }
  });

  it('nothing listening is "connection refused"', async () => {
    const port = await closedLoopbackPort();
    expect(await fetchProxyMode({ host: '127.0.0.1', port }, 1000)).to.deep.equal({
      liveProblem: 'connection refused',
    });
  });
});

describe('kube-proxy mode: the monitor', function () {
  let server: LocalHttpServer;
  before(async () => (server = await LocalHttpServer.start((_req, res) => res.end('ipvs'))));
  after(() => server.stop());

  it('takes the first look at once, and a new mode only after it was seen twice in a row', async () => {
    const changes: ModeVerdict[] = [];
    let answer = 'ipvs';
    server.handler = (_req, res) => res.end(answer);
    let polls = 0;
    const counting = server.handler;
    server.handler = (req, res) => {
      polls++;
      counting(req, res);
    };
    const monitor = new ModeMonitor({
      metricsAddress: () => server.address,
      intervalMs: 30,
      confirmations: 2,
      timeoutMs: 500,
      configuredMode: () => undefined,
      logger: pino({ level: 'silent' }),
      onChange: (v) => changes.push(v),
    });
    try {
      expect((await monitor.start()).mode).to.equal('ipvs');
      expect(changes.map((c) => c.mode)).to.deep.equal(['ipvs']);

      // One odd answer between good ones (a flap) changes nothing.
      answer = 'nftables';
      const at = polls;
      while (polls < at + 1) await sleep(5);
      answer = 'ipvs';
      await sleep(200);
      expect(changes.map((c) => c.mode)).to.deep.equal(['ipvs']);

      answer = 'nftables';
      for (let i = 0; i < 200 && changes.length < 2; i++) await sleep(10);
      expect(changes.map((c) => c.mode)).to.deep.equal(['ipvs', 'nftables']);
      expect(monitor.current).to.include({ mode: 'nftables', source: 'proxyMode' });
    } finally {
      await monitor.stop();
    }
  });
});

describe("kube-proxy mode: the monitor and kube-proxy's version", function () {
  /** kube-proxy's metrics address: /proxyMode and /metrics answered as the test sets them. */
  let mode: string | undefined;
  let version: string | undefined;
  let metrics: (res: http.ServerResponse) => void;
  let server: http.Server;
  let address: BindAddress;
  let metricsReads = 0;
  before(async () => {
    server = http.createServer((req, res) => {
      if (mode === undefined) return void res.writeHead(503).end(); // restarting
      if (req.url === '/proxyMode') return void res.end(mode);
      if (req.url !== '/metrics') return void res.writeHead(404).end();
      metricsReads++;
      metrics(res);
    });
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    address = { host: '127.0.0.1', port: (server.address() as net.AddressInfo).port };
  });
  after(async () => {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  });
  beforeEach(() => {
    metrics = (res) => res.end(kubeProxyMetricsText(version!));
    metricsReads = 0;
  });

  const lines: string[] = [];
  const logged = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  function monitor(changes: ModeVerdict[], configured?: string, versionIntervalMs = 60_000): ModeMonitor {
    lines.length = 0;
    return new ModeMonitor({
      metricsAddress: () => address,
      intervalMs: 30,
      confirmations: 2,
      timeoutMs: 500,
      configuredMode: () => configured,
      versionIntervalMs,
      logger: linesLogger(lines),
      onChange: (v) => changes.push(v),
    });
  }
  async function until(what: string, check: () => boolean): Promise<void> {
    for (let i = 0; i < 500 && !check(); i++) await sleep(10);
    expect(check(), what).to.equal(true);
  }

  it('the first look carries the version; a bug of that mode and version is logged once, a fixed version clears it at once', async () => {
    mode = 'nftables';
    version = 'v1.33.2';
    const changes: ModeVerdict[] = [];
    const m = monitor(changes, undefined, 100);
    try {
      const first = await m.start();
      expect(first).to.include({ mode: 'nftables', source: 'proxyMode', version: 'v1.33.2' });
      expect(first.versionProblem).to.equal(undefined);
      const detected = logged().find((l) => l.msg === 'Detected the kube-proxy mode');
      expect(detected).to.include({ mode: 'nftables', version: 'v1.33.2' });
      await until('the version read again', () => metricsReads >= 3);
      const bugs = logged().filter((l) => l.msg === 'Known kube-proxy bug breaks traffic to external addresses');
      expect(bugs, 'logged once, not per read').to.have.lengthOf(1);
      expect(bugs[0]).to.include({
        level: 40,
        issue: 'kubernetes#131765',
        kubeProxyMode: 'nftables',
        kubeProxyVersion: 'v1.33.2',
      });
      expect(String(bugs[0]!.detail)).to.match(/^kube-proxy v1\.33\.2 has a known bug \(kubernetes#131765\)/);
      expect(changes.map((c) => c.version)).to.deep.equal(['v1.33.2']);

      version = 'v1.33.6'; // an upgrade seen at the next periodic read: one look is enough
      await until('the new version reported', () => changes.length === 2);
      expect(changes[1]).to.include({ mode: 'nftables', version: 'v1.33.6' });
      expect(logged().filter((l) => l.msg === 'No longer reporting the known kube-proxy bug')).to.have.lengthOf(1);
      expect(logged().filter((l) => l.msg === 'Detected the kube-proxy mode')[1]).to.include({
        version: 'v1.33.6',
        previousVersion: 'v1.33.2',
      });
    } finally {
      await m.stop();
    }
  });

  it('keeps the version while kube-proxy does not answer, and reads it at once when kube-proxy answers again', async () => {
    mode = 'nftables';
    version = 'v1.33.2';
    const changes: ModeVerdict[] = [];
    const m = monitor(changes, 'nftables'); // the file says nftables: the mode holds while kube-proxy restarts
    try {
      await m.start();
      mode = undefined;
      await until('a look without an answer', () => m.current.source === 'kube-proxy-config');
      expect(m.current).to.include({ mode: 'nftables', version: 'v1.33.2' });
      expect(changes, 'nothing changed for the controller').to.have.lengthOf(1);

      const reads = metricsReads;
      version = 'v1.34.1';
      mode = 'nftables'; // restarted with another build: read at once, not a minute later
      await until('the new build reported', () => changes.length === 2);
      expect(changes[1]).to.include({ mode: 'nftables', source: 'proxyMode', version: 'v1.34.1' });
      expect(metricsReads).to.equal(reads + 1);
    } finally {
      await m.stop();
    }
  });

  it('a /metrics that fails, stalls or lies changes nothing about the mode', async () => {
    mode = 'ipvs';
    const cases: Array<[(res: http.ServerResponse) => void, RegExp]> = [
      [(res) => res.writeHead(500).end(), /^\/metrics: HTTP 500$/],
      [() => undefined, /^\/metrics: no answer within 500ms$/],
      [(res) => res.end('kubernetes_build_info{git_version="v1.33.2\\"; rm -rf /"} 1\n'), /carries no version/],
      [(res) => res.end('x'.repeat(100_000)), /^\/metrics: no kubernetes_build_info$/],
    ];
    for (const [behaviour, problem] of cases) {
      metrics = behaviour;
      const changes: ModeVerdict[] = [];
      const m = monitor(changes);
      try {
        const first = await m.start();
        expect(first, String(behaviour)).to.include({ mode: 'ipvs', source: 'proxyMode' });
        expect(first.version).to.equal(undefined);
        expect(first.versionProblem).to.match(problem);
        expect(logged().find((l) => l.msg === 'Detected the kube-proxy mode')).to.include({ version: 'unknown' });
      } finally {
        await m.stop();
      }
    }
  });

  it('--dry-run looks once, with the version', async () => {
    mode = 'nftables';
    version = 'v1.32.7';
    expect(await ModeMonitor.look({ metricsAddress: address, timeoutMs: 500, version: true })).to.include({
      mode: 'nftables',
      version: 'v1.32.7',
    });
    mode = undefined;
    expect(await ModeMonitor.look({ metricsAddress: address, timeoutMs: 500, version: true })).to.include({
      versionProblem: '/proxyMode gives no mode',
    });
  });
});
