// The periodic resync on the kernel: it never replaces the table or the base chains packets
// cross, repairs only what someone else changed, and loses no packet. Connections from a pod
// namespace every few milliseconds across many resyncs of 15,000 entries are all answered, and the kernel retransmits no SYN (a SYN lost to a resync would be).

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { MAX_SKIPPED_VERIFICATIONS } from '../../src/reconciler/verification.js';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { MAP_NAME, OUTPUT_CHAIN, TABLE_NAME } from '../../src/backends/nft/render.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, ModelConfig, ServiceInfo } from '../../src/model/types.js';
import { sh } from '../../testbed/node-network.js';
import { CONFIG, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';
import { fillerService } from '../support/fixtures.js';

const CONNECT_LOOP = fileURLToPath(new URL('./nft-connect-loop.js', import.meta.url));

function addonBackend(): Reconciler {
  const load = loadNftAddon();
  if (!load.executor) throw new Error(`the nftables addon must be built for kernel tests: ${load.reason}`);
  return new Reconciler(new NftDriver(load.executor));
}

/** n LoadBalancer Services besides the scenario's, one element each. */
function fillerServices(n: number): ServiceInfo[] {
  return Array.from({ length: n }, (_, i) => fillerService(i));
}

function desired(services: ServiceInfo[], config: Partial<ModelConfig> = {}): DesiredState {
  return buildDesiredState(services, NODE_INFO, { ...CONFIG, ...config });
}

/** Handles of our chains: a replaced table or chain gets new ones. */
function chainHandles(): Record<string, number> {
  const listing = JSON.parse(sh('nft', ['-j', 'list', 'chains', 'ip'])) as {
    nftables: Array<{ chain?: { table: string; name: string; handle: number } }>;
  };
  const out: Record<string, number> = {};
  for (const item of listing.nftables) if (item.chain?.table === TABLE_NAME) out[item.chain.name] = item.chain.handle;
  return out;
}

function mapElements(): string[] {
  const listing = JSON.parse(sh('nft', ['-j', 'list', 'map', 'ip', TABLE_NAME, MAP_NAME])) as {
    nftables: Array<{ map?: { elem?: Array<[{ elem: { val: { concat: unknown[] }; comment?: string } }, string]> } }>;
  };
  const elems = listing.nftables.find((i) => i.map)?.map?.elem ?? [];
  return elems.map(([k, v]) => `${k.elem.val.concat.join(' ')} ${k.elem.comment} ${v}`).sort();
}

describe('nft periodic resync on the kernel', function () {
  this.timeout(120_000);
  const scenario = new Scenario();
  let backend: Reconciler;

  before(async () => {
    await scenario.setUp();
  });
  after(async () => {
    await backend?.cleanup();
    await scenario.tearDown();
  });
  beforeEach(() => {
    backend = addonBackend();
  });
  afterEach(async () => {
    await backend.cleanup();
  });

  it('keeps the table and chains, and repairs only the elements and rules someone changed', async () => {
    const state = desired([...SERVICES, ...fillerServices(100)]);
    expect((await backend.sync(state, { full: true })).mode).to.equal('full');
    const handles = chainHandles();
    const before = mapElements();
    expect(before).to.have.length(state.ipv4.entries.length);

    // Someone deletes one element, changes another, adds a stray one, and empties a chain.
    sh('nft', ['delete', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 198.18.0.1 . tcp . 443 }']);
    sh('nft', ['delete', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 198.18.0.2 . tcp . 443 }']);
    sh('nft', ['add', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 198.18.0.2 . tcp . 443 : 10.1.1.1 }']);
    sh('nft', ['add', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 203.0.113.9 . udp . 53 : 10.1.1.2 }']);
    sh('nft', ['flush', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN]);

    const result = await backend.sync(state, { full: true });
    expect(result.mode).to.equal('full');
    // Missing: 1 added; changed: 1 removed and 1 added; stray: 1 removed; the chain's rules.
    expect(result.repairedElements).to.equal(5);
    expect(mapElements()).to.deep.equal(before);
    expect(chainHandles()).to.deep.equal(handles);
    expect(sh('nft', ['list', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN])).to.match(/fib saddr type local/);

    // Nothing drifted: nothing to repair, and still the same chains and rules.
    const rules = sh('nft', ['-a', 'list', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN]);
    const again = await backend.sync(state, { full: true });
    expect(again.repairedElements).to.equal(undefined);
    expect(chainHandles()).to.deep.equal(handles);
    expect(sh('nft', ['-a', 'list', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN])).to.equal(rules);
  });

  it('replaces the table when someone re-created a base chain with another priority', async () => {
    const state = desired([...SERVICES, ...fillerServices(10)]);
    await backend.sync(state, { full: true });
    const before = mapElements();
    sh('nft', ['flush', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN]);
    sh('nft', ['delete', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN]);
    sh('nft', ['add', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN, '{ type nat hook output priority 0; policy accept; }']);
    expect((await backend.sync(state, { full: true })).mode).to.equal('full');
    expect(sh('nft', ['list', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN])).to.match(
      /priority -110;[^]*fib saddr type local/,
    );
    expect(mapElements()).to.deep.equal(before);
  });

  it('another process committing all the time neither stalls a resync nor holds back changes: the verification is skipped and said so', async () => {
    const state = desired([...SERVICES, ...fillerServices(15_000)]);
    await backend.sync(state, { full: true });
    // Commits to nf_tables back to back, in a table of its own: every listing of ours is restarted.
    const writer = spawn(
      'sh',
      ['-c', 'while :; do nft add table ip bystander-writer; nft delete table ip bystander-writer; done'],
      { stdio: 'ignore' },
    );
    // Under way once the ruleset generation moves by many commits in a short while.
    const generation = async () => (await loadNftAddon().executor!.generation()) ?? -1;
    const start = await generation();
    for (let i = 0; i < 500 && (await generation()) < start + 20; i++) await new Promise((r) => setTimeout(r, 10));
    expect(await generation(), 'the other writer commits').to.be.at.least(start + 20);
    const results = [];
    let change: Awaited<ReturnType<Reconciler['sync']>> | undefined;
    try {
      for (let k = 0; k < MAX_SKIPPED_VERIFICATIONS + 1; k++) {
        const full = backend.sync(state, { full: true });
        // A change asked for while the resync reads back.
        if (k === MAX_SKIPPED_VERIFICATIONS) {
          change = await backend.sync(desired([...SERVICES, ...fillerServices(15_001)]), { full: false });
        }
        results.push(await full);
      }
    } finally {
      writer.kill('SIGKILL');
      await once(writer, 'close');
    }
    expect(results.map((r) => r.mode)).to.deep.equal(Array<string>(MAX_SKIPPED_VERIFICATIONS + 1).fill('full'));
    expect(results.every((r) => r.repairedElements === undefined)).to.equal(true);
    // The read between our writes, after ten skipped alongside them, could not finish either.
    expect(results.at(-1)!.unverified).to.include('ipv4');
    expect(change).to.include({ mode: 'partial' });
    expect(sh('nft', ['get', 'element', 'ip', TABLE_NAME, MAP_NAME, '{ 198.18.58.152 . tcp . 443 }'])).to.include(
      '10.97.58.152',
    );
    // Once the other writer stops, a resync verifies again.
    sh('nft', ['add', 'table', 'ip', 'bystander']);
    sh('nft', ['delete', 'table', 'ip', 'bystander']);
    const after = await backend.sync(state, { full: true });
    expect(after.unverified).to.equal(undefined);
  });

  it('answers every connection from a pod, with no SYN retransmitted, across resyncs and rewrites of 15,000 entries', async () => {
    const services = [...SERVICES, ...fillerServices(15_000)];
    // Two states that differ in the pod CIDRs only: switching between them rewrites the table.
    const states = [
      desired(services, { detectLocalMode: 'ClusterCIDR', clusterCidrs: ['10.244.0.0/16', 'fd01::/48'] }),
      desired(services, {
        detectLocalMode: 'ClusterCIDR',
        clusterCidrs: ['10.244.0.0/16', '10.99.0.0/16', 'fd01::/48'],
      }),
    ];
    expect(states[0]!.ipv4.entries.length).to.be.greaterThan(15_000);
    await backend.sync(states[0]!, { full: true });

    const client = spawn(
      'ip',
      ['netns', 'exec', scenario.network.pod.ns, process.execPath, CONNECT_LOOP, LB_V4, '80', 'svc-a', '4'],
      { stdio: ['pipe', 'pipe', 'inherit'] },
    );
    let out = '';
    client.stdout.on('data', (d: Buffer) => (out += d.toString()));
    const closed = once(client, 'close');
    const timeline: string[] = [];
    const modes = { resyncs: 0, rewrites: 0 };
    let t0 = 0;
    try {
      for (let i = 0; i < 1000 && !out.startsWith('started'); i++) await new Promise((r) => setTimeout(r, 10));
      expect(out, 'the first connection is answered').to.match(/^started/);
      t0 = performance.now();
      // Resyncs, as the sync period makes them; every fourth sync a rewrite of the whole map.
      for (let k = 0; k < 24; k++) {
        const rewrite = k % 4 === 3;
        const state = states[rewrite ? (modes.rewrites + 1) % 2 : modes.rewrites % 2]!;
        // Every other resync follows another writer's commit: it lists and verifies the map;
        // the others find the ruleset untouched since our last commit and list nothing.
        if (k % 2 === 0) sh('nft', [k % 4 === 0 ? 'add' : 'delete', 'table', 'ip', 'bystander']);
        const startedAt = performance.now() - t0;
        const result = await backend.sync(state, { full: !rewrite });
        timeline.push(
          `${rewrite ? 'rewrite' : 'resync'} ${Math.round(startedAt)}-${Math.round(performance.now() - t0)} ms`,
        );
        if (rewrite) {
          expect(result.fallbackReason).to.equal('table-shape-changed');
          modes.rewrites++;
        } else {
          expect(result.repairedElements).to.equal(undefined);
          modes.resyncs++;
        }
      }
    } finally {
      client.stdin.end();
      await closed;
    }
    const summary = JSON.parse(out.slice(out.indexOf('\n') + 1)) as {
      total: number;
      answered: number;
      failed: number;
      failures: Array<{ at: number }>;
      synRetransmits: number;
    };
    expect(modes).to.deep.equal({ resyncs: 18, rewrites: 6 });
    // 6 of the 18 resyncs followed no other writer (both families each): no listing for those.
    expect(backend.verificationsSkipped).to.equal(12);
    expect(summary.total).to.be.at.least(500);
    // Each failure's start on the timeline's clock, to name the sync it met.
    const t0Epoch = performance.timeOrigin + t0;
    const failures = summary.failures.map((f) => ({ ...f, timelineMs: Math.round(f.at - t0Epoch) }));
    expect(failures, `${summary.failed} of ${summary.total} connections; syncs: ${timeline.join(', ')}`).to.deep.equal(
      [],
    );
    expect(summary.answered).to.equal(summary.total);
    // A SYN lost to a resync is retransmitted by the kernel: none may have been.
    expect(summary.synRetransmits, `SYN retransmits; syncs: ${timeline.join(', ')}`).to.equal(0);
  });
});
