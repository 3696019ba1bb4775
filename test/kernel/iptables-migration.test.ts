// Backend selection and migration on the real kernel: nft -> iptables -> nft leaves no leftovers
// (nft tables, our chains and jumps in either iptables variant), traffic is translated by the
// active backend at each step, and --cleanup removes everything, twice in a row.

import { expect } from 'chai';
import type { Backend } from '../../src/backends/backend.js';
import { BackendError } from '../../src/backends/backend.js';
import { NftCliExecutor } from '../../src/backends/nft/executor.js';
import { NftBackend } from '../../src/backends/nft/nft-backend.js';
import { IptablesBackend, hasIptablesObjects } from '../../src/backends/iptables/iptables-backend.js';
import type { IptablesVariant } from '../../src/backends/iptables/variant.js';
import { cleanupAll, removeLeftovers, selectBackend, type LeftoverCleanup } from '../../src/backends/select.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { probe } from '../support/node-network.js';
import { CONFIG, LB_PATH, LB_V4, NODE_INFO, SERVICES, Scenario } from './scenario.js';
import { rejectionOf } from '../support/assertions.js';

const desired = () => buildDesiredState(SERVICES, NODE_INFO, CONFIG);
const nftTablesExist = () => new NftBackend(new NftCliExecutor()).hasState();

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
      await cleanupAll();
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
      expect(selected.backend.name).to.equal('nft');
      await removeLeftovers('nft');
      await selected.backend.sync(desired(), { full: true });
      expect(await where()).to.deep.equal({ nft: true, legacy: false, iptablesNft: false });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');

      selected = await selectBackend('iptables', { iptablesVariant: variant });
      if (!(selected.backend instanceof IptablesBackend))
        expect.fail('expected selected.backend instanceof IptablesBackend');
      expect(selected.backend.variant).to.equal(variant);
      await removeLeftovers('iptables', { iptablesVariant: variant });
      await selected.backend.sync(desired(), { full: true });
      expect(await where()).to.deep.equal({ nft: false, legacy: variant === 'legacy', iptablesNft: variant === 'nft' });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
      expect(await probe(undefined, 'tcp', LB_V4, 8080)).to.equal('svc-b');

      selected = await selectBackend('nft');
      await removeLeftovers('nft');
      await selected.backend.sync(desired(), { full: true });
      expect(await where()).to.deep.equal({ nft: true, legacy: false, iptablesNft: false });
      expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
    });
  }

  it("removes the other variant's leftovers when iptables stays the backend", async () => {
    await new IptablesBackend('legacy').sync(desired(), { full: true });
    await new IptablesBackend('nft').sync(desired(), { full: true });
    await removeLeftovers('iptables', { iptablesVariant: 'nft' });
    expect(await where()).to.deep.equal({ nft: false, legacy: false, iptablesNft: true });
    expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal('svc-a');
  });

  it('cleanupAll removes ours from every backend and both variants, and a second run succeeds', async () => {
    await new IptablesBackend('legacy').sync(desired(), { full: true });
    await new IptablesBackend('nft').sync(desired(), { full: true });
    const nft = (await selectBackend('nft')).backend;
    await nft.sync(desired(), { full: true });
    const checked = await cleanupAll();
    expect(checked).to.have.lengthOf(3);
    expect(await where()).to.deep.equal({ nft: false, legacy: false, iptablesNft: false });
    expect(await probe(pod(), 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal(LB_PATH);
    await cleanupAll();
    expect(await where()).to.deep.equal({ nft: false, legacy: false, iptablesNft: false });
  });

  it("runs the extra cleanups passed in (the eBPF backend's), except for the active backend", async () => {
    const calls: string[] = [];
    const ebpf: LeftoverCleanup = {
      backend: 'ebpf',
      description: 'eBPF programs and maps',
      cleanup: async () => {
        calls.push('ebpf');
      },
    };
    await removeLeftovers('nft', { extraCleanups: [ebpf] });
    await removeLeftovers('ebpf', { extraCleanups: [ebpf] });
    await cleanupAll([ebpf]);
    expect(calls).to.deep.equal(['ebpf', 'ebpf']);
    const failing: LeftoverCleanup = { ...ebpf, cleanup: () => Promise.reject(new Error('bpffs is not mounted')) };
    const err = await rejectionOf(cleanupAll([failing]), BackendError);
    expect(err.backend).to.equal('ebpf');
    expect(err.message).to.match(/eBPF programs and maps: bpffs is not mounted/);
  });

  it('auto chooses nft where the nft backend works; ebpf needs its factory', async () => {
    const auto = await selectBackend('auto');
    expect(auto.backend.name).to.equal('nft');
    expect(auto.reason).to.match(/^--backend=auto chose nft/);
    expect((await rejectionOf(selectBackend('ebpf'))).message).to.match(/ebpf backend is not part of this build/);
    const stand = new IptablesBackend('nft') as Backend;
    const chosen = await selectBackend('ebpf', { ebpf: () => stand });
    expect(chosen.backend).to.equal(stand);
  });

  it('iptables with variant auto follows the detected variant', async () => {
    const selected = await selectBackend('iptables');
    expect(selected.backend).to.be.instanceOf(IptablesBackend);
    expect(selected.reason).to.match(/^iptables backend, as configured: iptables-(nft|legacy): /);
  });
});
