// The conntrack clean-up on the kernel: it deletes exactly the entries of the tuples it is given
// (through ctnetlink in the process; or with the command, one tuple at a time or after one listing
// when there are many), only untranslated ones when asked, and reports a missing conntrack command
// without throwing. A listing is read as it comes,
// never buffered: one that never ends (the real command's listing, again and again) is stopped
// once every tuple is found, or at the timeout with memory flat; a line too long fails it.
// In process, each tuple has its own share of a call: a tuple with more entries than its share
// (a tenant's flows to its own address) never keeps another tuple's entries, is reported, and is
// completed by further calls, then by the command. On Linux 6.12 and later a few IPv4 tuples are
// deleted by a filter in the kernel instead (no dump); before, the kernel refuses that message
// and deletes nothing for it, and the dumps do the same work.

import { expect } from 'chai';
import * as dgram from 'node:dgram';
import { once } from 'node:events';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConntrackCleaner, MAX_LISTED_LINE_BYTES } from '../../src/conntrack/conntrack-cleaner.js';
import {
  loadConntrackNetlink,
  type ConntrackLimits,
  type ConntrackNetlink,
} from '../../src/conntrack/conntrack-netlink.js';
import type { StaleTuple } from '../../src/conntrack/stale-tuples.js';
import { NodeNetwork, requireTools, sh } from '../../testbed/node-network.js';
import { linesLogger } from '../support/log-lines.js';

const A = '192.0.2.60';
const B = '192.0.2.61';
const A6 = '2001:db8::60';
const B6 = '2001:db8::61';
/** Source addresses of the flows of one tenant (65,000 flows each at most). */
const SOURCES = ['198.51.100.1', '198.51.100.2'];
const SOURCES6 = ['2001:db8:1::1'];

/** Whether this kernel deletes conntrack entries by a filter: Linux 6.12 and later. */
function kernelDeletesByFilter(): boolean {
  const [major = 0, minor = 0] = sh('uname', ['-r']).trim().split(/[.-]/).map(Number);
  return major > 6 || (major === 6 && minor >= 12);
}

function tuple(externalIp: string, port: number, untranslatedOnly = false): StaleTuple {
  return {
    family: externalIp.includes(':') ? 'ipv6' : 'ipv4',
    externalIp,
    protocol: 'UDP',
    port,
    untranslatedOnly,
    why: 'removed',
  };
}

/** One datagram from a fixed source port: one conntrack entry (nothing listens: it stays unreplied). */
async function flow(address: string, port: number, sourcePort: number): Promise<void> {
  const sock = dgram.createSocket(address.includes(':') ? 'udp6' : 'udp4');
  sock.on('error', () => undefined);
  sock.bind(sourcePort);
  await once(sock, 'listening');
  await new Promise<void>((resolve) => sock.send('x', port, address, () => resolve()));
  sock.close();
}

/**
 * `count` flows to address:port, one datagram each from its own (source address, port): source
 * ports from 1024 up on each of `sources` in turn. A few hundred sockets at a time.
 */
async function manyFlows(address: string, port: number, count: number, sources: readonly string[]): Promise<void> {
  const pairs: Array<[string, number]> = [];
  for (const source of sources) {
    for (let sourcePort = 1024; sourcePort <= 65535 && pairs.length < count; sourcePort++)
      pairs.push([source, sourcePort]);
  }
  if (pairs.length < count) throw new Error(`${count} flows need more source addresses`);
  for (let at = 0; at < pairs.length; at += 256) {
    await Promise.all(
      pairs.slice(at, at + 256).map(async ([source, sourcePort]) => {
        const sock = dgram.createSocket(address.includes(':') ? 'udp6' : 'udp4');
        sock.on('error', () => undefined);
        sock.bind(sourcePort, source);
        await once(sock, 'listening');
        await new Promise<void>((resolve) => sock.send('x', port, address, () => resolve()));
        sock.close();
      }),
    );
  }
}

/** How many UDP entries have address:port as their original destination (a listing of any size). */
function count(address: string, port: number): number {
  const family = address.includes(':') ? 'ipv6' : 'ipv4';
  const listing = `conntrack -L -f ${family} -p udp --orig-dst ${address} --dport ${port} 2>/dev/null | wc -l`;
  return Number(sh('sh', ['-c', listing]).trim());
}

