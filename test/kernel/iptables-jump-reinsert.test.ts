// A kube-proxy-like writer that keeps its jumps in nat PREROUTING/OUTPUT (EnsureRule: `-C`, and
// `-I` at rule 1 when missing every 0.4 s) deletes them and inserts them again, above ours. A
// connection whose SYN crosses the nat hook before our jump is back at rule 1 is not translated,
// and conntrack pins that: NAT is decided on a flow's first packet, so each retransmitted SYN
// follows the untranslated entry. Where the untranslated path answers nothing (modelled by a
// filter rule dropping untranslated packets to the LB IP after conntrack confirmed them), such a
// connection times out. The backend puts its jump back (iptables-nft: as soon as the ruleset
// generation moves) and deletes the unanswered untranslated entries of its own addresses: the
// next retransmission is translated, and no connection is lost. Both variants, real packets.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { assertIsolatedNetns, sh } from '../../testbed/node-network.js';
import { linesLogger } from '../support/log-lines.js';
import { CONFIG, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';

const CONNECT_LOOP = fileURLToPath(new URL('./nft-connect-loop.js', import.meta.url));
const WRITER_CHAIN = 'KUBE-SERVICES';
/** EnsureRule every 0.4 s; after DELETE_AFTER s the jumps are deleted (and so inserted again). */
const WRITER = `
ensure() { iptables-$V -w -t nat -C $1 -j ${WRITER_CHAIN} 2>/dev/null || { iptables-$V -w -t nat -I $1 -j ${WRITER_CHAIN}; echo "$(date +%s%3N) inserted $1"; }; }
start=$(date +%s%3N); deleted=0
while [ $(( $(date +%s%3N) - start )) -lt $DURATION_MS ]; do
  ensure PREROUTING; ensure OUTPUT
  if [ $deleted = 0 ] && [ $(( $(date +%s%3N) - start )) -ge $DELETE_AFTER_MS ]; then
    iptables-$V -w -t nat -D PREROUTING -j ${WRITER_CHAIN}; iptables-$V -w -t nat -D OUTPUT -j ${WRITER_CHAIN}
    echo "$(date +%s%3N) deleted"; deleted=1
  fi
  sleep 0.4
done
`;

interface LoopReport {
  total: number;
  answered: number;
  failed: number;
  failures: Array<{ startedMs: number; answer: string }>;
  synRetransmits: number;
}

for (const variant of ['nft', 'legacy'] as const) {
  describe(`iptables-${variant}: another writer re-inserts its jumps above ours`, function () {
    this.timeout(90_000);
    const scenario = new Scenario();
    const ipt = (args: string[]) => sh(`iptables-${variant}`, ['-w', ...args]);

    before(async () => {
      assertIsolatedNetns();
      await scenario.setUp();
      // kube-proxy's IPVS-mode shape: its chain ACCEPTs the LB IP (no DNAT of ours behind it).
      sh(
        `iptables-${variant}-restore`,
        ['--noflush', '-w'],
        `*nat\n:${WRITER_CHAIN} - [0:0]\n-A ${WRITER_CHAIN} -d ${LB_V4}/32 -j ACCEPT\nCOMMIT\n`,
      );
      // An untranslated connection to the LB IP goes unanswered (its entry confirmed on the way out).
      ipt(['-t', 'filter', '-I', 'INPUT', '-d', LB_V4, '-p', 'tcp', '--dport', '80', '-j', 'DROP']);
    });
    after(async () => {
      try {
        ipt(['-t', 'filter', '-D', 'INPUT', '-d', LB_V4, '-p', 'tcp', '--dport', '80', '-j', 'DROP']);
        sh(
          `iptables-${variant}-restore`,
          ['--noflush', '-w'],
          `*nat\n:${WRITER_CHAIN} - [0:0]\n-X ${WRITER_CHAIN}\nCOMMIT\n`,
        );
      } finally {
        await scenario.tearDown();
      }
    });
    afterEach(() => {
      for (const hook of ['PREROUTING', 'OUTPUT']) {
        while (sh(`iptables-${variant}-save`, ['-t', 'nat']).includes(`-A ${hook} -j ${WRITER_CHAIN}`)) {
          ipt(['-t', 'nat', '-D', hook, '-j', WRITER_CHAIN]);
        }
      }
    });

    async function run(
      forgetFlows: boolean,
    ): Promise<{ report: LoopReport; writer: string; log: string[]; nat: string }> {
      const log: string[] = [];
      const backend = new Reconciler(
        new IptablesDriver(variant, {
          logger: linesLogger(log),
          ...(forgetFlows ? {} : { forgetFlows: () => Promise.resolve(0) }),
        }),
      );
      try {
        await backend.sync(buildDesiredState(SERVICES, NODE_INFO, CONFIG), { full: true });
        const loop = spawn(process.execPath, [CONNECT_LOOP, LB_V4, '80', 'svc-a', '20'], {
          stdio: ['pipe', 'pipe', 'inherit'],
        });
        let out = '';
        loop.stdout.on('data', (d: Buffer) => (out += d.toString()));
        const writer = spawn('sh', ['-c', WRITER], {
          env: { ...process.env, V: variant, DURATION_MS: '6000', DELETE_AFTER_MS: '3000' },
          stdio: ['ignore', 'pipe', 'inherit'],
        });
        let writerOut = '';
        writer.stdout.on('data', (d: Buffer) => (writerOut += d.toString()));
        await once(writer, 'close');
        // Long enough for a pinned connection to time out (10 s) or be retransmitted into our DNAT.
        await sleep(3_000);
        loop.stdin!.end();
        await once(loop, 'close');
        const report = JSON.parse(out.slice(out.indexOf('\n') + 1)) as LoopReport;
        return { report, writer: writerOut, log, nat: sh(`iptables-${variant}-save`, ['-t', 'nat']) };
      } finally {
        await backend.cleanup();
      }
    }

    it('without deleting the entries the window pinned, connections are lost (the control)', async () => {
      const { report, writer } = await run(false);
      expect(writer).to.match(/deleted\n.*inserted PREROUTING/s);
      expect(report.failed, JSON.stringify(report.failures)).to.be.greaterThan(0);
      expect(report.failures.every((f) => f.answer === 'timeout')).to.equal(true);
    });

    it('loses no connection: those that started in the window are answered after a SYN retransmission', async () => {
      const { report, writer, log, nat } = await run(true);
      expect(writer).to.match(/deleted\n.*inserted PREROUTING/s);
      const repairs = log.filter((l) => l.includes('Moved our jump back'));
      expect(repairs.length, `${writer}\n${log.join('\n')}`).to.be.at.least(1);
      expect(nat, "our jump is rule 1 again, the writer's right behind it").to.match(
        /^-A OUTPUT -j IPVS_OUTPUT\n-A OUTPUT -j KUBE-SERVICES$/m,
      );
      expect(report.total).to.be.at.least(200);
      expect(report.failures, `${report.failed} of ${report.total} lost; ${log.join('\n')}`).to.deep.equal([]);
      expect(report.answered).to.equal(report.total);
      console.log(
        `      ${variant}: ${report.total} connections, ${report.synRetransmits} SYN retransmissions; ` +
          log
            .filter((l) => l.includes('conntrack'))
            .map((l) => (JSON.parse(l) as { deleted: number }).deleted)
            .join('+') +
          ' entries deleted',
      );
    });
  });
}
