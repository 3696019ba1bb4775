// One Service's entries must cost linear (or n log n) work, whatever its shape: a tenant may ask
// every node for 90,000 entries. Timing is not a test here (machines are noisy): the test counts
// the elements that array methods walk (scans, splices, sorts' comparisons) while the model
// derives one Service, and checks that four times the entries costs about four times the work.
// A step that walks a list once per entry (a lookup with some() or indexOf(), an insert with
// splice()) makes that sixteen times.

import { expect } from 'chai';
import { DesiredStateModel, buildDesiredState } from '../../src/model/desired-state.js';
import type { ModelConfig, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { CONFIG } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'n1', podCIDRs: ['10.244.1.0/24'] };
const UNLIMITED: ModelConfig = { ...CONFIG, maxEntriesPerService: 1_000_000 };

/** `addresses` x `ports` entries, every address and port listed twice (duplicates are work too). */
function bigService(name: string, addresses: number, ports: number, created = '2024-01-01T00:00:00Z'): ServiceInfo {
  const ips = Array.from({ length: addresses }, (_, i) => `198.51.${(i >> 8) & 255}.${i & 255}`);
  const list = Array.from({ length: ports }, (_, i) => ({ protocol: 'TCP', port: 1000 + i }));
  return {
    namespace: 'tenant',
    name,
    creationTimestamp: created,
    type: 'ClusterIP',
    clusterIP: '10.96.0.10',
    externalIPs: [...ips, ...ips],
    ports: [...list, ...list],
  };
}

/** Small neighbours, so that the big Service lands among existing entries. */
function neighbours(n: number): ServiceInfo[] {
  return Array.from({ length: n }, (_, i) => ({
    namespace: 'default',
    name: `n${i}`,
    creationTimestamp: '2023-01-01T00:00:00Z',
    type: 'LoadBalancer',
    clusterIP: `10.96.1.${i & 255}`,
    ports: [{ port: 80 }],
    ingress: [{ ip: `192.0.${(i >> 8) & 255}.${i & 255}` }],
  }));
}

const SCANNING = ['some', 'every', 'find', 'findIndex', 'indexOf', 'includes', 'filter', 'map', 'forEach', 'slice'];

/** Elements walked by array methods while `work` runs. */
function elementsWalked(work: () => void): number {
  const proto = Array.prototype as unknown as Record<string, (...args: unknown[]) => unknown>;
  const saved = new Map<string, (...args: unknown[]) => unknown>();
  let walked = 0;
  for (const name of [...SCANNING, 'splice', 'sort']) {
    const original = proto[name]!;
    saved.set(name, original);
    proto[name] = function (this: unknown[], ...args: unknown[]) {
      if (name === 'sort' && typeof args[0] === 'function') {
        const compare = args[0] as (a: unknown, b: unknown) => number;
        return original.call(this, (a: unknown, b: unknown) => {
          walked++;
          return compare(a, b);
        });
      }
      // A splice moves the elements after its index; a scan may stop early, but is charged whole.
      walked += name === 'splice' ? this.length - Number(args[0] ?? 0) : this.length;
      return original.apply(this, args);
    };
  }
  try {
    work();
  } finally {
    for (const [name, original] of saved) proto[name] = original;
  }
  return walked;
}

function growth(measure: (side: number) => number): { small: number; large: number; ratio: number } {
  const small = measure(60);
  const large = measure(120); // four times the entries
  return { small, large, ratio: large / small };
}

describe('model: work for one Service grows linearly with its entries', () => {
  it('when the Service is derived from nothing', () => {
    const g = growth((side) =>
      elementsWalked(() => buildDesiredState([bigService('big', side, side)], NODE, UNLIMITED)),
    );
    expect(g.ratio, JSON.stringify(g)).to.be.below(6);
  });

  it('when it arrives among others, changes and leaves again (incremental updates)', () => {
    const g = growth((side) => {
      const model = new DesiredStateModel(UNLIMITED);
      const others = neighbours(3000);
      model.update(others, NODE);
      const big = bigService('big', side, side);
      const moved = { ...big, clusterIP: '10.96.0.11' };
      return elementsWalked(() => {
        model.update([...others, big], NODE);
        model.update([...others, moved], NODE);
        model.update(others, NODE);
      });
    });
    expect(g.ratio, JSON.stringify(g)).to.be.below(6);
  });

  it('when it collides with an older Service on every key', () => {
    const g = growth((side) => {
      const model = new DesiredStateModel(UNLIMITED);
      const older = bigService('older', side, side, '2023-06-01T00:00:00Z');
      return elementsWalked(() => {
        model.update([older], NODE);
        model.update([older, bigService('copy', side, side)], NODE);
        model.update([bigService('copy', side, side)], NODE);
      });
    });
    expect(g.ratio, JSON.stringify(g)).to.be.below(6);
  });

  it('when it does not fit in the total, and fits again', () => {
    const g = growth((side) => {
      const model = new DesiredStateModel({ ...UNLIMITED, maxEntries: side * side + 10 });
      const others = neighbours(20);
      const older = bigService('older', side, side, '2023-06-01T00:00:00Z');
      const younger = bigService('younger', side, side / 2);
      return elementsWalked(() => {
        model.update([...others, older], NODE);
        model.update([...others, older, younger], NODE);
        model.update([...others, younger], NODE);
      });
    });
    expect(g.ratio, JSON.stringify(g)).to.be.below(6);
  });

  it('is bounded by the per-Service limit, not by what the Service lists', () => {
    // Over the limit, no entry is made: the work is that of reading the fields.
    const walked = elementsWalked(() => buildDesiredState([bigService('big', 300, 300)], NODE, CONFIG));
    const d = buildDesiredState([bigService('big', 300, 300)], NODE, CONFIG);
    expect(d.ipv4.entries).to.have.length(0);
    expect(d.skips.map((s) => s.reason)).to.deep.equal(['tooManyEntries']);
    expect(walked).to.be.below(10_000);
  });
});
