// Whole writes under traffic: a controller restarted again and again (a fresh reconciler and
// driver each round, over the table the last one wrote), with the pod CIDRs switching between two
// lists so that the rules change too, while a UDP stream from the node and one from a pod
// namespace flow to a LoadBalancer address. Every datagram is a new connection: the test drops
// each one after the NAT hooks (an nft table of its own counts it there, by whether its
// destination was translated), before conntrack confirms the connection, so the next datagram's
// translation is decided anew. Not one may go untranslated.
//
// On the kernels nodes run (5.10, 6.1), a whole write that flushed a set and added its elements
// back lost lookups of the elements that stayed while it committed (element-diff.ts): this test
// then counted untranslated datagrams, every round with a Service that has source ranges (then a
// concatenated interval set; now a check map and a Service chain), now and then without. Through
// the addon and through the nft command (its whole writes list the sets and write their
// difference too). Runs as root inside `unshare --net --mount`
// (test/run.mjs), and in the VM layer's guests on each of Debian's kernels.

import { spawn, type ChildProcessByStdio } from 'node:child_process';
import { once } from 'node:events';
import type { Readable, Writable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { NftAddonExecutor, loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import { NftCliExecutor, type NftExecutor } from '../../src/backends/nft/executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { Transaction } from '../../src/backends/nft/objects.js';
import { MAP_NAME } from '../../src/backends/nft/render.js';
import { deleteTables } from '../../src/backends/nft/transactions.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import type { DesiredState, Entry } from '../../src/model/types.js';
import { NodeNetwork, readJsonCounters, sh } from '../../testbed/node-network.js';

const STREAM = fileURLToPath(new URL('./udp-stream.js', import.meta.url));
const LB = '192.0.2.60';
const CLUSTER_IP = '10.96.0.60';
const PORT = 9;
/**
 * How long the syncs go on at least, and the fewest datagrams that make the run mean anything.
 * The syncs also go on until a number of whole writes: ten through the addon (a hundred and more
 * in 15 s, in the VM layer's emulated guests too), four through the nft command, whose whole write
 * starts nft three times or more: in an emulated guest beside the two streams that is 2 to 9 s a
 * write (a write that loses lookups lost them every round, source-ranged or not, element-diff.ts).
 */
const DURATION_MS = 15_000;
const MIN_DATAGRAMS = 2_000;
const MIN_ROUNDS = { addon: 10, command: 4 };

function addonExecutor(): NftAddonExecutor {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(`the nftables addon must be built for kernel tests: ${load.reason}`);
  return load.executor;
}

function entry(i: number, over: Partial<Entry> = {}): Entry {
  return {
    family: 'ipv4',
    externalIp: `198.18.${i >> 8}.${i & 255}`,
    protocol: 'TCP',
    port: 443,
    clusterIp: `10.97.${i >> 8}.${i & 255}`,
    service: `filler/svc-${i}`,
    ...over,
  };
}

/** The streams' Service, 200 others, and the pod CIDRs of round `round` (both hold the pod's address). */
function desired(round: number, sourceRanged: boolean): DesiredState {
  // The node's datagrams come from the LoadBalancer IP itself (the address is local: translated
  // with sourcesFromNode), the pod's from its own (inside the range).
  const ranges = sourceRanged ? { sourceRanges: ['10.244.0.0/16'], sourcesFromNode: true as const } : {};
  const stream = entry(0, {
    externalIp: LB,
    protocol: 'UDP',
    port: PORT,
    clusterIp: CLUSTER_IP,
    service: 'default/stream',
    ...ranges,
  });
  const others = Array.from({ length: 200 }, (_, i) =>
    entry(i + 1, sourceRanged && i % 10 === 0 ? { sourceRanges: [`192.168.${i}.0/24`] } : {}),
  );
  const cidrs = round % 2 === 0 ? ['10.244.0.0/16'] : ['10.244.0.0/16', '10.99.0.0/16'];
  const ipv4 = { entries: [stream, ...others], localPodMatch: { kind: 'cidrs' as const, cidrs } };
  return {
    ipv4: sourceRanged ? { ...ipv4, sourceRanged: true } : ipv4,
    ipv6: { entries: [], localPodMatch: { kind: 'cidrs', cidrs: ['fd01::/64'] } },
    masqueradeMark: 0x4000,
  } as unknown as DesiredState;
}

/** Counts and drops the streams' datagrams after the NAT hooks, before conntrack confirms them. */
function observe(pod: string): void {
  const rules = (where: string, match: string) =>
    [
      `ip daddr ${LB} udp dport ${PORT} ${match} counter drop comment "${where}-untranslated"`,
      `ip daddr ${CLUSTER_IP} udp dport ${PORT} ${match} counter drop comment "${where}-translated"`,
    ].join('\n');
  sh(
    'nft',
    ['-f', '-'],
    `table ip observer {
      chain out {
        type filter hook output priority 100; policy accept;
        ${rules('node', '')}
      }
      chain pre {
        type filter hook prerouting priority 0; policy accept;
        ${rules('pod', `ip saddr ${pod}`)}
      }
    }`,
  );
}

type Stream = ChildProcessByStdio<Writable, Readable, null>;

async function startStream(ns: string | undefined): Promise<{ child: Stream; out: () => string }> {
  const args = [STREAM, LB, String(PORT), '20'];
  const child = ns
    ? spawn('ip', ['netns', 'exec', ns, process.execPath, ...args], { stdio: ['pipe', 'pipe', 'inherit'] })
    : spawn(process.execPath, args, { stdio: ['pipe', 'pipe', 'inherit'] });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  for (let i = 0; i < 1000 && !out.startsWith('sending'); i++) await new Promise((r) => setTimeout(r, 10));
  if (!out.startsWith('sending')) expect.fail(`the UDP stream ${ns ?? 'of the node'} did not start`);
  return { child, out: () => out };
}

async function stopStream(stream: { child: Stream; out: () => string }): Promise<number> {
  const closed = once(stream.child, 'close');
  stream.child.stdin.end();
  await closed;
  const last = stream.out().trim().split('\n').pop()!;
  return (JSON.parse(last) as { sent: number }).sent;
}

describe('nft whole writes under traffic (restarts, pod CIDRs switching)', function () {
  this.timeout(180_000);
  const network = new NodeNetwork();
  let filtersSources = false;

  before(async () => {
    network.setUp();
    network.bindAddress(LB);
    network.bindAddress(CLUSTER_IP);
    observe(network.pod.ipv4);
    const driver = new NftDriver(addonExecutor());
    await driver.probe();
    filtersSources = driver.capabilities.filtersSources;
  });
  after(async () => {
    sh('nft', ['delete', 'table', 'ip', 'observer']);
    await addonExecutor().run(deleteTables(new Transaction(), ['ipv4', 'ipv6']));
    network.tearDown();
  });

  const executors: Array<[string, () => NftExecutor]> = [
    ['the addon', addonExecutor],
    ['the nft command', () => new NftCliExecutor()],
  ];
  for (const [name, executorOf] of executors)
    for (const sourceRanged of [false, true]) {
      it(`translates every new flow from the node and a pod while the table is written whole again and again, through ${name}${sourceRanged ? ', with source ranges' : ''}`, async function () {
        // A kernel that refuses what filters sources (the probe says so).
        if (sourceRanged && !filtersSources) this.skip();
        const executor = executorOf();
        await new Reconciler(new NftDriver(executor)).sync(desired(0, sourceRanged), { full: true });
        // The transactions that replaced the map (deleted it), from the first restart on.
        let replaced = 0;
        const run = executor.run.bind(executor);
        executor.run = (tx) => {
          const ops = tx.operations;
          if (ops.some(({ verb, object: o }) => verb === 'delete' && o.kind === 'map' && o.name === MAP_NAME))
            replaced++;
          return run(tx);
        };
        const before = readJsonCounters('ip', 'observer');
        const streams = [await startStream(undefined), await startStream(network.pod.ns)];
        let rounds = 0;
        const started = performance.now();
        let sent: number[];
        try {
          // A restart each round: a new reconciler and driver, whose first sync writes the family whole.
          const minRounds = executor instanceof NftAddonExecutor ? MIN_ROUNDS.addon : MIN_ROUNDS.command;
          while (performance.now() - started < DURATION_MS || rounds < minRounds) {
            rounds++;
            const state = desired(rounds, sourceRanged);
            const result = await new Reconciler(new NftDriver(executor)).sync(state, { full: true });
            expect(result.mode).to.equal('full');
          }
        } finally {
          sent = [];
          for (const stream of streams) sent.push(await stopStream(stream));
        }
        const seconds = (performance.now() - started) / 1000;
        const after = readJsonCounters('ip', 'observer');
        const count = (name: string) => (after.get(name) ?? 0) - (before.get(name) ?? 0);
        const seen = {
          node: { translated: count('node-translated'), untranslated: count('node-untranslated') },
          pod: { translated: count('pod-translated'), untranslated: count('pod-untranslated') },
        };
        const what = `${rounds} whole writes in ${seconds.toFixed(1)} s, datagrams sent ${sent.join(' and ')}: ${JSON.stringify(seen)}`;
        console.log(`      ${what}`);
        expect(seen.node.untranslated + seen.pod.untranslated, what).to.equal(0);
        expect(seen.node.translated, what).to.be.at.least(MIN_DATAGRAMS);
        expect(seen.pod.translated, what).to.be.at.least(MIN_DATAGRAMS);
        expect(replaced, 'whole writes that replaced the map').to.equal(0);
        if (!(executor instanceof NftAddonExecutor)) return;
        if (sourceRanged) expect(executor.lastMapWrite, 'the JSON path: no batch').to.equal(undefined);
        else expect(executor.lastMapWrite?.how, what).to.equal('difference');
      });
    }
});
