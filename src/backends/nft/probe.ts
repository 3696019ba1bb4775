// What this kernel takes of our tables, found by check-mode transactions that commit nothing: how
// our rules look keys up (the map itself, or a key set beside it), and whether it takes the
// objects that filter sources (else the driver filters no sources).

import { FAMILIES, type Family, type FamilyState } from '../../model/types.js';
import type { ProbeResult } from '../../driver/driver.js';
import type { NftExecutor } from './executor.js';
import { Transaction } from './objects.js';
import { desiredTable, type KeyLookup } from './render.js';
import { writeTable } from './transactions.js';

export class NftKernelProbe {
  /** The key lookup in use, found once (keyLookup). */
  private lookup: Promise<{ lookup: KeyLookup; why: string }> | undefined;

  constructor(
    private readonly executor: NftExecutor,
    /** --nft-key-lookup: 'auto' is found on this kernel. */
    private readonly choice: 'auto' | KeyLookup,
  ) {}

  /**
   * How our rules look keys up on this kernel: the map itself when a check-mode write of that
   * shape passes, else the key set when that one passes (the kernel refuses a map looked up as a
   * set: Linux 6.1 and older). Found once; a failure is not kept, so the next use tries again.
   */
  keyLookup(): Promise<{ lookup: KeyLookup; why: string }> {
    this.lookup ??= this.findKeyLookup().catch((err: unknown) => {
      this.lookup = undefined;
      throw err;
    });
    return this.lookup;
  }

  /**
   * The driver's probe: the key lookup, an empty table of each family, the source-range set.
   * `filtersSources` (when ok): whether the kernel takes the source-range set.
   */
  async probe(): Promise<ProbeResult & { filtersSources?: boolean }> {
    try {
      const { lookup, why } = await this.keyLookup();
      for (const family of FAMILIES) await this.checkEmptyTable(family, lookup);
      const refused = await this.checkSourceRanges(lookup);
      const sources =
        refused === undefined
          ? 'source ranges filtered'
          : `source ranges not filtered: this kernel refuses the objects that filter them (${refused}), so Services with loadBalancerSourceRanges are left to kube-proxy`;
      return {
        ok: true,
        detail: `nftables via ${this.executor.kind}, keys looked up in the ${lookup} (${why}); ${sources}`,
        nftKeyLookup: lookup,
        filtersSources: refused === undefined,
      };
    } catch (err) {
      return { ok: false, detail: `nftables cannot be programmed: ${(err as Error).message}` };
    }
  }

  private async findKeyLookup(): Promise<{ lookup: KeyLookup; why: string }> {
    if (this.choice !== 'auto') return { lookup: this.choice, why: 'as configured' };
    // A family the kernel refuses whatever the lookup must not decide it for the other.
    let mapRefused: Error | undefined;
    for (const lookup of ['map', 'set'] as const) {
      for (const family of FAMILIES) {
        try {
          await this.checkEmptyTable(family, lookup);
        } catch (err) {
          if (lookup === 'map') mapRefused ??= err as Error;
          continue;
        }
        if (lookup === 'map') return { lookup, why: 'this kernel looks a map up as a set' };
        return {
          lookup,
          why: `this kernel refuses a map looked up as a set (${mapRefused?.message}): keys go in a set beside the map`,
        };
      }
    }
    throw mapRefused!;
  }

  /**
   * A check-mode write of an empty state: proves the nft userspace, the nat hooks, fib and
   * concatenated maps (and sets) in this kernel, and the permission to program them.
   */
  private async checkEmptyTable(family: Family, lookup: KeyLookup): Promise<void> {
    const empty: FamilyState = { entries: [], localPodMatch: { kind: 'cidrs', cidrs: [] } };
    await this.executor.check(writeTable(new Transaction(), desiredTable(family, empty, 0x4000, lookup)));
  }

  /**
   * A check-mode write of a table with a source-ranged entry: the check map's verdicts, the
   * Service's chain with its anonymous interval set and the own-address set's concatenated
   * lookup. Where refused, the driver does not filter sources and the model leaves ranged
   * addresses to kube-proxy, as with the eBPF backend: one such Service must not make a whole
   * family unprogrammable. The reason when refused.
   */
  private async checkSourceRanges(lookup: KeyLookup): Promise<string | undefined> {
    const ranged: FamilyState = {
      entries: [
        {
          family: 'ipv4',
          externalIp: '192.0.2.1',
          protocol: 'TCP',
          port: 80,
          clusterIp: '192.0.2.2',
          service: 'probe/probe',
          sourceRanges: ['192.0.2.0/31'],
        },
      ],
      localPodMatch: { kind: 'cidrs', cidrs: [] },
      sourceRanged: true,
    };
    try {
      await this.executor.check(writeTable(new Transaction(), desiredTable('ipv4', ranged, 0x4000, lookup)));
      return undefined;
    } catch (err) {
      return (err as Error).message;
    }
  }
}
