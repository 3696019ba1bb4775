// A kube-proxy-like writer that keeps its jumps in nat PREROUTING/OUTPUT (EnsureRule: `-C`, and
// `-I` at rule 1 when missing every 0.4 s) deletes them and inserts them again, above ours. A
// connection whose SYN crosses the nat hook before our jump is back at rule 1 is not translated
// and meets what IPVS does with a virtual service without a local endpoint: a new connection is
// refused at once (ICMP port unreachable, modelled by a filter rule rejecting new untranslated
// connections to the LB IP). Such a connection is lost whatever the backend does afterwards (it
// ended with ECONNREFUSED, no SYN is retransmitted that a deleted conntrack entry could save); it
// never hangs. The backend puts its jump back (iptables-nft: as soon as the ruleset generation
// moves), and the connections after that are translated and answered. Both variants, real packets.

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { ConntrackCleaner } from '../../src/conntrack/conntrack-cleaner.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { assertIsolatedNetns, probe, sh } from '../../testbed/node-network.js';
import { linesLogger } from '../support/log-lines.js';
import { CONFIG, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';

const CONNECT_LOOP = fileURLToPath(new URL('./nft-connect-loop.js', import.meta.url));
/** IPVS's virtual service without a real server: a new connection gets ICMP port unreachable. */
const REFUSE_UNTRANSLATED = [
  ...['-d', LB_V4, '-p', 'tcp', '--dport', '80', '-m', 'conntrack', '--ctstate', 'NEW'],
  ...['-j', 'REJECT', '--reject-with', 'icmp-port-unreachable'],
];
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
      // An untranslated connection to the LB IP is refused, as IPVS refuses it without a real server.
      ipt(['-t', 'filter', '-I', 'INPUT', ...REFUSE_UNTRANSLATED]);
    });
    after(async () => {
      try {
        ipt(['-t', 'filter', '-D', 'INPUT', ...REFUSE_UNTRANSLATED]);
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
    ): Promise<{ report: LoopReport; after: string[]; writer: string; log: string[]; nat: string }> {
      const log: string[] = [];
      const logger = linesLogger(log);
      // The composition root's wiring: the conntrack client forgets the flows a displacement pinned.
      const conntrack = new ConntrackCleaner({ logger });
      const backend = new Reconciler(
        new IptablesDriver(variant, { logger }),
        forgetFlows
          ? [
              {
                kernelChanged: () => undefined,
                translationsBypassed: ({ family, entries }) => void conntrack.forgetUntranslated(family, entries),
              },
            ]
          : [],
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
        // Connections that start after the writer stopped, with our jump back at rule 1.
        await sleep(3_000);
        loop.stdin!.end();
        await once(loop, 'close');
        const report = JSON.parse(out.slice(out.indexOf('\n') + 1)) as LoopReport;
        const after: string[] = [];
        for (let i = 0; i < 5; i++) after.push(await probe(undefined, 'tcp', LB_V4, 80));
        return { report, after, writer: writerOut, log, nat: sh(`iptables-${variant}-save`, ['-t', 'nat']) };
      } finally {
        await backend.cleanup();
      }
    }

    it('without deleting the entries the window left, its connections are refused, not pinned (the control)', async () => {
      const { report, writer } = await run(false);
      expect(writer).to.match(/deleted\n.*inserted PREROUTING/s);
      expect(report.failed, JSON.stringify(report.failures)).to.be.greaterThan(0);
      expect(report.failures.map((f) => f.answer)).to.deep.equal(report.failures.map(() => 'error:ECONNREFUSED'));
    });

    it('moves its jump back: connections the window took are refused, none hangs; new ones are answered', async () => {
      const { report, after, writer, log, nat } = await run(true);
      expect(writer).to.match(/deleted\n.*inserted PREROUTING/s);
      const repairs = log.filter((l) => l.includes('Moved our jump back'));
      expect(repairs.length, `${writer}\n${log.join('\n')}`).to.be.at.least(1);
      expect(nat, "our jump is rule 1 again, the writer's right behind it").to.match(
        /^-A OUTPUT -j IPVS_OUTPUT\n-A OUTPUT -j KUBE-SERVICES$/m,
      );
      expect(report.total).to.be.at.least(200);
      // A connection that started untranslated was refused, as IPVS refuses it: no timeout.
      expect(report.failures.map((f) => f.answer)).to.deep.equal(report.failures.map(() => 'error:ECONNREFUSED'));
      expect(report.answered + report.failed).to.equal(report.total);
      // With the writer gone and our jump back at rule 1, every new connection is translated.
      expect(after).to.deep.equal(['svc-a', 'svc-a', 'svc-a', 'svc-a', 'svc-a']);
      console.log(
        `      ${variant}: ${report.total} connections, ${report.failed} refused while the writer's jump was first, ` +
          `${repairs.length} repairs`,
      );
    });
  });
}
