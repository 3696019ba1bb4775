// Capacity admission: which Services fit in the entries per family the backend is given
// (--max-entries). While everything asked for fits, every Service is admitted, at no cost beyond
// the changes. Otherwise Services are admitted in order of precedence (the oldest first, as key
// contests are settled), each whole or not at all, while they fit: one that does not fit is
// skipped (overCapacity), and younger, smaller ones may still fit after it.

import { precedes } from './types.js';
import type { ServiceRecord } from './service-records.js';
import type { Family, Skip } from './types.js';

/** Which records enter the key contests and which leave them. */
export interface Admission {
  enter: ServiceRecord[];
  leave: ServiceRecord[];
  /** Records were left out or let in for capacity: the skips changed. */
  capacityChanged: boolean;
}

export class CapacityAdmission {
  /** Records left out because they do not fit in maxEntries. */
  private readonly overCapacity = new Set<ServiceRecord>();
  /** Entries asked for by all records, per family (admitted or not). */
  private readonly requested: Record<Family, number> = { ipv4: 0, ipv6: 0 };
  /** The records in order of precedence, as the last admission pass sorted them. */
  private byPrecedence: ServiceRecord[] | undefined;

  constructor(private readonly maxEntries: number) {}

  /** Forgets every record. */
  reset(): void {
    this.overCapacity.clear();
    this.requested.ipv4 = 0;
    this.requested.ipv6 = 0;
    this.byPrecedence = undefined;
  }

  /** The overCapacity skips of the records left out. */
  *skips(): Iterable<Skip> {
    for (const record of this.overCapacity) yield record.capacitySkip!;
  }

  /**
   * Counts what the records that came and went ask for, and decides which records enter the
   * contests and which leave them. `all`: every record, for a first ordering by precedence.
   */
  admit(added: ServiceRecord[], removed: ServiceRecord[], all: () => Iterable<ServiceRecord>): Admission {
    for (const record of removed) this.count(record, -1);
    for (const record of added) this.count(record, 1);
    const max = this.maxEntries;
    const leave = removed.filter((r) => r.admitted);
    let capacityChanged = false;
    for (const r of removed) if (this.overCapacity.delete(r)) capacityChanged = true;
    if (this.requested.ipv4 <= max && this.requested.ipv6 <= max) {
      const enter = [...added, ...this.overCapacity];
      if (this.overCapacity.size > 0) capacityChanged = true;
      for (const r of this.overCapacity) r.capacitySkip = undefined;
      this.overCapacity.clear();
      for (const r of enter) r.admitted = true;
      this.byPrecedence = undefined;
      return { enter, leave, capacityChanged };
    }
    // Records that ask for nothing always fit (most Services have no external address): only the
    // others are ordered. Sorted last time and changed little since: TimSort takes a nearly
    // sorted array in one pass.
    const enter: ServiceRecord[] = [];
    const asks = (r: ServiceRecord) => r.asksIpv4 + r.asksIpv6 > 0;
    let order: ServiceRecord[];
    if (this.byPrecedence) {
      const gone = new Set(removed);
      order = this.byPrecedence.filter((r) => !gone.has(r));
      for (const r of added) order.push(r);
    } else {
      order = [...all()];
    }
    order = order.filter((r) => {
      if (asks(r)) return true;
      if (!r.admitted) {
        r.admitted = true;
        enter.push(r);
      }
      return false;
    });
    order.sort((a, b) => (precedes(a, b) ? -1 : precedes(b, a) ? 1 : 0));
    this.byPrecedence = order;
    const used: Record<Family, number> = { ipv4: 0, ipv6: 0 };
    for (const r of order) {
      const ipv4 = r.asksIpv4;
      const ipv6 = r.asksIpv6;
      const fits = used.ipv4 + ipv4 <= max && used.ipv6 + ipv6 <= max;
      if (fits) {
        used.ipv4 += ipv4;
        used.ipv6 += ipv6;
        if (!r.admitted) {
          r.admitted = true;
          enter.push(r);
          if (this.overCapacity.delete(r)) {
            r.capacitySkip = undefined;
            capacityChanged = true;
          }
        }
      } else if (!this.overCapacity.has(r)) {
        if (r.admitted) leave.push(r);
        r.admitted = false;
        const asked = ipv4 + ipv6;
        r.capacitySkip = {
          service: r.service,
          reason: 'overCapacity',
          detail: `its ${asked} entries do not fit in the ${max} per family this node programs (--max-entries): older Services hold them`,
        };
        this.overCapacity.add(r);
        capacityChanged = true;
      }
    }
    return { enter, leave, capacityChanged };
  }

  private count(record: ServiceRecord, sign: 1 | -1): void {
    this.requested.ipv4 += sign * record.asksIpv4;
    this.requested.ipv6 += sign * record.asksIpv6;
  }
}