/** A translated entry (as after a DNAT): original destination address:port, reply from 10.96.0.60. */
function translatedEntry(address: string, port: number, sourcePort: number): void {
  const p = String(port);
  const sp = String(sourcePort);
  sh('conntrack', [
    ...['-I', '-p', 'udp', '-s', address, '-d', address, '--sport', sp, '--dport', p],
    ...[
      '-r',
      '10.96.0.60',
      '-q',
      address,
      '--reply-port-src',
      p,
      '--reply-port-dst',
      sp,
      '-t',
      '30',
      '-u',
      'SEEN_REPLY',
    ],
  ]);
}

/** Source ports of the UDP entries whose original destination is address:port. */
function entries(address: string, port: number): number[] {
  const family = address.includes(':') ? 'ipv6' : 'ipv4';
  let out = '';
  try {
    out = sh('conntrack', ['-L', '-f', family, '-p', 'udp', '--orig-dst', address, '--dport', String(port)]);
  } catch {
    return [];
  }
  // The first sport= of a line is the original direction's.
  return [...out.matchAll(/^\S+\s+\d+\s+\d+\s+src=\S+ dst=\S+ sport=(\d+) /gm)].map((m) => Number(m[1]));
}

describe('conntrack clean-up on the kernel', function () {
  const network = new NodeNetwork();
  const logLines: string[] = [];
  const logger = linesLogger(logLines, 'debug');

  before(() => {
    requireTools('conntrack');
    network.setUp();
    for (const address of [A, B, A6, B6, ...SOURCES, ...SOURCES6]) network.bindAddress(address);
    sh(
      'nft',
      ['-f', '-'],
      'table inet ct-on {\n chain c {\n type filter hook output priority 0;\n ct state new counter\n }\n}\n',
    );
  });
  after(() => {
    try {
      sh('nft', ['delete', 'table', 'inet', 'ct-on']);
    } finally {
      network.tearDown();
    }
  });

  /**
   * The cleaner in process, with the addon's bounds (by dumps alone unless `byFilter`); the
   * command, should it run, fails.
   */
  const inProcess = (byFilter = false) =>
    new ConntrackCleaner({ logger, netlink: netlink({ flush: byFilter }), command: '/bin/false' });
  /** The ways the cleaner deletes: the command never runs in process (it is one that fails). */
  const ways: Array<{ name: string; cleaner: () => ConntrackCleaner }> = [
    { name: 'in process, by dumps', cleaner: () => inProcess() },
    { name: 'in process, by a filter where the kernel deletes so', cleaner: () => inProcess(true) },
    { name: 'one tuple at a time', cleaner: () => new ConntrackCleaner({ logger, listAbove: 16 }) },
    { name: 'after one listing', cleaner: () => new ConntrackCleaner({ logger, listAbove: 0 }) },
  ];
  function netlink(limits?: ConntrackLimits): ConntrackNetlink {
    const load = loadConntrackNetlink(undefined, limits);
    if (!load.netlink) throw new Error(`the conntrack addon must be built for kernel tests: ${load.reason}`);
    return load.netlink;
  }

  for (const way of ways) {
    it(`deletes the entries of the given tuples and no others (${way.name})`, async () => {
      sh('conntrack', ['-F']);
      await flow(A, 53, 41001);
      await flow(A, 53, 41002);
      await flow(A, 54, 41003);
      await flow(B, 53, 41004);
      await flow(A6, 53, 41005);
      expect(entries(A, 53)).to.have.members([41001, 41002]);
      const cleaner = way.cleaner();
      const report = await cleaner.clean([tuple(A, 53), tuple(A6, 53), tuple(B, 99)]);
      // By a filter, the kernel does not say how many entries it deleted: the IPv6 one is counted.
      const byFilter = way.name.includes('filter') && kernelDeletesByFilter();
      expect(report).to.include({ tuples: 3, deleted: byFilter ? 1 : 3, failures: 0 });
      expect(report.flushed).to.equal(byFilter ? 2 : undefined);
      expect(entries(A, 53)).to.deep.equal([]);
      expect(entries(A6, 53)).to.deep.equal([]);
      expect(entries(A, 54)).to.deep.equal([41003]);
      expect(entries(B, 53)).to.deep.equal([41004]);
    });
  }

  it('in process by dumps, walks the table once per protocol and port of the tuples, in either family', async () => {
    const dumps = netlink({ flush: false });
    sh('conntrack', ['-F']);
    await flow(A, 53, 41031);
    await flow(B, 53, 41032);
    await flow(A, 54, 41033);
    await flow(B, 54, 41034);
    await flow(A6, 53, 41035);
    await flow(B6, 53, 41036);
    // A moved address: the old one's entries and the new one's untranslated, one port: one walk.
    const moved = await dumps.deleteMatching('ipv4', [tuple(A, 53), tuple(B, 53, true)], 5000);
    expect(moved).to.deep.include({ deleted: 2, dumps: 1 });
    expect(entries(A, 54)).to.deep.equal([41033]);
    expect(entries(B, 54)).to.deep.equal([41034]);
    const twoPorts = await dumps.deleteMatching('ipv4', [tuple(A, 54), tuple(B, 60)], 5000);
    expect(twoPorts).to.deep.include({ deleted: 1, dumps: 2 });
    expect(entries(B, 54)).to.deep.equal([41034]);
    // IPv6 is filtered by protocol and port alone: the address is looked up among the tuples.
    const six = await dumps.deleteMatching('ipv6', [tuple(A6, 53), tuple(B6, 54)], 5000);
    expect(six).to.deep.include({ deleted: 1, dumps: 2 });
    expect(entries(A6, 53)).to.deep.equal([]);
    expect(entries(B6, 53)).to.deep.equal([41036]);
    // What one walk costs, whatever the table holds (docs/operations.md, "Limits and external IPs").
    const buckets = readFileSync('/proc/sys/net/netfilter/nf_conntrack_buckets', 'utf8').trim();
    const started = performance.now();
    expect(await dumps.deleteMatching('ipv4', [tuple(A, 99)], 5000)).to.deep.include({ deleted: 0, dumps: 1 });
    const ms = (performance.now() - started).toFixed(1);
    console.log(`      (one call, one walk of the conntrack table of ${buckets} buckets: ${ms} ms)`);
  });

  it('in process, with more ports than it filters in the kernel one by one, reads the table once and deletes the same', async () => {
    const dumps = netlink({ flush: false });
    sh('conntrack', ['-F']);
    await flow(A, 53, 41021);
    await flow(A, 60, 41022);
    await flow(B, 53, 41023);
    // 80 tuples of 80 ports (past the filtered dumps), two of which have entries.
    const tuples = [tuple(A, 53), tuple(A, 60), ...Array.from({ length: 78 }, (_, i) => tuple(A, 1000 + i))];
    const report = await inProcess().clean(tuples);
    expect(report).to.include({ tuples: 80, deleted: 2, failures: 0 });
    expect(await dumps.deleteMatching('ipv4', tuples, 5000)).to.deep.include({ deleted: 0, dumps: 1 });
    expect(entries(A, 53)).to.deep.equal([]);
    expect(entries(A, 60)).to.deep.equal([]);
    expect(entries(B, 53)).to.deep.equal([41023]);
  });

  it('in process, deletes thousands of entries of one tuple, all acknowledged, without the command', async () => {
    sh('conntrack', ['-F']);
    logLines.length = 0;
    await manyFlows(A, 53, 3000, SOURCES);
    const report = await inProcess().clean([tuple(A, 53)]);
    expect(count(A, 53)).to.equal(0);
    expect(report).to.include({ deleted: 3000, failures: 0 });
    // By a filter (where the kernel does it), in one message.
    await manyFlows(A, 53, 3000, SOURCES);
    const byFilter = await inProcess(true).clean([tuple(A, 53)]);
    expect(count(A, 53)).to.equal(0);
    expect(byFilter).to.include({ deleted: kernelDeletesByFilter() ? 0 : 3000, failures: 0 });
    expect(logLines.filter((l) => l.includes('in process failed'))).to.deep.equal([]);
  });

  it('in process, deletes a few IPv4 tuples by a filter on Linux 6.12 and later, and before it the kernel refuses that and deletes nothing for it', async () => {
    sh('conntrack', ['-F']);
    await flow(A, 53, 41041);
    await flow(A, 53, 41042);
    await flow(A, 54, 41043);
    await flow(B, 53, 41044);
    await flow(B, 54, 41045);
    await flow(A6, 53, 41046);
    translatedEntry(B, 53, 41047);
    // A moved address: the old one's entries, and the new one's untranslated ones.
    const asked = [tuple(A, 53), tuple(B, 53, true)];
    const result = await netlink().deleteMatching('ipv4', asked, 5000);
    if (kernelDeletesByFilter()) {
      expect(result).to.deep.include({ flushed: 2, dumps: 0, deleted: 0, refusesFlush: false });
      expect(result.flushRefused).to.equal(undefined);
    } else {
      // The refusal is learned by the process's first message (this one, or an earlier test's:
      // then it says why no more); the dump then deletes what it would have.
      expect(result).to.deep.include({ flushed: 0, dumps: 1, deleted: 3, refusesFlush: true });
      expect(result.flushRefused).to.be.oneOf([undefined, 'Invalid argument']);
    }
    expect(entries(A, 53)).to.deep.equal([]);
    expect(entries(B, 53), 'the translated entry stays').to.deep.equal([41047]);
    expect(entries(A, 54)).to.deep.equal([41043]);
    expect(entries(B, 54)).to.deep.equal([41045]);
    expect(entries(A6, 53)).to.deep.equal([41046]);
    // Past the few it asks the kernel about, or in IPv6: dumps.
    const many = Array.from({ length: 17 }, (_, i) => tuple(A, 2000 + i));
    expect(await netlink().deleteMatching('ipv4', many, 5000)).to.deep.include({ flushed: 0, dumps: 1 });
    expect(await netlink().deleteMatching('ipv6', [tuple(A6, 54)], 5000)).to.deep.include({ flushed: 0, dumps: 1 });
    // What one call costs either way, on a tuple without entries.
    const time = async (limits: ConntrackLimits) => {
      const started = performance.now();
      await netlink(limits).deleteMatching('ipv4', [tuple(A, 99)], 5000);
      return (performance.now() - started).toFixed(1);
    };
    const buckets = readFileSync('/proc/sys/net/netfilter/nf_conntrack_buckets', 'utf8').trim();
    console.log(
      `      (one call over ${buckets} buckets: by a filter${kernelDeletesByFilter() ? '' : ' (refused, then a dump)'} ${await time({})} ms, by a dump ${await time({ flush: false })} ms)`,
    );
  });

  it('with untranslatedOnly, leaves entries whose reply comes from another address', async () => {
    sh('conntrack', ['-F']);
    await flow(A, 53, 41011);
    // A translated entry: original destination A, reply from 10.96.0.60 (as after a DNAT).
    translatedEntry(A, 53, 41012);
    expect(entries(A, 53)).to.have.members([41011, 41012]);
    for (const way of ways) {
      const report = await way.cleaner().clean([tuple(A, 53, true)]);
      expect(report.failures, way.name).to.equal(0);
      expect(entries(A, 53), way.name).to.deep.equal([41012]);
      await flow(A, 53, 41011);
    }
  });

  describe('a listing larger than any buffer', () => {
    let dir: string;
    /** Tuples to A on ports 20000.., each with one entry; and many other entries beside them. */
    const asked = Array.from({ length: 8 }, (_, i) => tuple(A, 20_000 + i));

    /** A conntrack command whose listing is `prefix`, then the real listing again and again, without end. */
    function endlessConntrack(prefix = ''): string {
      const path = join(dir, 'conntrack');
      writeFileSync(
        path,
        '#!/bin/sh\n' +
          'if [ "$1" = -L ]; then\n' +
          `  ${prefix}\n` +
          '  while conntrack "$@"; do :; done\n' +
          'else\n' +
          '  exec conntrack "$@"\n' +
          'fi\n',
      );
      chmodSync(path, 0o755);
      return path;
    }

    before(async function () {
      this.timeout(120_000);
      dir = mkdtempSync(join(tmpdir(), 'conntrack-endless-'));
      sh('conntrack', ['-F']);
      // 20,000 entries (one socket, as many destination ports): a listing of a few MiB each time.
      const sock = dgram.createSocket('udp4');
      sock.on('error', () => undefined);
      sock.bind(42000);
      await once(sock, 'listening');
      for (let port = 1; port <= 20_000; port++) {
        await new Promise<void>((resolve) => sock.send('x', port, B, () => resolve()));
      }
      sock.close();
    });
    after(() => rmSync(dir, { recursive: true, force: true }));

    beforeEach(async () => {
      for (const [i, t] of asked.entries()) await flow(A, t.port, 43000 + i);
    });

    it('in process, deletes the tuples asked for among 20,000 other entries with one read of the table', async () => {
      const cleaner = inProcess();
      const report = await cleaner.clean(asked);
      expect(report).to.include({ tuples: 8, deleted: 8, failures: 0 });
      for (const t of asked) expect(entries(A, t.port), `port ${t.port}`).to.deep.equal([]);
      expect(entries(B, 20_000)).to.have.length(1);
      expect(entries(B, 1)).to.have.length(1);
    });

    it('stops reading once every tuple asked for is found, and deletes their entries', async () => {
      const cleaner = new ConntrackCleaner({ logger, listAbove: 0, command: endlessConntrack(), timeoutMs: 20_000 });
      const report = await cleaner.clean(asked);
      expect(report).to.include({ tuples: 8, deleted: 8, failures: 0 });
      for (const t of asked) expect(entries(A, t.port), `port ${t.port}`).to.deep.equal([]);
      expect(entries(B, 20_000)).to.have.length(1);
    });

    it('reads a listing that ends only at the timeout with memory flat, then deletes one tuple at a time', async () => {
      // One tuple that has no entry: the listing is read to the timeout.
      const cleaner = new ConntrackCleaner({ logger, listAbove: 0, command: endlessConntrack(), timeoutMs: 6000 });
      global.gc?.();
      const before = process.memoryUsage().rss;
      let peak = before;
      const sampler = setInterval(() => (peak = Math.max(peak, process.memoryUsage().rss)), 20);
      let report;
      try {
        report = await cleaner.clean([...asked, tuple(A, 19_999)]);
      } finally {
        clearInterval(sampler);
      }
      expect(report.failures, 'the listing, timed out').to.equal(1);
      expect(report.deleted).to.equal(8);
      // About 150 MB went by (3 MB per listing, 25 MB/s); buffered, they showed as 470 MiB here.
      expect(peak - before, 'RSS growth').to.be.below(64 << 20);
    });

    it('fails a listing with a line longer than the bound, and deletes one tuple at a time', async () => {
      logLines.length = 0;
      const longLine = `head -c ${MAX_LISTED_LINE_BYTES + 1} /dev/zero | tr '\\0' x; echo`;
      const cleaner = new ConntrackCleaner({
        logger,
        listAbove: 0,
        command: endlessConntrack(longLine),
        timeoutMs: 20_000,
      });
      const report = await cleaner.clean(asked);
      expect(report).to.include({ failures: 1, deleted: 8 });
      expect(logLines.join('\n')).to.include('printed a line longer than 64 KiB, not a conntrack listing');
    });
  });

  it('reports a missing conntrack command without throwing, and logs it once', async () => {
    logLines.length = 0;
    const cleaner = new ConntrackCleaner({ logger, command: '/nonexistent/conntrack' });
    const first = await cleaner.clean([tuple(A, 53), tuple(B, 53)]);
    const second = await cleaner.clean([tuple(A, 53)]);
    expect(first.failures).to.be.at.least(1);
    expect(second.failures).to.equal(1);
    const warnings = logLines.filter((l) => l.includes('install the conntrack package'));
    expect(warnings).to.have.length(1);
  });

  describe('a tuple with more entries than its share of one in-process call (by dumps)', function () {
    this.timeout(180_000);
    let dir: string;
    let command: string;
    let udpTimeout: string;
    /** The arguments of each command the cleaner ran. */
    const commandCalls = () => {
      try {
        return readFileSync(join(dir, 'calls'), 'utf8').trim().split('\n');
      } catch {
        return [];
      }
    };
    /** Log lines that report a truncation. */
    const truncations = () => logLines.filter((l) => l.includes('more than their share of one in-process deletion'));
    /** A cleaner in process with a share of 100 per tuple and 200 a call, `rounds` calls, then `command`. */
    const sharedCleaner = (rounds: number, command: string) =>
      new ConntrackCleaner({
        logger,
        netlink: netlink({ perTarget: 100, total: 200, flush: false }),
        netlinkRounds: rounds,
        command,
      });

    before(() => {
      dir = mkdtempSync(join(tmpdir(), 'conntrack-truncated-'));
      // The real command, recording its arguments.
      command = join(dir, 'conntrack');
      writeFileSync(command, `#!/bin/sh\necho "$@" >> ${join(dir, 'calls')}\nexec conntrack "$@"\n`);
      chmodSync(command, 0o755);
      // Unanswered UDP entries last 30 s: making tens of thousands of them takes a while on a
      // loaded machine (this namespace's setting, put back after).
      udpTimeout = sh('sysctl', ['-n', 'net.netfilter.nf_conntrack_udp_timeout']).trim();
      sh('sysctl', ['-qw', 'net.netfilter.nf_conntrack_udp_timeout=300']);
    });
    after(() => {
      sh('sysctl', ['-qw', `net.netfilter.nf_conntrack_udp_timeout=${udpTimeout}`]);
      rmSync(dir, { recursive: true, force: true });
    });
    beforeEach(() => {
      sh('conntrack', ['-F']);
      rmSync(join(dir, 'calls'), { force: true });
      logLines.length = 0;
    });

    it('deletes every entry of the other tuple whatever the first has, and reports the truncated one', async () => {
      // A share of 100 per tuple, and no command to complete anything: what one call does.
      await manyFlows(A, 53, 1000, SOURCES);
      await manyFlows(B, 53, 5, SOURCES);
      const cleaner = sharedCleaner(1, '/bin/false');
      const report = await cleaner.clean([tuple(A, 53), tuple(B, 53)]);
      expect(entries(B, 53), 'the other tuple').to.deep.equal([]);
      expect(count(A, 53), 'the truncated tuple').to.equal(900);
      expect(report).to.deep.include({ deleted: 105, truncated: { ipv4: 1 } });
      expect(report.failures, 'the command, which fails').to.equal(1);
      expect(truncations()).to.have.length(1);
      expect(truncations()[0]).to.include(`udp ${A}:53 (1000 entries)`).and.not.include(`${B}:53`);
    });

    it('the same in IPv6, where a dump is filtered by protocol and port alone', async () => {
      await manyFlows(A6, 53, 300, SOURCES6);
      await manyFlows(B6, 53, 3, SOURCES6);
      const cleaner = sharedCleaner(1, '/bin/false');
      const report = await cleaner.clean([tuple(A6, 53), tuple(B6, 53)]);
      expect(count(B6, 53), 'the other tuple').to.equal(0);
      expect(count(A6, 53), 'the truncated tuple').to.equal(200);
      expect(report).to.deep.include({ deleted: 103, truncated: { ipv6: 1 } });
      expect(truncations()[0]).to.include(`udp [${A6}]:53 (300 entries)`);
    });

    it('completes the truncated tuple with further calls, then the command', async () => {
      await manyFlows(A, 53, 1000, SOURCES);
      await manyFlows(B, 53, 5, SOURCES);
      const cleaner = sharedCleaner(2, command);
      const report = await cleaner.clean([tuple(A, 53), tuple(B, 53)]);
      expect(entries(B, 53)).to.deep.equal([]);
      expect(entries(A, 53)).to.deep.equal([]);
      // 105 in the first call, 100 in the second, 800 by the command, for the truncated tuple alone.
      expect(report).to.deep.include({ deleted: 1005, failures: 0, truncated: { ipv4: 1 } });
      expect(commandCalls()).to.deep.equal([`-D -f ipv4 -p udp --orig-dst ${A} --dport 53`]);
      expect(truncations()).to.have.length(1);
      expect(truncations()[0]).to.include('"byCommand":1');
    });

    it('at the default bound, deletes 70,000 entries of one tuple and the 5 of another in process', async () => {
      await manyFlows(A, 53, 70_000, SOURCES);
      await manyFlows(B, 53, 5, SOURCES);
      expect(count(A, 53)).to.equal(70_000);
      const cleaner = new ConntrackCleaner({ logger, netlink: netlink({ flush: false }), command, timeoutMs: 30_000 });
      const started = performance.now();
      const report = await cleaner.clean([tuple(A, 53), tuple(B, 53)]);
      const ms = performance.now() - started;
      expect(count(B, 53)).to.equal(0);
      expect(count(A, 53)).to.equal(0);
      // A share of 32,768 each in the first call (A truncated), 65,536 for A alone in the second.
      expect(report).to.deep.include({ deleted: 70_005, failures: 0, truncated: { ipv4: 1 } });
      expect(commandCalls(), 'no command').to.deep.equal([]);
      expect(logLines.filter((l) => l.includes('in process failed'))).to.deep.equal([]);
      expect(truncations()[0]).to.include(`udp ${A}:53 (70000 entries)`);
      console.log(`      (70,005 entries deleted in ${Math.round(ms)} ms)`);
    });
  });
});
