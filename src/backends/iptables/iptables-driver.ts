// The iptables driver: chains IPVS_PREROUTING and IPVS_OUTPUT in the nat table of one iptables
// variant (legacy or nft), for IPv4 (iptables) and IPv6 (ip6tables). A family is written as our
// two chains rewritten and the jump rules repaired, in one `-restore --noflush` transaction; the
// xtables lock (-w) keeps kube-proxy's own restores and ours from interleaving. With
// iptables-legacy the whole nat table is read anyway, so a table that already holds exactly our
// rules is left as it is (no rewrite, counters kept); iptables-nft is not read that far (listing
// a large chain costs as much as writing it) and is rewritten on every full sync.
// Between syncs a jump guard (jump-guard.ts) keeps our jumps at rule 1 when another writer
// prepends its own.

import type { Logger } from 'pino';
import { FAMILIES, type Family, type FamilyState } from '../../model/types.js';
import type {
  Applied,
  Driver,
  DriverCapabilities,
  DriverOperation,
  EntryCapacity,
  ProbeResult,
  ReadBack,
} from '../../reconciler/driver.js';
import { IptablesCommands, type IptablesRunner, type IptablesVariant } from './executor.js';
import { emptyNatTable } from './parse.js';
import { renderFamilyRestore, type Rejection } from './render.js';
import { JumpGuard } from './jump-guard.js';
import { readJumpView, removeIptablesObjects, withRetries } from './nat-view.js';

export interface IptablesDriverOptions {
  /** Rejections (once per change) and jump repairs are logged here. */
  logger?: Logger;
  /** How often rule 1 of nat PREROUTING/OUTPUT is checked between syncs; 0: never. Default 1 s. */
  jumpCheckIntervalMs?: number;
  /** Runs the iptables commands; the real ones by default. */
  runner?: IptablesRunner;
}

/** Two rules per entry, walked one by one by every new connection that leaves the node. */
export const IPTABLES_CAPACITY: EntryCapacity = {
  defaultEntries: 20_000,
  why: 'every new connection walks two rules per entry',
};

export class IptablesDriver implements Driver {
  readonly name = 'iptables' as const;
  readonly label: string;
  readonly capacity = IPTABLES_CAPACITY;
  readonly capabilities: DriverCapabilities = {
    ordersOwnWrites: false,
    conntrackMatters: true,
    hasGeneration: false,
    atomicWrites: false,
    replacesFamilies: false,
    readsAlongsideWrites: false,
    writesElements: false,
    readsBack: false,
  };
  /** Families whose jumps a write has put in place. */
  private readonly written = new Set<Family>();
  /** Entries and matches left out of the last write of each family (a value failed validation). */
  private readonly rejections = new Map<Family, Rejection[]>();
  /** Writes, removals and jump repairs write the same rules: one at a time. */
  private queue: Promise<unknown> = Promise.resolve();
  private readonly jumpGuard: JumpGuard | undefined;
  /** Per family, the rejections last logged. */
  private readonly reportedRejections = new Map<Family, string>();

  constructor(
    readonly variant: IptablesVariant,
    private readonly options: IptablesDriverOptions = {},
  ) {
    this.label = `iptables-${variant}`;
    const interval = options.jumpCheckIntervalMs ?? 1000;
    if (interval > 0) {
      this.jumpGuard = new JumpGuard({
        variant,
        intervalMs: interval,
        logger: options.logger,
        exclusive: (work) => this.exclusive(work),
        families: () => this.written.values(),
        runner: options.runner,
      });
    }
  }

  /** Entries and matches left out because a value failed validation; the rest was programmed. */
  get rejected(): Rejection[] {
    return FAMILIES.flatMap((f) => this.rejections.get(f) ?? []);
  }

  /** Jump repairs made between syncs since the start. */
  get jumpRepairs(): number {
    return this.jumpGuard?.repairs ?? 0;
  }

  familyLabel(family: Family): string {
    return family;
  }

