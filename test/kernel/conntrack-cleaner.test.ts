// The conntrack clean-up on the kernel: it deletes exactly the entries of the tuples it is given
// (one tuple at a time, or after one listing when there are many), only untranslated ones when
// asked, and reports a missing conntrack command without throwing.

import { expect } from 'chai';
import * as dgram from 'node:dgram';
import { once } from 'node:events';
import { ConntrackCleaner } from '../../src/conntrack/conntrack-cleaner.js';
import type { StaleTuple } from '../../src/conntrack/stale-tuples.js';
import { NodeNetwork, requireTools, sh } from '../../testbed/node-network.js';
import { linesLogger } from '../support/log-lines.js';

const A = '192.0.2.60';
const B = '192.0.2.61';
const A6 = '2001:db8::60';

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
  this.timeout(30_000);
  const network = new NodeNetwork();
  const logLines: string[] = [];
  const logger = linesLogger(logLines, 'debug');

  before(() => {
    requireTools('conntrack');
    network.setUp();
    for (const address of [A, B, A6]) network.bindAddress(address);
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

  for (const listAbove of [16, 0]) {
    it(`deletes the entries of the given tuples and no others (${listAbove === 0 ? 'after one listing' : 'one tuple at a time'})`, async () => {
      sh('conntrack', ['-F']);
      await flow(A, 53, 41001);
      await flow(A, 53, 41002);
      await flow(A, 54, 41003);
      await flow(B, 53, 41004);
      await flow(A6, 53, 41005);
      expect(entries(A, 53)).to.have.members([41001, 41002]);
      const cleaner = new ConntrackCleaner({ logger, listAbove });
      const report = await cleaner.clean([tuple(A, 53), tuple(A6, 53), tuple(B, 99)]);
      expect(report).to.include({ tuples: 3, deleted: 3, failures: 0 });
      expect(entries(A, 53)).to.deep.equal([]);
      expect(entries(A6, 53)).to.deep.equal([]);
      expect(entries(A, 54)).to.deep.equal([41003]);
      expect(entries(B, 53)).to.deep.equal([41004]);
    });
  }

  it('with untranslatedOnly, leaves entries whose reply comes from another address', async () => {
    sh('conntrack', ['-F']);
    await flow(A, 53, 41011);
    // A translated entry: original destination A, reply from 10.96.0.60 (as after a DNAT).
    sh('conntrack', [
      '-I',
      '-p',
      'udp',
      '-s',
      A,
      '-d',
      A,
      '--sport',
      '41012',
      '--dport',
      '53',
      '-r',
      '10.96.0.60',
      '-q',
      A,
      '--reply-port-src',
      '53',
      '--reply-port-dst',
      '41012',
      '-t',
      '30',
      '-u',
      'SEEN_REPLY',
    ]);
    expect(entries(A, 53)).to.have.members([41011, 41012]);
    for (const listAbove of [16, 0]) {
      const report = await new ConntrackCleaner({ logger, listAbove }).clean([tuple(A, 53, true)]);
      expect(report.failures).to.equal(0);
    }
    expect(entries(A, 53)).to.deep.equal([41012]);
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
});
