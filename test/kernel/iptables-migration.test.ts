// Backend selection and migration on the real kernel: nft -> iptables -> nft leaves no leftovers
// (nft tables, our chains and jumps in either iptables variant), traffic is translated by the
// active backend at each step, and --cleanup removes everything, twice in a row.

import assert from 'node:assert/strict';
import type { Backend } from '../../src/backends/backend.js';
import { BackendError } from '../../src/backends/backend.js';
import { NftCliExecutor } from '../../src/backends/nft/executor.js';
import { NftBackend } from '../../src/backends/nft/nft-backend.js';
import { IptablesBackend, hasIptablesObjects } from '../../src/backends/iptables/iptables-backend.js';
import type { IptablesVariant } from '../../src/backends/iptables/variant.js';
import {
  BACKENDS,
  cleanupAll,
  removeLeftovers,
  selectBackend,
  type BackendRegistry,
  type LeftoverCleanup,
} from '../../src/backends/registry.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { probe } from '../support/node-network.js';
import { CONFIG, LB_PATH, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';

const desired = () => buildDesiredState(SERVICES, NODE_INFO, CONFIG);
const nftTablesExist = () => new NftBackend(new NftCliExecutor()).hasState();

/** The registry with these cleanups standing in for the eBPF backend's. */
function withEbpf(...ebpf: LeftoverCleanup[]): BackendRegistry {
  return { ...BACKENDS, ebpf: { ...BACKENDS.ebpf, leftovers: (_settings, inUse) => (inUse ? [] : ebpf) } };
}
// These tests create no eBPF objects: the node's bpffs is not theirs to clean.
const REGISTRY = withEbpf();

async function where(): Promise<{ nft: boolean; legacy: boolean; iptablesNft: boolean }> {
  return {
    nft: await nftTablesExist(),
    legacy: await hasIptablesObjects('legacy'),
    iptablesNft: await hasIptablesObjects('nft'),
  };
}

describe('backend selection and migration', function () {
  this.timeout(60_000);
  const scenario = new Scenario();
  const pod = () => scenario.network.pod.ns;

  before(async () => {
    await scenario.setUp();
  });
  after(async () => {
    try {
      await cleanupAll({}, REGISTRY);
    } finally {
      await scenario.tearDown();
    }
  });

  for (const variant of ['legacy', 'nft'] as const satisfies readonly IptablesVariant[]) {
    const other: IptablesVariant = variant === 'legacy' ? 'nft' : 'legacy';

    it(`nft -> iptables-${variant} -> nft leaves no leftovers and translates at every step`, async () => {
      // An earlier run with the other variant left its chains behind.
      await new IptablesBackend(other).sync(desired(), { full: true });

      let selected = await selectBackend('nft');
      assert.equal(selected.backend.name, 'nft');
      await removeLeftovers({ backend: 'nft' }, {}, REGISTRY);
      await selected.backend.sync(desired(), { full: true });
      assert.deepEqual(await where(), { nft: true, legacy: false, iptablesNft: false });
      assert.equal(await probe(pod(), 'tcp', LB_V4, 80), 'svc-a');

      selected = await selectBackend('iptables', { iptablesVariant: variant });
      assert.ok(selected.backend instanceof IptablesBackend);
      assert.equal(selected.backend.variant, variant);
      await removeLeftovers({ backend: 'iptables', iptablesVariant: variant }, {}, REGISTRY);
      await selected.backend.sync(desired(), { full: true });
      assert.deepEqual(await where(), { nft: false, legacy: variant === 'legacy', iptablesNft: variant === 'nft' });
      assert.equal(await probe(pod(), 'tcp', LB_V4, 80), 'svc-a');
      assert.equal(await probe(undefined, 'tcp', LB_V4, 8080), 'svc-b');

      selected = await selectBackend('nft');
      await removeLeftovers({ backend: 'nft' }, {}, REGISTRY);
      await selected.backend.sync(desired(), { full: true });
      assert.deepEqual(await where(), { nft: true, legacy: false, iptablesNft: false });
      assert.equal(await probe(pod(), 'tcp', LB_V4, 80), 'svc-a');
    });
  }

  it("removes the other variant's leftovers when iptables stays the backend", async () => {
    await new IptablesBackend('legacy').sync(desired(), { full: true });
    await new IptablesBackend('nft').sync(desired(), { full: true });
    await removeLeftovers({ backend: 'iptables', iptablesVariant: 'nft' }, {}, REGISTRY);
    assert.deepEqual(await where(), { nft: false, legacy: false, iptablesNft: true });
    assert.equal(await probe(pod(), 'tcp', LB_V4, 80), 'svc-a');
  });

  it('cleanupAll removes ours from every backend and both variants, and a second run succeeds', async () => {
    await new IptablesBackend('legacy').sync(desired(), { full: true });
    await new IptablesBackend('nft').sync(desired(), { full: true });
    const nft = (await selectBackend('nft')).backend;
    await nft.sync(desired(), { full: true });
    const checked = await cleanupAll({}, REGISTRY);
    assert.equal(checked.length, 3);
    assert.deepEqual(await where(), { nft: false, legacy: false, iptablesNft: false });
    assert.equal(await probe(pod(), 'tcp', LB_V4, 80), LB_PATH);
    assert.equal(await probe(undefined, 'tcp', LB_V4, 80), LB_PATH);
    await cleanupAll({}, REGISTRY);
    assert.deepEqual(await where(), { nft: false, legacy: false, iptablesNft: false });
  });

  it("runs every backend's cleanups (the eBPF backend's too), except the active backend's", async () => {
    const calls: string[] = [];
    const ebpf: LeftoverCleanup = {
      backend: 'ebpf',
      description: 'eBPF programs and maps',
      cleanup: async () => {
        calls.push('ebpf');
      },
    };
    await removeLeftovers({ backend: 'nft' }, {}, withEbpf(ebpf));
    await removeLeftovers({ backend: 'ebpf' }, {}, withEbpf(ebpf));
    await cleanupAll({}, withEbpf(ebpf));
    assert.deepEqual(calls, ['ebpf', 'ebpf']);
    const failing: LeftoverCleanup = { ...ebpf, cleanup: () => Promise.reject(new Error('bpffs is not mounted')) };
    await assert.rejects(cleanupAll({}, withEbpf(failing)), (err: Error) => {
      assert.ok(err instanceof BackendError);
      assert.equal(err.backend, 'ebpf');
      assert.match(err.message, /eBPF programs and maps: bpffs is not mounted/);
      return true;
    });
  });

  it('auto chooses nft where the nft backend works; a named backend is built by its registry entry', async () => {
    const auto = await selectBackend('auto');
    assert.equal(auto.backend.name, 'nft');
    assert.match(auto.reason, /^--backend=auto chose nft/);
    const stand = new IptablesBackend('nft') as Backend;
    const registry = { ...BACKENDS, ebpf: { ...BACKENDS.ebpf, create: async () => ({ backend: stand, reason: '' }) } };
    const chosen = await selectBackend('ebpf', {}, registry);
    assert.equal(chosen.backend, stand);
    assert.equal(chosen.reason, 'ebpf backend, as configured');
  });

  it('iptables with variant auto follows the detected variant', async () => {
    const selected = await selectBackend('iptables');
    assert.ok(selected.backend instanceof IptablesBackend);
    assert.match(selected.reason, /^iptables backend, as configured: iptables-(nft|legacy): /);
  });
});
