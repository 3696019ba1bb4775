// The cleaner's in-process path: every tuple of a family goes to ctnetlink in one call, and a
// family whose call fails goes to the conntrack command instead (said once per run). A tuple a
// call truncates (more entries than its share) is counted, logged, and completed: by further
// calls with the truncated tuples alone, then by the command. The netlink side itself is proven
// on the kernel (test/kernel/conntrack-cleaner.test.ts).

import { expect } from 'chai';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConntrackCleaner } from '../../src/conntrack/conntrack-cleaner.js';
import type { ConntrackNetlink, NetlinkDeletion } from '../../src/conntrack/conntrack-netlink.js';
import type { StaleTuple } from '../../src/conntrack/stale-tuples.js';
import type { Family } from '../../src/model/types.js';
import { linesLogger } from '../support/log-lines.js';

function tuple(externalIp: string, port: number): StaleTuple {
  const family = externalIp.includes(':') ? 'ipv6' : 'ipv4';
  return { family, externalIp, protocol: 'UDP', port, untranslatedOnly: false, why: 'removed' };
}

/** A netlink client that records its calls, and fails for the families in `failing`. */
function recordingNetlink(failing: Family[] = []) {
  const calls: Array<{ family: Family; ports: number[] }> = [];
  const netlink: ConntrackNetlink = {
    deleteMatching(family, tuples) {
      calls.push({ family, ports: tuples.map((t) => t.port) });
      if (failing.includes(family)) return Promise.reject(new Error('Operation not permitted'));
      return Promise.resolve({ deleted: tuples.length, dumps: 1, flushed: 0, truncated: [] });
    },
  };
  return { netlink, calls };
}

/**
 * A netlink client over a table of entries per tuple (by port) that deletes, per call, at most
 * `share` entries of each tuple, and says which it truncated, as the addon does.
 */
function boundedNetlink(entries: Map<number, number>, share: number) {
  const calls: number[][] = [];
  const netlink: ConntrackNetlink = {
    deleteMatching(_family, tuples) {
      calls.push(tuples.map((t) => t.port));
      const result: NetlinkDeletion = { deleted: 0, dumps: 1, flushed: 0, truncated: [] };
      for (const t of tuples) {
        const matched = entries.get(t.port) ?? 0;
        const deleted = Math.min(matched, share);
        entries.set(t.port, matched - deleted);
        result.deleted += deleted;
        if (matched > share) result.truncated.push({ tuple: t, matched, deleted });
      }
      return Promise.resolve(result);
    },
  };
  return { netlink, calls };
}

