// A run of desired states that takes the iptables driver's partial writes through what its annex
// of a family (src/backends/iptables/annex.ts) must carry from one write to the next: bucket
// chains created and emptied, Services with source ranges added, changed and removed (one sharing
// a bucket with a Service without ranges), an entry the driver refuses and its removal, and a
// ClusterIP changed; dual-stack throughout. And a driver rebuilt before every apply and read, so
// that nothing it could keep between them survives: a run through it must write exactly what a
// run through one long-lived driver writes.

import type {
  Applied,
  Driver,
  DriverOperation,
  FamilyShape,
  ProbeResult,
  ReadBack,
  TranslatedConnections,
} from '../../src/driver/driver.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, Entry, Family, ModelConfig, ServiceInfo } from '../../src/model/types.js';
import { CONFIG, lbService } from './fixtures.js';

const NODE = { name: 'node-1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

/** Dual-stack; `last` the addresses' last byte (their bucket), `ranges` per family. */
function service(i: number, last: number, over: Partial<ServiceInfo> = {}): ServiceInfo {
  return lbService(i, {
    clusterIPs: [`10.96.0.${i}`, `fd00::${i}`],
    ingress: [{ ip: `192.0.2.${last}` }, { ip: `2001:db8::${last.toString(16)}` }],
    ports: [
      { port: 80, protocol: 'TCP' },
      { port: 53, protocol: 'UDP' },
    ],
    ...over,
  });
}

const ranged = (ranges: string[]): Partial<ServiceInfo> => ({ loadBalancerSourceRanges: ranges });

/** An entry no iptables rule can hold (the model would not make it): the driver leaves it out. */
function refused(state: DesiredState): DesiredState {
  const first = state.ipv4.entries[0]!;
  const bad: Entry = { ...first, port: 70_000 };
  return { ...state, ipv4: { ...state.ipv4, entries: [...state.ipv4.entries, bad] } };
}

export interface Step {
  what: string;
  state: DesiredState;
  /** The entries refused, as the sync result names them. */
  rejected: number;
  /** What a partial sync of it is: 'noop' where no rule changes (an entry refused comes or goes). */
  partial: 'partial' | 'noop';
}

/** The run; the first step is a whole write, every later one a partial sync. */
export function iptablesSteps(config: Partial<ModelConfig> = {}): Step[] {
  const build = (services: ServiceInfo[]) => buildDesiredState(services, NODE, { ...CONFIG, ...config });
  const a = service(1, 1);
  const b = service(2, 2);
  const c = service(3, 3);
  const d = service(4, 4);
  const e = service(5, 5, ranged(['10.0.0.0/8', '2001:db8:1::/48']));
  const e2 = service(5, 5, ranged(['10.0.0.0/8', '172.16.0.0/12', '2001:db8:1::/48']));
  // In the bucket of a, which has no ranges.
  const f = service(6, 1, {
    ...ranged(['198.51.100.0/24']),
    ingress: [{ ip: '198.51.100.1' }, { ip: '2001:db8:2::1' }],
  });
  const a2 = service(1, 1, { clusterIPs: ['10.96.1.1', 'fd00::1:1'] });
  const steps: Array<[string, ServiceInfo[], ('refused' | 'refused gone')?]> = [
    ['three Services', [a, b, c]],
    ['a bucket created', [a, b, c, d]],
    ['a bucket emptied', [a, c, d]],
    ['a Service with source ranges added', [a, c, d, e]],
    ['its ranges changed', [a, c, d, e2]],
    ['one with ranges in the bucket of one without', [a, c, d, e2, f]],
    ['an entry refused', [a, c, d, e2, f], 'refused'],
    ['the refused entry gone', [a, c, d, e2, f], 'refused gone'],
    ['a Service with ranges removed', [a, c, d, f]],
    ['the last one with ranges removed, a bucket emptied', [a, c, d]],
    ['a ClusterIP changed', [a2, c, d]],
    ['a Service with ranges back', [a2, c, d, e]],
  ];
  return steps.map(([what, services, refusal]) => {
    const state = build(services);
    const bad = refusal === 'refused';
    return { what, state: bad ? refused(state) : state, rejected: bad ? 1 : 0, partial: refusal ? 'noop' : 'partial' };
  });
}

/** A driver made anew before every apply and read back (the one before closed): it keeps nothing between them. */
export class RebuiltDriver implements Driver {
  private current: Driver;
  private readonly bypassListeners: Array<(family: Family) => void> = [];
  /** Drivers made so far. */
  made = 0;

  constructor(private readonly make: () => Driver) {
    this.current = this.renew();
  }

  private renew(): Driver {
    const driver = this.make();
    for (const listener of this.bypassListeners) driver.watchBypasses(listener);
    this.made++;
    return driver;
  }

  private async fresh(): Promise<Driver> {
    await this.current.close();
    return (this.current = this.renew());
  }

  get name() {
    return this.current.name;
  }
  get label() {
    return this.current.label;
  }
  get capacity() {
    return this.current.capacity;
  }
  get capabilities() {
    return this.current.capabilities;
  }
  familyLabel(family: Family): string {
    return this.current.familyLabel(family);
  }
  shapeKey(shape: FamilyShape): string {
    return this.current.shapeKey(shape);
  }
  roomFor(entries: number): number {
    return this.current.roomFor(entries);
  }
  probe(): Promise<ProbeResult> {
    return this.current.probe();
  }
  prepare(desired: DesiredState, full: boolean): Promise<void> {
    return this.current.prepare(desired, full);
  }
  async apply(operations: readonly DriverOperation[]): Promise<Applied> {
    return (await this.fresh()).apply(operations);
  }
  generation(): Promise<number | undefined> {
    return this.current.generation();
  }
  async readBack(
    family: Family,
    expected: readonly Entry[],
    shape: FamilyShape,
    how: 'alongside-writes' | 'between-writes',
  ): Promise<ReadBack | 'unfinished' | 'not-alongside'> {
    return (await this.fresh()).readBack(family, expected, shape, how);
  }
  watchBypasses(listener: (family: Family) => void): void {
    this.bypassListeners.push(listener);
    this.current.watchBypasses(listener);
  }
  hasState(): Promise<boolean> {
    return this.current.hasState();
  }
  translatedConnections(): Promise<TranslatedConnections[]> {
    return this.current.translatedConnections();
  }
  releaseMemory(): Promise<void> {
    return this.current.releaseMemory();
  }
  close(): Promise<void> {
    return this.current.close();
  }
}
