// The iptables backend's partial syncs on the kernel, both variants: Services come, go and get
// other ClusterIPs while connections from a pod (nat PREROUTING) and from the node (nat OUTPUT)
// run through a Service that stays; none is lost and the kernel retransmits no SYN. Afterwards
// our chains hold exactly the rules a fresh full write of the same state holds. Also: a partial
// sync writes nothing for the state it wrote last, entries left out are logged once, a removal
// past the bound on deletes writes its buckets whole, and the flat chains of earlier versions
// become the bucket layout in one restore.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { systemIptablesRunner, type IptablesRunner } from '../../src/backends/iptables/executor.js';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { renderChainRules } from '../../src/backends/iptables/render.js';
import { DesiredStateModel } from '../../src/model/desired-state.js';
import type { ServiceInfo } from '../../src/model/types.js';
import { assertIsolatedNetns, probe, sh } from '../../testbed/node-network.js';
import { CONFIG, LB_PATH, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';
import { fillerService } from '../support/fixtures.js';
import { linesLogger } from '../support/log-lines.js';

const CONNECT_LOOP = fileURLToPath(new URL('./nft-connect-loop.js', import.meta.url));
const FILLERS = 2_500;

/** One address, `ports` ports, IPv4 only: a Service whose rules all sit in one bucket per hook. */
function large(ports: number): ServiceInfo {
  return {
    namespace: 'tenant',
    name: 'large',
    type: 'LoadBalancer',
    creationTimestamp: '2024-02-02T00:00:00Z',
    clusterIP: '10.98.0.1',
    ports: Array.from({ length: ports }, (_, i) => ({ port: 20_000 + i, protocol: 'TCP' as const })),
    ingress: [{ ip: '203.0.113.7' }],
  };
}

/** Our chains' rules as `-save` prints them, sorted (partial writes append: the order differs). */
function ourRules(variant: 'legacy' | 'nft', family: 'ipv4' | 'ipv6'): string[] {
  const tool = `${family === 'ipv4' ? 'iptables' : 'ip6tables'}-${variant}-save`;
  return execFileSync(tool, ['-t', 'nat'], { encoding: 'utf8', maxBuffer: 256 * 1024 * 1024 })
    .split('\n')
    .filter((l) => l.startsWith('-A IPVS_') || / -j IPVS_/.test(l))
    .sort();
}

/** The real runner, telling `seen` of each command and its input before it runs. */
function watchedRunner(seen: (command: string, input: string | undefined) => void): IptablesRunner {
  return {
    run: (command, args, input, timeoutMs, onOutput) => {
      seen(command, input);
      return systemIptablesRunner.run(command, args, input, timeoutMs, onOutput);
    },
    legacyTables: (family) => systemIptablesRunner.legacyTables(family),
    generation: () => systemIptablesRunner.generation!(),
  };
}

interface LoopReport {
  total: number;
  answered: number;
  failed: number;
  failures: unknown[];
  synRetransmits: number;
}

class Loop {
  private out = '';
  private readonly closed: Promise<unknown>;
  constructor(private readonly child: ChildProcess) {
    child.stdout!.on('data', (d: Buffer) => (this.out += d.toString()));
    this.closed = once(child, 'close');
  }
  async started(): Promise<void> {
    for (let i = 0; i < 1000 && !this.out.startsWith('started'); i++) await new Promise((r) => setTimeout(r, 10));
    expect(this.out, 'the first connection is answered').to.match(/^started/);
  }
  async stop(): Promise<LoopReport> {
    this.child.stdin!.end();
    await this.closed;
    return JSON.parse(this.out.slice(this.out.indexOf('\n') + 1)) as LoopReport;
  }
}

for (const variant of ['legacy', 'nft'] as const) {
  describe(`iptables-${variant}: partial syncs on the kernel`, function () {
    this.timeout(180_000);
    const logLines: string[] = [];
    const logger = linesLogger(logLines);
    const scenario = new Scenario();
    let backend: Reconciler;

    before(async () => {
      assertIsolatedNetns();
      await scenario.setUp();
    });
    after(async () => {
      await backend?.cleanup();
      await scenario.tearDown();
    });
    beforeEach(() => {
      backend = new Reconciler(new IptablesDriver(variant, { logger, jumpCheckIntervalMs: 0 }));
    });
    afterEach(async () => {
      await backend.cleanup();
    });

    it('loses no connection while Services churn, and ends with the rules of a fresh full write', async () => {
      const model = new DesiredStateModel(CONFIG);
      const live = new Map<number, ServiceInfo>();
      for (let i = 0; i < FILLERS; i++) live.set(i, fillerService(i));
      const services = () => [...SERVICES, ...live.values()];
      expect((await backend.sync(model.update(services(), NODE_INFO), { full: true })).mode).to.equal('full');

      const fromPod = new Loop(
        spawn(
          'ip',
          ['netns', 'exec', scenario.network.pod.ns, process.execPath, CONNECT_LOOP, LB_V4, '80', 'svc-a', '5'],
          {
            stdio: ['pipe', 'pipe', 'inherit'],
          },
        ),
      );
      const fromNode = new Loop(
        spawn(process.execPath, [CONNECT_LOOP, LB_V4, '80', 'svc-a', '5'], { stdio: ['pipe', 'pipe', 'inherit'] }),
      );
      const modes: string[] = [];
      let seed = 7;
      const random = (n: number) => {
        seed = (seed * 1103515245 + 12345) % 2 ** 31;
        return seed % n;
      };
      let next = FILLERS;
      let reports: LoopReport[];
      try {
        await fromPod.started();
        await fromNode.started();
        for (let k = 0; k < 40; k++) {
          // A few Services go, a few come, a few get another ClusterIP; svc-a stays.
          for (let j = 0; j < 3; j++) {
            const keys = [...live.keys()];
            live.delete(keys[random(keys.length)]!);
            live.set(next, fillerService(next));
            next++;
            const moved = keys[random(keys.length)]!;
            if (live.has(moved)) live.set(moved, fillerService(moved, 20_000 + k));
          }
          // Every eighth step another writer commits to the nat table first (iptables-nft: the
          // generation moves, so the resync compares our chains).
          if (k % 8 === 4) {
            sh(`iptables-${variant}`, ['-w', '-t', 'nat', k % 16 === 4 ? '-N' : '-X', 'BYSTANDER']);
          }
          const full = k % 5 === 4;
          const result = await backend.sync(model.update(services(), NODE_INFO), { full });
          modes.push(`${full ? 'F' : 'P'}:${result.mode}${result.repairedElements ? ':repaired' : ''}`);
        }
      } finally {
        reports = [await fromPod.stop(), await fromNode.stop()];
      }
      // Every change is a partial write; no resync found anything to repair.
      expect(
        modes.filter((m) => m.endsWith(':repaired') || m === 'P:full'),
        modes.join(' '),
      ).to.deep.equal([]);
      expect(modes.filter((m) => m === 'P:partial')).to.have.length(32);
      for (const [where, report] of [
        ['pod', reports[0]!],
        ['node', reports[1]!],
      ] as const) {
        expect(report.total, where).to.be.at.least(100);
        expect(report.failures, `${where}: ${report.failed} of ${report.total} lost`).to.deep.equal([]);
        expect(report.answered, where).to.equal(report.total);
        expect(report.synRetransmits, `${where}: SYN retransmits`).to.equal(0);
      }

      const churned = { ipv4: ourRules(variant, 'ipv4'), ipv6: ourRules(variant, 'ipv6') };
      // Per entry: a DNAT rule for pods, a mark and a DNAT rule for the node.
      expect(churned.ipv4.length).to.be.greaterThan(3 * FILLERS);
      // A fresh full write of the same state, from empty chains.
      const final = model.update(services(), NODE_INFO);
      await backend.cleanup();
      expect(ourRules(variant, 'ipv4')).to.deep.equal([]);
      const fresh = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
      expect((await fresh.sync(final, { full: true })).mode).to.equal('full');
      expect(ourRules(variant, 'ipv4')).to.deep.equal(churned.ipv4);
      expect(ourRules(variant, 'ipv6')).to.deep.equal(churned.ipv6);
    });

    it('a resync rewrites a chain someone changed, and only then', async () => {
      const commands: string[] = [];
      const runner = watchedRunner((command) => commands.push(command));
      backend = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0, runner }));
      const model = new DesiredStateModel(CONFIG);
      const services = [...SERVICES, ...Array.from({ length: 50 }, (_, i) => fillerService(i))];
      await backend.sync(model.update(services, NODE_INFO), { full: true });
      commands.length = 0;
      expect((await backend.sync(model.update(services, NODE_INFO), { full: true })).repairedElements).to.equal(
        undefined,
      );
      // iptables-nft: only our commits since the chains were written (the ruleset generation
      // says so), nothing is listed; legacy reads the nat table once per family.
      expect(commands).to.deep.equal(variant === 'nft' ? [] : ['iptables-legacy-save', 'ip6tables-legacy-save']);
      const rules = ourRules(variant, 'ipv4');
      const victim = rules.find((r) => r.startsWith('-A IPVS_OUTPUT') && r.includes('svc-7"') && r.includes('DNAT'))!;
      sh(`iptables-${variant}`, [
        '-w',
        '-t',
        'nat',
        '-D',
        ...victim
          .slice(3)
          .split(' ')
          .map((w) => w.replace(/"/g, '')),
      ]);
      expect(ourRules(variant, 'ipv4')).to.have.length(rules.length - 1);
      const result = await backend.sync(model.update(services, NODE_INFO), { full: true });
      expect(result.mode).to.equal('full');
      expect(result.repairedElements, 'our chains written whole again').to.equal(1);
      expect(ourRules(variant, 'ipv4')).to.deep.equal(rules);
    });

    it('a removal past the bound on rule deletes writes its bucket chains whole in its one restore, as a fresh write would', async () => {
      const restores: string[] = [];
      const runner = watchedRunner((command, input) => {
        if (command.endsWith('-restore') && input !== undefined) restores.push(input);
      });
      const base = [...SERVICES, ...Array.from({ length: 1_000 }, (_, i) => fillerService(i))];
      // Without the bound (the control) a small removal: one -D per rule costs minutes past a few
      // hundred in one chain. The removed Service's ports all sit in the buckets of its address's
      // last byte (7), which fillers 7, 263, 519 and 775 keep.
      for (const [bound, removed] of [
        [Number.POSITIVE_INFINITY, 10],
        // Past the default bound in both hooks (legacy: 256), prerouting's one rule a port included.
        [undefined, 300],
      ] as const) {
        const all = [...base, large(removed)];
        backend = new Reconciler(
          new IptablesDriver(variant, {
            jumpCheckIntervalMs: 0,
            runner,
            ...(bound === undefined ? {} : { rewriteAboveDeletes: bound }),
          }),
        );
        const model = new DesiredStateModel(CONFIG);
        await backend.sync(model.update(all, NODE_INFO), { full: true });
        const fromPod = new Loop(
          spawn(
            'ip',
            ['netns', 'exec', scenario.network.pod.ns, process.execPath, CONNECT_LOOP, LB_V4, '80', 'svc-a', '5'],
            { stdio: ['pipe', 'pipe', 'inherit'] },
          ),
        );
        let report: LoopReport;
        restores.length = 0;
        try {
          await fromPod.started();
          expect((await backend.sync(model.update(base, NODE_INFO), { full: false })).mode).to.equal('partial');
        } finally {
          report = await fromPod.stop();
        }
        expect(report.failures, 'connections through a Service that stays').to.deep.equal([]);
        // One restore, IPv4's (the removed Service is IPv4 only): deletes without the bound, the
        // two bucket chains declared with it.
        expect(restores).to.have.length(1);
        const deletes = restores[0]!.split('\n').filter((l) => l.startsWith('-D '));
        if (bound === undefined) {
          expect(deletes, 'past the bound: no rule deleted one by one').to.deep.equal([]);
          expect(restores[0]!.split('\n').filter((l) => l.startsWith(':'))).to.deep.equal([
            ':IPVS_PREROUTING_7 - [0:0]',
            ':IPVS_OUTPUT_7 - [0:0]',
          ]);
          expect(restores[0], 'the jumps and gotos are not touched').to.not.match(
            /^-[DI] (PREROUTING|OUTPUT|IPVS_\w+) -[dj] /m,
          );
        } else {
          // Per port: a DNAT rule for pods, a mark and a DNAT rule for the node.
          expect(deletes).to.have.length(3 * removed);
        }
        const partial = { ipv4: ourRules(variant, 'ipv4'), ipv6: ourRules(variant, 'ipv6') };
        await backend.cleanup();
        const fresh = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
        await fresh.sync(new DesiredStateModel(CONFIG).update(base, NODE_INFO), { full: true });
        expect(partial.ipv4).to.deep.equal(ourRules(variant, 'ipv4'));
        expect(partial.ipv6).to.deep.equal(ourRules(variant, 'ipv6'));
        await fresh.cleanup();
        await backend.cleanup();
      }
    });

    it('an upgraded node: the flat chains of earlier versions become the bucket layout in one restore, losing no connection', async () => {
      const restores: string[] = [];
      const runner = watchedRunner((command, input) => {
        if (command.endsWith('-restore') && input !== undefined) restores.push(input);
      });
      const services = [...SERVICES, ...Array.from({ length: FILLERS }, (_, i) => fillerService(i))];
      const desired = new DesiredStateModel(CONFIG).update(services, NODE_INFO);
      // What an earlier version wrote: every rule in IPVS_PREROUTING / IPVS_OUTPUT themselves.
      for (const family of ['ipv4', 'ipv6'] as const) {
        const rendered = renderChainRules(family, desired[family], desired.masqueradeMark, false);
        const flat = rendered.rules.map((r) => r.replace(/^-A (IPVS_PREROUTING|IPVS_OUTPUT)_\w+ /, '-A $1 '));
        const input = [
          '*nat',
          ':IPVS_PREROUTING - [0:0]',
          ':IPVS_OUTPUT - [0:0]',
          '-I PREROUTING 1 -j IPVS_PREROUTING',
        ];
        input.push('-I OUTPUT 1 -j IPVS_OUTPUT', ...flat, 'COMMIT', '');
        sh(`${family === 'ipv4' ? 'iptables' : 'ip6tables'}-${variant}-restore`, ['--noflush', '-w'], input.join('\n'));
      }
      expect(ourRules(variant, 'ipv4').filter((r) => r.startsWith('-A IPVS_OUTPUT '))).to.have.length(
        2 * desired.ipv4.entries.length,
      );
      const fromPod = new Loop(
        spawn(
          'ip',
          ['netns', 'exec', scenario.network.pod.ns, process.execPath, CONNECT_LOOP, LB_V4, '80', 'svc-a', '2'],
          { stdio: ['pipe', 'pipe', 'inherit'] },
        ),
      );
      const fromNode = new Loop(
        spawn(process.execPath, [CONNECT_LOOP, LB_V4, '80', 'svc-a', '2'], { stdio: ['pipe', 'pipe', 'inherit'] }),
      );
      backend = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0, runner }));
      let reports: LoopReport[];
      try {
        await fromPod.started();
        await fromNode.started();
        expect((await backend.sync(desired, { full: false })).mode).to.equal('full');
        // Connections keep starting after the write, through the new chains.
        await new Promise((r) => setTimeout(r, 200));
      } finally {
        reports = [await fromPod.stop(), await fromNode.stop()];
      }
      for (const [where, report] of [
        ['pod', reports[0]!],
        ['node', reports[1]!],
      ] as const) {
        expect(report.failures, `${where}: ${report.failed} of ${report.total} lost`).to.deep.equal([]);
        expect(report.answered, where).to.equal(report.total);
        expect(report.synRetransmits, `${where}: SYN retransmits`).to.equal(0);
      }
      // One restore per family, which flushed the flat chains and filled the buckets.
      expect(restores).to.have.length(2);
      for (const input of restores) expect(input).to.match(/^:IPVS_OUTPUT - \[0:0\]$/m);
      const migrated = { ipv4: ourRules(variant, 'ipv4'), ipv6: ourRules(variant, 'ipv6') };
      expect(
        migrated.ipv4.filter((r) => r.startsWith('-A IPVS_OUTPUT ')).every((r) => / -g IPVS_OUTPUT_\d+$/.test(r)),
      ).to.equal(true);
      await backend.cleanup();
      const fresh = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
      await fresh.sync(desired, { full: true });
      expect(ourRules(variant, 'ipv4')).to.deep.equal(migrated.ipv4);
      expect(ourRules(variant, 'ipv6')).to.deep.equal(migrated.ipv6);
      await fresh.cleanup();
    });

    it('without comments (--iptables-comments=false): whole and partial writes translate, a resync finds nothing to repair, and switching the flag across a restart rewrites the chains once', async () => {
      const model = new DesiredStateModel(CONFIG);
      const fillers = Array.from({ length: 50 }, (_, i) => fillerService(i));
      const bare = () => new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0, comments: false }));
      const served = async (what: string) => {
        expect(await probe(scenario.network.pod.ns, 'tcp', LB_V4, 80), `${what}: from a pod`).to.equal('svc-a');
        expect(await probe(undefined, 'tcp', LB_V4, 80), `${what}: from the node`).to.equal('svc-a');
        expect(await probe(undefined, 'tcp', LB_V4, 8080), `${what}: svc-b from the node`).to.equal('svc-b');
      };
      const commented = (rules: string[]) => rules.filter((r) => r.includes(' --comment '));
      const buckets = (rules: string[]) => rules.filter((r) => !/ -[gj] IPVS_/.test(r));

      backend = bare();
      expect((await backend.sync(model.update([...SERVICES, ...fillers], NODE_INFO), { full: true })).mode).to.equal(
        'full',
      );
      const whole = ourRules(variant, 'ipv4');
      expect(buckets(whole).length).to.be.above(3 * fillers.length);
      expect(commented(whole)).to.deep.equal([]);
      expect(commented(ourRules(variant, 'ipv6'))).to.deep.equal([]);
      await served('whole write');
      // svc-b leaves and comes back: two partial writes, without comments either.
      const without = [SERVICES[0]!, ...SERVICES.slice(2), ...fillers];
      expect((await backend.sync(model.update(without, NODE_INFO), { full: false })).mode).to.equal('partial');
      expect(await probe(undefined, 'tcp', LB_V4, 8080), 'svc-b gone').to.equal(LB_PATH);
      expect((await backend.sync(model.update([...SERVICES, ...fillers], NODE_INFO), { full: false })).mode).to.equal(
        'partial',
      );
      expect(ourRules(variant, 'ipv4')).to.deep.equal(whole);
      await served('partial writes');
      // A resync reads back what was written: nothing to repair.
      const resync = await backend.sync(model.update([...SERVICES, ...fillers], NODE_INFO), { full: true });
      expect(resync.repairedElements).to.equal(undefined);

      // Restarted with comments: the first whole write finds the chains unlike its own and
      // rewrites them; the next finds them held.
      const restarted = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
      const first = await restarted.sync(new DesiredStateModel(CONFIG).update([...SERVICES, ...fillers], NODE_INFO), {
        full: true,
      });
      expect(first.mode).to.equal('full');
      const withComments = ourRules(variant, 'ipv4');
      expect(buckets(withComments).every((r) => r.includes(' --comment '))).to.equal(true);
      expect(withComments.map((r) => r.replace(/ -m comment --comment \S+/, '')).sort()).to.deep.equal(whole);
      await served('comments back');
      const again = await restarted.sync(new DesiredStateModel(CONFIG).update([...SERVICES, ...fillers], NODE_INFO), {
        full: true,
      });
      expect(again.repairedElements).to.equal(undefined);
      // And back without: the same rules as the first whole write.
      backend = bare();
      await backend.sync(new DesiredStateModel(CONFIG).update([...SERVICES, ...fillers], NODE_INFO), { full: true });
      expect(ourRules(variant, 'ipv4')).to.deep.equal(whole);
      await served('comments off again');
    });

    it('a partial sync after a change writes nothing when the state comes again', async () => {
      const model = new DesiredStateModel(CONFIG);
      expect((await backend.sync(model.update(SERVICES.slice(1), NODE_INFO), { full: true })).mode).to.equal('full');
      const changed = model.update(SERVICES, NODE_INFO);
      expect((await backend.sync(changed, { full: false })).mode).to.equal('partial');
      const before = sh(`iptables-${variant}-save`, ['-t', 'nat', '-c']);
      const again = model.update(SERVICES, NODE_INFO);
      expect(again.ipv4.changes?.since).to.equal(changed.ipv4.snapshot);
      expect((await backend.sync(again, { full: false })).mode).to.equal('noop');
      expect(sh(`iptables-${variant}-save`, ['-t', 'nat', '-c']).replace(/^#.*$/gm, '')).to.equal(
        before.replace(/^#.*$/gm, ''),
      );
    });

    it('logs what it leaves out once, not at every sync, and reports it in the result', async () => {
      // The model takes an interface name as given; the renderer refuses what iptables would misread.
      const config = { ...CONFIG, detectLocalMode: 'BridgeInterface' as const, podBridgeInterface: 'cni"0' };
      const model = new DesiredStateModel(config);
      logLines.length = 0;
      const first = await backend.sync(model.update(SERVICES, NODE_INFO), { full: true });
      expect(first.rejected!.map((r) => `${r.family} ${r.item}`)).to.deep.equal([
        'ipv4 pod bridge interface',
        'ipv6 pod bridge interface',
      ]);
      expect(first.entries.ipv4).to.be.greaterThan(0);
      await backend.sync(model.update(SERVICES, NODE_INFO), { full: true });
      await backend.sync(model.update(SERVICES, NODE_INFO), { full: false });
      const logged = logLines.filter(
        (l) => l.includes('"item":"pod bridge interface"') && l.includes('"msg":"Left out of the iptables rules"'),
      );
      expect(logged).to.have.length(2);
      expect(logged[0]).to.include('read literally');
    });
  });
}
