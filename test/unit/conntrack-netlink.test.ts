// The cleaner's in-process path: every tuple of a family goes to ctnetlink in one call, and a
// family whose call fails goes to the conntrack command instead (said once per run). The netlink
// side itself is proven on the kernel (test/kernel/conntrack-cleaner.test.ts).

import { expect } from 'chai';
import { chmodSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConntrackCleaner } from '../../src/conntrack/conntrack-cleaner.js';
import type { ConntrackNetlink } from '../../src/conntrack/conntrack-netlink.js';
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
      return Promise.resolve(tuples.length);
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
});