describe('conntrack clean-up in process', () => {
  let dir: string;
  let command: string;
  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'conntrack-cmd-'));
    command = join(dir, 'conntrack');
    // A conntrack command that records its arguments and deletes one entry each time.
    writeFileSync(
      command,
      `#!/bin/sh\necho "$@" >> ${join(dir, 'calls')}\necho "1 flow entries have been deleted." >&2\n`,
    );
    chmodSync(command, 0o755);
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));
  const commandCalls = () => {
    try {
      return readFileSync(join(dir, 'calls'), 'utf8').trim().split('\n');
    } catch {
      return [];
    }
  };

  /**
   * Cleans port 53, a tenant's 1,000 flows, and 54, another Service's 3, through boundedNetlink
   * with `share`, in `netlinkRounds` calls (the cleaner's default when not given). `logged`: the
   * log lines that report a truncation.
   */
  async function cleanTenantFlows(share: number, netlinkRounds?: number) {
    const entries = new Map([
      [53, 1000],
      [54, 3],
    ]);
    const { netlink, calls } = boundedNetlink(entries, share);
    const lines: string[] = [];
    const cleaner = new ConntrackCleaner({
      logger: linesLogger(lines, 'debug'),
      netlink,
      command,
      ...(netlinkRounds === undefined ? {} : { netlinkRounds }),
    });
    const report = await cleaner.clean([tuple('192.0.2.1', 53), tuple('192.0.2.1', 54)]);
    const logged = lines.filter((l) => l.includes('more than their share of one in-process deletion'));
    return { entries, calls, report, logged };
  }

  it('hands each family its tuples in one call, and runs no command', async () => {
    const { netlink, calls } = recordingNetlink();
    const lines: string[] = [];
    const cleaner = new ConntrackCleaner({ logger: linesLogger(lines, 'debug'), netlink, command });
    const report = await cleaner.clean([tuple('192.0.2.1', 53), tuple('2001:db8::1', 53), tuple('192.0.2.2', 54)]);
    expect(calls).to.deep.equal([
      { family: 'ipv4', ports: [53, 54] },
      { family: 'ipv6', ports: [53] },
    ]);
    expect(report).to.include({ tuples: 3, deleted: 3, failures: 0 });
    expect(commandCalls()).to.deep.equal([]);
  });

  it('gives a family whose call failed to the command, and says so once', async () => {
    const { netlink } = recordingNetlink(['ipv6']);
    const lines: string[] = [];
    const cleaner = new ConntrackCleaner({ logger: linesLogger(lines, 'debug'), netlink, command });
    for (let i = 0; i < 2; i++) {
      const report = await cleaner.clean([tuple('192.0.2.1', 53), tuple('2001:db8::1', 53)]);
      expect(report).to.include({ tuples: 2, deleted: 2, failures: 0 });
    }
    expect(commandCalls()).to.deep.equal([
      '-D -f ipv6 -p udp --orig-dst 2001:db8::1 --dport 53',
      '-D -f ipv6 -p udp --orig-dst 2001:db8::1 --dport 53',
    ]);
    const warnings = lines.filter((l) => l.includes('Deleting conntrack entries in process failed'));
    expect(warnings).to.have.length(1);
    expect(warnings[0]).to.include('Operation not permitted');
  });

  it('completes a truncated tuple with further calls of it alone, and counts and logs it once', async () => {
    const { entries, calls, report, logged } = await cleanTenantFlows(400);
    expect(calls).to.deep.equal([[53, 54], [53], [53]]);
    expect(report).to.deep.include({ tuples: 2, deleted: 1003, failures: 0, truncated: { ipv4: 1 } });
    expect([...entries.values()]).to.deep.equal([0, 0]);
    expect(commandCalls()).to.deep.equal([]);
    expect(logged).to.have.length(1);
    expect(logged[0]).to.include('udp 192.0.2.1:53 (1000 entries)').and.not.include(':54');
    expect(logged[0]).to.include('"byCommand":0');
  });

  it('gives what a truncated tuple has left after the rounds to the command', async () => {
    const { calls, report, logged } = await cleanTenantFlows(100, 2);
    expect(calls).to.deep.equal([[53, 54], [53]]);
    // 103 + 100 in process, then the command (which says it deleted 1).
    expect(report).to.deep.include({ deleted: 204, failures: 0, truncated: { ipv4: 1 } });
    expect(commandCalls()).to.deep.equal(['-D -f ipv4 -p udp --orig-dst 192.0.2.1 --dport 53']);
    expect(logged).to.have.length(1);
    expect(logged[0]).to.include('"byCommand":1');
  });

  it('reports no truncation when every tuple fits its share', async () => {
    const { netlink } = boundedNetlink(new Map([[53, 5]]), 100);
    const lines: string[] = [];
    const report = await new ConntrackCleaner({ logger: linesLogger(lines, 'debug'), netlink, command }).clean([
      tuple('192.0.2.1', 53),
    ]);
    expect(report.truncated).to.equal(undefined);
    expect(lines.filter((l) => l.includes('more than their share'))).to.deep.equal([]);
  });

  it('counts the tuples the kernel deleted by a filter, runs no command, and says once that a kernel refused it', async () => {
    const flushing: ConntrackNetlink = {
      deleteMatching: (_family, tuples) =>
        Promise.resolve({ deleted: 0, dumps: 0, flushed: tuples.length, truncated: [] }),
    };
    const refusing: ConntrackNetlink = {
      deleteMatching: (_family, tuples) =>
        Promise.resolve({
          deleted: tuples.length,
          dumps: 1,
          flushed: 0,
          flushRefused: 'Invalid argument',
          truncated: [],
        }),
    };
    const lines: string[] = [];
    const flushed = await new ConntrackCleaner({
      logger: linesLogger(lines, 'debug'),
      netlink: flushing,
      command,
    }).clean([tuple('192.0.2.1', 53), tuple('192.0.2.2', 53)]);
    expect(flushed).to.include({ tuples: 2, deleted: 0, flushed: 2, failures: 0 });
    const refusedBy = new ConntrackCleaner({ logger: linesLogger(lines, 'debug'), netlink: refusing, command });
    for (let i = 0; i < 2; i++) {
      const report = await refusedBy.clean([tuple('192.0.2.1', 53)]);
      expect(report).to.include({ tuples: 1, deleted: 1, failures: 0 });
      expect(report.flushed).to.equal(undefined);
    }
    expect(commandCalls()).to.deep.equal([]);
    const said = lines.filter((l) => l.includes('does not delete conntrack entries by a filter'));
    expect(said).to.have.length(1);
    expect(said[0]).to.include('Invalid argument');
  });
});
