// Reconciler selection and migration on the real kernel: nft -> iptables -> nft leaves no leftovers
// (nft tables, our chains and jumps in either iptables variant), traffic is translated by the
// active backend at each step, and --cleanup removes everything, twice in a row.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { BackendError } from '../../src/driver/driver.js';
import { NftCliExecutor } from '../../src/backends/nft/executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { hasIptablesObjects } from '../../src/backends/iptables/nat-view.js';
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
import { probe } from '../../testbed/node-network.js';
import { CONFIG, LB_PATH, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';
import { rejectionOf } from '../support/assertions.js';

const desired = () => buildDesiredState(SERVICES, NODE_INFO, CONFIG);
const nftTablesExist = () => new NftDriver(new NftCliExecutor()).hasState();

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

/** Leaves a backend's objects as an earlier run would, without its jump guard outliving the step. */
async function syncAndClose(backend: Reconciler): Promise<void> {
  try {
    await backend.sync(desired(), { full: true });
  } finally {
    await backend.close();
  }
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
      await syncAndClose(new Reconciler(new IptablesDriver(other)));

      let selected = await selectBackend('nft');
      expect(selected.driver.name).to.equal('nft');
      await removeLeftovers({ backend: 'nft' }, {}, REGISTRY);
      await new Reconciler(selected.driver).sync(desired(), { full: true });
      expect(await where()).to.deep.equal({ nft: true, legacy: false, iptablesNft: false });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');

      selected = await selectBackend('iptables', { iptablesVariant: variant });
      if (!(selected.driver instanceof IptablesDriver))
        expect.fail('expected selected.driver instanceof IptablesDriver');
      expect(selected.driver.variant).to.equal(variant);
      await removeLeftovers({ backend: 'iptables', iptablesVariant: variant }, {}, REGISTRY);
      const iptables = new Reconciler(selected.driver);
      await iptables.sync(desired(), { full: true });
      expect(await where()).to.deep.equal({ nft: false, legacy: variant === 'legacy', iptablesNft: variant === 'nft' });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(undefined, 'tcp', LB_V4, 8080)).to.equal('svc-b');
      // One backend per process, as in the controller: its jump guard ends with it.
      await iptables.close();

      selected = await selectBackend('nft');
      await removeLeftovers({ backend: 'nft' }, {}, REGISTRY);
      await new Reconciler(selected.driver).sync(desired(), { full: true });
      expect(await where()).to.deep.equal({ nft: true, legacy: false, iptablesNft: false });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
    });
  }

  it("removes the other variant's leftovers when iptables stays the backend", async () => {
    await syncAndClose(new Reconciler(new IptablesDriver('legacy')));
    await syncAndClose(new Reconciler(new IptablesDriver('nft')));
    await removeLeftovers({ backend: 'iptables', iptablesVariant: 'nft' }, {}, REGISTRY);
    expect(await where()).to.deep.equal({ nft: false, legacy: false, iptablesNft: true });
    expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
  });

  it('cleanupAll removes ours from every backend and both variants, and a second run succeeds', async () => {
    await syncAndClose(new Reconciler(new IptablesDriver('legacy')));
    await syncAndClose(new Reconciler(new IptablesDriver('nft')));
    const nft = new Reconciler((await selectBackend('nft')).driver);
    await nft.sync(desired(), { full: true });
    const checked = await cleanupAll({}, REGISTRY);
    expect(checked).to.have.lengthOf(3);
    expect(await where()).to.deep.equal({ nft: false, legacy: false, iptablesNft: false });
    expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    await cleanupAll({}, REGISTRY);
    expect(await where()).to.deep.equal({ nft: false, legacy: false, iptablesNft: false });
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
    expect(calls).to.deep.equal(['ebpf', 'ebpf']);
    const failing: LeftoverCleanup = { ...ebpf, cleanup: () => Promise.reject(new Error('bpffs is not mounted')) };
    const err = await rejectionOf(cleanupAll({}, withEbpf(failing)), BackendError);
    expect(err.backend).to.equal('ebpf');
    expect(err.message).to.match(/eBPF programs and maps: bpffs is not mounted/);
  });

  it('auto chooses nft where the nft backend works; a named backend is built by its registry entry', async () => {
    const auto = await selectBackend('auto');
    expect(auto.driver.name).to.equal('nft');
    expect(auto.reason).to.match(/^--backend=auto chose nft/);
    const stand = new IptablesDriver('nft');
    const registry = {
      ...BACKENDS,
      ebpf: {
        ...BACKENDS.ebpf,
        create: async () => ({ driver: stand, description: { backend: 'ebpf' as const }, reason: '' }),
      },
    };
    const chosen = await selectBackend('ebpf', {}, registry);
    expect(chosen.driver).to.equal(stand);
    expect(chosen.reason).to.equal('ebpf backend, as configured');
  });

  it('iptables with variant auto follows the detected variant', async () => {
    const selected = await selectBackend('iptables');
    expect(selected.driver).to.be.instanceOf(IptablesDriver);
    expect(selected.reason).to.match(/^iptables backend, as configured: iptables-(nft|legacy): /);
  });
});