  shapeKey(shape: { state: FamilyState; masqueradeMark: number }): string {
    return JSON.stringify([shape.state.localPodMatch, shape.masqueradeMark]);
  }

  private exclusive<T>(work: () => Promise<T>): Promise<T> {
    const run = this.queue.then(work, work);
    this.queue = run.catch(() => undefined);
    return run;
  }

  private commands(family: Family): IptablesCommands {
    return new IptablesCommands(this.variant, family, this.options.runner);
  }

  async probe(): Promise<ProbeResult> {
    // A test restore (parsed and built, not committed) of rules of our shape proves the tools,
    // the nat table and the extensions used (comment, addrtype, tcp, MARK, DNAT).
    const sample: FamilyState = {
      entries: [],
      localPodMatch: { kind: 'interfacePrefix', prefix: 'veth' },
    };
    try {
      for (const family of FAMILIES) {
        const entry = {
          family,
          externalIp: family === 'ipv4' ? '192.0.2.1' : '2001:db8::1',
          protocol: 'TCP' as const,
          port: 80,
          clusterIp: family === 'ipv4' ? '192.0.2.2' : '2001:db8::2',
          service: 'probe/probe',
        };
        const rendered = renderFamilyRestore(family, { ...sample, entries: [entry] }, 0x4000, emptyNatTable());
        await this.commands(family).restore(rendered.text, { test: true });
      }
      return { ok: true, detail: `iptables via iptables-${this.variant}` };
    } catch (err) {
      return { ok: false, detail: `iptables-${this.variant} cannot be programmed: ${(err as Error).message}` };
    }
  }

  /** Each family written whole, in its own restore; the jump guard runs once a family is written. */
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    let unchanged = true;
    const leftOut: Partial<Record<Family, number>> = {};
    for (const op of operations) {
      switch (op.kind) {
        case 'writeFamily':
        case 'replaceFamily': {
          const { family, state, masqueradeMark } = op;
          this.written.delete(family);
          const commands = this.commands(family);
          const result = await this.exclusive(() =>
            withRetries(async () => {
              const current = await readJumpView(commands);
              const rendered = renderFamilyRestore(family, state, masqueradeMark, current);
              if (!rendered.upToDate) await commands.restore(rendered.text);
              return rendered;
            }),
          );
          if (!result.upToDate) unchanged = false;
          this.written.add(family);
          this.rejections.set(family, result.rejected);
          this.reportRejections(family, result.rejected);
          leftOut[family] = state.entries.length - result.programmed;
          break;
        }
        case 'removeAll':
          unchanged = false;
          await this.removeAll();
          break;
        case 'writeShape':
        case 'elements':
        case 'repairShape':
          throw new Error(`iptables writes families whole, not ${op.kind}`);
      }
    }
    if (this.written.size > 0) this.jumpGuard?.start();
    return { unchanged, leftOut };
  }

  /** Never asked: a full sync writes the family whole, which repairs it. */
  async readBack(): Promise<ReadBack> {
    throw new Error('iptables does not read back');
  }

  /** Each rejection is logged once, when the set of them for its family changes. */
  private reportRejections(family: Family, rejected: Rejection[]): void {
    const key = JSON.stringify(rejected);
    if (key === (this.reportedRejections.get(family) ?? '[]')) return;
    this.reportedRejections.set(family, key);
    for (const r of rejected) {
      this.options.logger?.warn({ family: r.family, item: r.item, reason: r.reason }, 'Left out of the iptables rules');
    }
  }

  private async removeAll(): Promise<void> {
    await this.jumpGuard?.stop();
    await this.exclusive(async () => {
      this.written.clear();
      this.rejections.clear();
      for (const family of FAMILIES) await removeIptablesObjects(this.variant, family, this.options.runner);
    });
  }

  /** Stops the jump checks; the rules stay. */
  async close(): Promise<void> {
    await this.jumpGuard?.stop();
  }
}
