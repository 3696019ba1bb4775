// The backend registry without root: what each backend's entry builds, how it is described for
// metrics, which leftovers it lists with and without a backend in use, and its --dry-run text.

import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { BACKENDS, renderDryRun, type LeftoverCleanup } from '../../src/backends/registry.js';
import { parseObjects } from '../../src/cli/objects-file.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { CONFIG } from '../support/fixtures.js';

const objects = parseObjects(readFileSync('examples/services.yaml', 'utf8'), 'examples/services.yaml');
const desired = buildDesiredState(objects.services, objects.nodes[0], CONFIG);
const descriptions = (cleanups: LeftoverCleanup[]) => cleanups.map((c) => c.description);

describe('backend registry', () => {
  it('builds nft with the executor asked for and iptables with the variant asked for, and describes them', async () => {
    const nft = await BACKENDS.nft.create({ nftExecutor: 'cli' });
    expect(nft.driver.name).to.equal('nft');
    expect(nft.description).to.deep.equal({ backend: 'nft', nftExecutor: 'cli' });
    const ipt = await BACKENDS.iptables.create({ iptablesVariant: 'legacy' });
    expect(ipt.reason).to.equal('iptables-legacy, as configured');
    expect(ipt.description).to.deep.equal({ backend: 'iptables', iptablesVariant: 'legacy' });
  });

  it('builds ebpf on the cgroup and bpffs given', async () => {
    const ebpf = await BACKENDS.ebpf.create({ cgroupPath: '/sys/fs/cgroup', bpffsPath: '/sys/fs/bpf/x' });
    expect(ebpf.driver.name).to.equal('ebpf');
    expect(ebpf.description).to.deep.equal({ backend: 'ebpf' });
    expect(descriptions(BACKENDS.ebpf.leftovers({ bpffsPath: '/sys/fs/bpf/x' }))).to.deep.equal([
      'eBPF programs and maps pinned under /sys/fs/bpf/x',
    ]);
  });

  it('lists every leftover of a backend not in use, and keeps what the one in use holds', () => {
    expect(descriptions(BACKENDS.nft.leftovers({}))).to.deep.equal(['nft tables ip/ip6 ipvs-node-controller']);
    expect(BACKENDS.nft.leftovers({}, { backend: 'nft', nftExecutor: 'cli' })).to.deep.equal([]);
    expect(BACKENDS.ebpf.leftovers({}, { backend: 'ebpf' })).to.deep.equal([]);
    expect(descriptions(BACKENDS.iptables.leftovers({}))).to.have.length(2);
    expect(
      descriptions(BACKENDS.iptables.leftovers({}, { backend: 'iptables', iptablesVariant: 'nft' })),
    ).to.deep.equal(['iptables-legacy chains IPVS_PREROUTING, IPVS_OUTPUT and their jump rules']);
  });

  it('prints iptables-restore input for iptables and the nft text for nft, ebpf and auto', () => {
    const restore = renderDryRun('iptables', desired);
    expect(restore)
      .to.match(/^\*nat$/m)
      .and.match(/^COMMIT$/m);
    const nft = renderDryRun('nft', desired);
    expect(nft).to.match(/^table ip ipvs-node-controller \{$/m);
    expect(renderDryRun('ebpf', desired)).to.equal(nft);
    expect(renderDryRun('auto', desired)).to.equal(nft);
  });

  it('prints the nft rules with the key set when --nft-key-lookup=set, as a kernel that needs it holds them', () => {
    const nft = renderDryRun('nft', desired, { nftKeyLookup: 'set' });
    expect(nft)
      .to.match(/^\tset external-ip-keys \{$/m)
      .and.match(
        /ip daddr \. meta l4proto \. th dport @external-ip-keys fib saddr type local fib daddr type local jump/,
      )
      .and.not.match(/th dport @external-ip-to-cluster-ip jump/);
    expect(renderDryRun('nft', desired, { nftKeyLookup: 'auto' })).to.equal(renderDryRun('nft', desired));
  });
});
