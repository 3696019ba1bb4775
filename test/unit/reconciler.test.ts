// The reconciler on a fake driver, without root: what a verification repairs when a partial sync
// writes between its read and its repair; syncs and removals that overlap (the kernel and what
// subscribers are told never go back to an older state); entries the driver leaves out.

import { expect } from 'chai';
import { buildDesiredState, DesiredStateModel } from '../../src/model/desired-state.js';
import {
  entryKey,
  type DesiredState,
  type Entry,
  type Family,
  type NodeInfo,
  type ServiceInfo,
} from '../../src/model/types.js';
import { sameElement } from '../../src/model/entry-diff.js';
import { BackendError, type DriverOperation } from '../../src/driver/driver.js';
import type { KernelChange } from '../../src/driver/kernel-change.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import type { EntryHandOut } from '../../src/model/sorted-entries.js';
import { MAX_SKIPPED_VERIFICATIONS } from '../../src/reconciler/verification.js';
import { FakeDriver } from '../doubles/fake-driver.js';
import { rejectionOf } from '../support/assertions.js';
import { CONFIG, lbService } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.1.0/24'] };

function desired(...numbers: number[]): DesiredState {
  return buildDesiredState(
    numbers.map((i) => lbService(i)),
    NODE,
    CONFIG,
  );
}

describe('Reconciler on a fake driver (no root)', () => {
  for (const readsAlongsideWrites of [false, true]) {
    it(`repairs a shape with what is programmed when the repair runs, not with what was read (${
      readsAlongsideWrites ? 'read alongside our writes' : 'read between our writes'
    })`, async () => {
      const driver = new FakeDriver('iptables', { readsAlongsideWrites });
      driver.writesLikeIptables = true;
      const reconciler = new Reconciler(driver);
      await reconciler.sync(desired(1, 2), { full: true });
      // Another writer changed our chains: the next full sync finds the shape changed.
      driver.kernel.get('ipv4')!.shape = 'changed by another writer';
      let partial: Promise<unknown> | undefined;
      driver.duringRead = () => {
        driver.duringRead = undefined;
        // A Service comes while the verification reads: its partial sync is asked for now.
        partial = reconciler.sync(desired(1, 2, 3), { full: false });
      };
      const full = await reconciler.sync(desired(1, 2), { full: true });
      const change = await partial;
      expect(full).to.include({ mode: 'full', repairedElements: 1 });
      expect(change).to.include({ mode: 'partial' });
      expect(driver.held('ipv4')).to.deep.equal([
        '192.0.2.1 TCP 80 -> 10.96.0.1',
        '192.0.2.2 TCP 80 -> 10.96.0.2',
        '192.0.2.3 TCP 80 -> 10.96.0.3',
      ]);
      // And the next full sync of the same state finds nothing to repair.
      const again = await reconciler.sync(desired(1, 2, 3), { full: true });
      expect(again.repairedElements ?? 0).to.equal(0);
    });
  }
});

describe('Reconciler: a change costs what it changes, not the table', () => {
  it("a partial sync and its subscribers never make the model's array of the family's entries", async () => {
    const model = new DesiredStateModel(CONFIG);
    const services = Array.from({ length: 250 }, (_, i) => lbService(i + 1));
    const families: Array<{ removed: number; added: number }> = [];
    const subscriber = {
      kernelChanged(change: KernelChange) {
        for (const f of change.families)
          if (f.family === 'ipv4') families.push({ removed: f.removed.length, added: f.added.length });
      },
    };
    const reconciler = new Reconciler(new FakeDriver('nft'), [subscriber]);
    const first = model.update(services, NODE);
    expect((await reconciler.sync(first, { full: true })).mode).to.equal('full');
    const moved = [...services];
    moved[7] = lbService(8, { ingress: [{ ip: '198.51.100.8' }] });
    const next = model.update(moved, NODE);
    const snapshot = next.ipv4.snapshot as EntryHandOut;
    expect(snapshot.length).to.equal(250);
    expect((await reconciler.sync(next, { full: false })).mode).to.equal('partial');
    expect(snapshot.made, 'the entries array of the changed state').to.equal(false);
    expect(families.at(-1)).to.deep.equal({ removed: 1, added: 1 });
    // Read, it is the whole sorted list, the same array each time.
    expect(next.ipv4.entries).to.have.length(250);
    expect(next.ipv4.entries).to.equal(next.ipv4.entries);
    expect(next.ipv4.entries.map((e) => e.externalIp)).to.include('198.51.100.8');
    // The next full sync finds the kernel as the partial one left it.
    expect((await reconciler.sync(model.update(moved, NODE), { full: true })).repairedElements ?? 0).to.equal(0);
  });
});

const DUAL_NODE: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };
/** The same node once its IPv4 pod range changed: the IPv4 rules change shape, the IPv6 ones do not. */
const DUAL_NODE_MOVED: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.2.0/24', 'fd01::/64'] };

/** Dual-stack LoadBalancer Service `i`: 192.0.2.i and 2001:db8::i, TCP port 80. */
function dual(i: number): ServiceInfo {
  return lbService(i, {
    clusterIPs: [`10.96.0.${i}`, `fd00::${i}`],
    ingress: [{ ip: `192.0.2.${i}` }, { ip: `2001:db8::${i}` }],
  });
}

type Held = Record<Family, string[]>;

/** A state's entries as the fake driver lists what the kernel holds. */
function heldBy(state: DesiredState): Held {
  const list = (family: Family) =>
    state[family].entries.map((e) => `${e.externalIp} ${e.protocol} ${e.port} -> ${e.clusterIp}`).sort();
  return { ipv4: list('ipv4'), ipv6: list('ipv6') };
}

/** Records what subscribers are told. */
class Told {
  readonly changes: Array<{ previous: Held | undefined; next: Held }> = [];
  /** Changes whose difference does not take `previous` to `next` (each family, by key and value). */
  readonly inexact: string[] = [];
  last: KernelChange | undefined;
  kernelChanged(change: KernelChange): void {
    this.last = change;
    this.changes.push({ previous: change.previous && heldBy(change.previous), next: heldBy(change.next) });
    for (const f of change.families) {
      const held = new Map<string, Entry>();
      if (change.previous && f.previousUnknown) this.inexact.push(`${f.family}: previous known, said unknown`);
      for (const e of f.previousUnknown ? [] : (change.previous?.[f.family].entries ?? [])) held.set(entryKey(e), e);
      for (const e of f.removed)
        if (!held.delete(entryKey(e))) this.inexact.push(`${f.family}: removes absent ${entryKey(e)}`);
      for (const e of f.added) {
        if (held.has(entryKey(e))) this.inexact.push(`${f.family}: adds present ${entryKey(e)}`);
        held.set(entryKey(e), e);
      }
      const next = change.next[f.family].entries;
      const exact =
        held.size === next.length &&
        next.every((e) => {
          const h = held.get(entryKey(e));
          return h !== undefined && sameElement(h, e);
        });
      if (!exact) this.inexact.push(`${f.family}: the difference does not lead to the next state`);
      const shapeChanged =
        change.previous !== undefined &&
        JSON.stringify(change.previous[f.family].localPodMatch) !== JSON.stringify(change.next[f.family].localPodMatch);
      if (f.shapeChanged !== shapeChanged) this.inexact.push(`${f.family}: shapeChanged is ${f.shapeChanged}`);
    }
  }
}

/**
 * What subscribers were told is what the kernel held, in the order it held it: each change starts
 * where the one before ended, each `next` is a state the kernel held after a write, later than
 * the one before; the last is what the kernel holds now.
 */
function expectToldAsWritten(driver: FakeDriver, told: Told): void {
  let at = 0;
  told.changes.forEach((change, i) => {
    if (i > 0)
      expect(change.previous, `change ${i} starts where change ${i - 1} ended`).to.deep.equal(
        told.changes[i - 1]!.next,
      );
    const j = driver.history.findIndex((h, k) => k >= at && JSON.stringify(h) === JSON.stringify(change.next));
    expect(
      j,
      `change ${i} (${JSON.stringify(change.next)}) is what the kernel held, after the change before`,
    ).to.be.at.least(0);
    at = j;
  });
  expect(told.changes.at(-1)?.next, 'the last change told is what the kernel holds').to.deep.equal(driver.holding());
  expect(told.inexact, 'each change told is the difference of its states').to.deep.equal([]);
}

/** Makes the first write that `matches` wait until released. */
function holdWrite(driver: FakeDriver, matches: (operations: readonly DriverOperation[]) => boolean) {
  let engaged!: () => void;
  let release!: () => void;
  const held = new Promise<void>((resolve) => (engaged = resolve));
  const gate = new Promise<void>((resolve) => (release = resolve));
  driver.hold = (operations) => {
    if (!matches(operations)) return undefined;
    driver.hold = undefined;
    engaged();
    return gate;
  };
  return { held, release };
}

/** Lets a sync just asked for queue its first write. */
const settle = () => new Promise((resolve) => setImmediate(resolve));

const writesIpv4Shape = (ops: readonly DriverOperation[]) =>
  ops.some((op) => op.kind === 'writeShape' && op.family === 'ipv4');

describe('Reconciler: the change subscribers are told (no root)', () => {
  it('is the difference it wrote, partial or whole, composed over the writes since the last', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    const lines = () => {
      const c = told.last!;
      return c.families.map((f) => ({
        family: f.family,
        unknown: f.previousUnknown,
        shape: f.shapeChanged,
        removed: f.removed.map((e) => `${e.externalIp} -> ${e.clusterIp}`),
        added: f.added.map((e) => `${e.externalIp} -> ${e.clusterIp}`),
      }));
    };
    await reconciler.sync(model.update([dual(1)], DUAL_NODE), { full: true });
    expect(lines()).to.deep.equal([
      { family: 'ipv4', unknown: true, shape: false, removed: [], added: ['192.0.2.1 -> 10.96.0.1'] },
      { family: 'ipv6', unknown: true, shape: false, removed: [], added: ['2001:db8::1 -> fd00::1'] },
    ]);
    // A partial sync: a Service comes, another's ClusterIP changes.
    const moved = { ...dual(1), clusterIP: '10.96.9.1', clusterIPs: ['10.96.9.1', 'fd00::91'] };
    expect((await reconciler.sync(model.update([moved, dual(2)], DUAL_NODE), { full: false })).mode).to.equal(
      'partial',
    );
    expect(lines()).to.deep.equal([
      {
        family: 'ipv4',
        unknown: false,
        shape: false,
        removed: ['192.0.2.1 -> 10.96.0.1'],
        added: ['192.0.2.1 -> 10.96.9.1', '192.0.2.2 -> 10.96.0.2'],
      },
      {
        family: 'ipv6',
        unknown: false,
        shape: false,
        removed: ['2001:db8::1 -> fd00::1'],
        added: ['2001:db8::1 -> fd00::91', '2001:db8::2 -> fd00::2'],
      },
    ]);
    // The IPv4 pod range moves: that family is written whole, a shape change; a Service goes.
    await reconciler.sync(model.update([moved], DUAL_NODE_MOVED), { full: false });
    expect(lines()).to.deep.equal([
      { family: 'ipv4', unknown: false, shape: true, removed: ['192.0.2.2 -> 10.96.0.2'], added: [] },
      { family: 'ipv6', unknown: false, shape: false, removed: ['2001:db8::2 -> fd00::2'], added: [] },
    ]);
    // Nothing changed: nothing told as changed.
    await reconciler.sync(model.update([moved], DUAL_NODE_MOVED), { full: true });
    expect(lines().flatMap((f) => [...f.removed, ...f.added])).to.deep.equal([]);
    await reconciler.cleanup();
    expect(lines()).to.deep.equal([
      { family: 'ipv4', unknown: false, shape: false, removed: ['192.0.2.1 -> 10.96.9.1'], added: [] },
      { family: 'ipv6', unknown: false, shape: false, removed: ['2001:db8::1 -> fd00::91'], added: [] },
    ]);
    expect(told.inexact).to.deep.equal([]);
  });
});

describe('Reconciler: syncs and removals that overlap (no root)', () => {
  it('a partial sync that writes while a full sync is under way is not undone by the full sync', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: true });
    expectToldAsWritten(driver, told);
    // The periodic full sync's state, then a change: a Service comes while the node's IPv4 pod
    // range moves (its IPv4 family is written whole, its IPv6 family only gets the new element).
    const periodic = model.update([dual(1), dual(2)], DUAL_NODE);
    const change = model.update([dual(1), dual(2), dual(3)], DUAL_NODE_MOVED);
    const slow = holdWrite(driver, writesIpv4Shape);
    const full = reconciler.sync(periodic, { full: true });
    await slow.held;
    const partial = reconciler.sync(change, { full: false });
    await settle();
    slow.release();
    const [fullResult, partialResult] = await Promise.all([full, partial]);
    expect(partialResult).to.include({ mode: 'full', fallbackReason: 'table-shape-changed' });
    expect(fullResult).to.include({ mode: 'full' });
    expect(driver.held('ipv6'), 'the IPv6 element the change added').to.include('2001:db8::3 TCP 80 -> fd00::3');
    expect(driver.holding()).to.deep.equal(heldBy(change));
    expectToldAsWritten(driver, told);
    // The next full sync of the same state finds the kernel as programmed.
    const again = await reconciler.sync(model.update([dual(1), dual(2), dual(3)], DUAL_NODE_MOVED), { full: true });
    expect(again.repairedElements ?? 0).to.equal(0);
    expectToldAsWritten(driver, told);
  });

  it('subscribers are told in the order of the writes, not the order the syncs end', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: true });
    const periodic = model.update([dual(1), dual(2)], DUAL_NODE);
    const change = model.update([dual(1), dual(2), dual(3)], DUAL_NODE);
    const slow = holdWrite(driver, writesIpv4Shape);
    const full = reconciler.sync(periodic, { full: true });
    await slow.held;
    const partial = reconciler.sync(change, { full: false });
    await settle();
    slow.release();
    // The partial sync ends first; the full sync verifies after it.
    let partialEnded = false;
    const fullEnded = full.then((r) => ({ r, partialEnded }));
    expect(await partial).to.include({ mode: 'partial' });
    partialEnded = true;
    const { r: fullResult, partialEnded: after } = await fullEnded;
    expect(after, 'the full sync ended after the partial one').to.equal(true);
    expect(fullResult).to.include({ mode: 'full' });
    expect(driver.holding()).to.deep.equal(heldBy(change));
    expectToldAsWritten(driver, told);
    // Conntrack was told of 192.0.2.3 appearing, and never of it going.
    const gone = told.changes.filter(
      (c) =>
        c.previous?.ipv4.includes('192.0.2.3 TCP 80 -> 10.96.0.3') &&
        !c.next.ipv4.includes('192.0.2.3 TCP 80 -> 10.96.0.3'),
    );
    expect(gone).to.deep.equal([]);
  });

  it('a sync that ends while a newer one is half written tells what the kernel holds of each family', async () => {
    const driver = new FakeDriver();
    driver.keepsGeneration = true;
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: true });
    // Nobody else wrote since: the resync writes its changes and reads nothing back.
    const periodic = model.update([dual(1)], DUAL_NODE);
    const change = model.update([dual(1), dual(3)], DUAL_NODE);
    const slow = holdWrite(driver, (ops) => ops.some((op) => op.kind !== 'removeAll' && op.family === 'ipv4'));
    const full = reconciler.sync(periodic, { full: true });
    await slow.held;
    const partial = reconciler.sync(change, { full: false });
    await settle();
    // The partial sync's IPv6 write waits until the full sync ended.
    const slowV6 = holdWrite(driver, (ops) =>
      ops.some((op) => op.kind === 'elements' && op.family === 'ipv6' && op.add.length > 0),
    );
    slow.release();
    expect(await full).to.include({ mode: 'full' });
    expect(reconciler.verificationsSkipped).to.equal(2);
    expect(driver.holding(), 'IPv4 as the change, IPv6 as the full sync left it').to.deep.equal({
      ipv4: ['192.0.2.1 TCP 80 -> 10.96.0.1', '192.0.2.3 TCP 80 -> 10.96.0.3'],
      ipv6: ['2001:db8::1 TCP 80 -> fd00::1'],
    });
    expectToldAsWritten(driver, told);
    slowV6.release();
    expect(await partial).to.include({ mode: 'partial' });
    expect(driver.holding()).to.deep.equal(heldBy(change));
    expectToldAsWritten(driver, told);
  });

  it('a removal asked for while a full sync writes voids the writes the full sync has yet to make', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: true });
    const periodic = model.update([dual(1), dual(2), dual(3)], DUAL_NODE);
    const slow = holdWrite(driver, writesIpv4Shape);
    const full = reconciler.sync(periodic, { full: true });
    await slow.held;
    // Stepping aside (kube-proxy left IPVS mode): everything of ours goes.
    const removal = reconciler.cleanup(model.update([dual(1), dual(2), dual(3)], DUAL_NODE));
    await settle();
    slow.release();
    const [fullResult] = await Promise.all([full, removal]);
    expect(driver.holding(), 'nothing of ours in the kernel').to.deep.equal({ ipv4: [], ipv6: [] });
    expect(driver.applied.at(-1)).to.deep.equal([{ kind: 'removeAll' }]);
    expectToldAsWritten(driver, told);
    expect(fullResult).to.include({ superseded: true, mode: 'noop' });
    expect(fullResult.entries).to.deep.equal({ ipv4: 0, ipv6: 0 });
    // A sync asked for after the removal programs again, from nothing.
    const back = await reconciler.sync(model.update([dual(1)], DUAL_NODE), { full: true });
    expect(back).to.include({ mode: 'full' });
    expect(driver.holding()).to.deep.equal({
      ipv4: ['192.0.2.1 TCP 80 -> 10.96.0.1'],
      ipv6: ['2001:db8::1 TCP 80 -> fd00::1'],
    });
    expectToldAsWritten(driver, told);
  });

  it('a removal asked for while a partial sync waits for its turn voids it', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1)], DUAL_NODE), { full: true });
    const slow = holdWrite(driver, writesIpv4Shape);
    const full = reconciler.sync(model.update([dual(1)], DUAL_NODE), { full: true });
    await slow.held;
    const partial = reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: false });
    await settle();
    const removal = reconciler.cleanup();
    slow.release();
    const [fullResult, partialResult] = await Promise.all([full, partial, removal]);
    expect(driver.holding(), 'nothing of ours in the kernel').to.deep.equal({ ipv4: [], ipv6: [] });
    expectToldAsWritten(driver, told);
    expect(fullResult).to.include({ superseded: true });
    expect(partialResult).to.include({ superseded: true });
  });
});

describe('Reconciler: entries the driver leaves out (no root)', () => {
  it('reports what the driver left out after each sync, full or partial', async () => {
    const driver = new FakeDriver('iptables');
    driver.rejects = (e) => (e.port === 8080 ? 'port 8080 is refused' : undefined);
    const reconciler = new Reconciler(driver);
    const model = new DesiredStateModel(CONFIG);
    const odd = lbService(2, { ports: [{ port: 8080, protocol: 'TCP' }] });
    const first = await reconciler.sync(model.update([lbService(1), odd], NODE), { full: true });
    expect(first.rejected).to.deep.equal([
      { family: 'ipv4', item: 'default/svc-2 192.0.2.2 TCP/8080', reason: 'port 8080 is refused' },
    ]);
    expect(first.entries).to.deep.equal({ ipv4: 1, ipv6: 0 });
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 TCP 80 -> 10.96.0.1']);
    // The refused entry goes: nothing is left out any more.
    const fixed = await reconciler.sync(model.update([lbService(1)], NODE), { full: false });
    expect(fixed.rejected).to.deep.equal([]);
    expect(fixed.entries).to.deep.equal({ ipv4: 1, ipv6: 0 });
    // It comes back in a partial sync, another with it.
    const again = await reconciler.sync(model.update([lbService(1), odd, lbService(3)], NODE), { full: false });
    expect(again).to.include({ mode: 'partial' });
    expect(again.rejected?.map((r) => r.item)).to.deep.equal(['default/svc-2 192.0.2.2 TCP/8080']);
    // What a partial write left out is not counted as programmed.
    expect(again.entries).to.deep.equal({ ipv4: 2, ipv6: 0 });
    expect(driver.held('ipv4')).to.have.length(2);
    // A full sync reads back and repairs nothing: what was left out is not missing.
    const resync = await reconciler.sync(model.update([lbService(1), odd, lbService(3)], NODE), { full: true });
    expect(resync.repairedElements ?? 0).to.equal(0);
    expect(resync.rejected).to.have.length(1);
    // A removal leaves nothing out.
    await reconciler.cleanup();
    expect((await reconciler.sync(model.update([lbService(1)], NODE), { full: true })).rejected).to.deep.equal([]);
  });
});

/** The entries of `state` for Service `i` (192.0.2.i). */
const entryOf = (state: DesiredState, i: number) => state.ipv4.entries.find((e) => e.externalIp === `192.0.2.${i}`)!;

/** Refuses the first write that `matches`, with `message`. */
function refuseOnce(driver: FakeDriver, matches: (ops: readonly DriverOperation[]) => boolean, message: string) {
  driver.refuse = (ops) => {
    if (!matches(ops)) return undefined;
    driver.refuse = undefined;
    return message;
  };
}

describe('Reconciler: a verification, and what it repairs (no root)', () => {
  it('repairs an element another writer retargeted: theirs removed, ours added', async () => {
    const driver = new FakeDriver();
    const reconciler = new Reconciler(driver);
    await reconciler.sync(desired(1, 2), { full: true });
    const theirs = { ...driver.kernel.get('ipv4')!.elements.get('ipv4|192.0.2.1|TCP|80')!, clusterIp: '10.1.1.1' };
    driver.kernel.get('ipv4')!.elements.set('ipv4|192.0.2.1|TCP|80', theirs);
    const repaired = await reconciler.sync(desired(1, 2), { full: true });
    expect(repaired).to.include({ mode: 'full', repairedElements: 2 });
    const repair = driver.applied.at(-1)!;
    expect(repair).to.have.length(1);
    expect(repair[0]).to.deep.include({ kind: 'elements', remove: [theirs] });
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 TCP 80 -> 10.96.0.1', '192.0.2.2 TCP 80 -> 10.96.0.2']);
  });

  it('repairs nothing where a read names an entry missing and its element foreign, but the element holds it', async () => {
    // The nft driver's listing does so when it prints an address otherwise than the model writes it.
    const driver = new FakeDriver();
    const reconciler = new Reconciler(driver);
    const state = desired(1, 2);
    await reconciler.sync(state, { full: true });
    const element = driver.kernel.get('ipv4')!.elements.get('ipv4|192.0.2.1|TCP|80')!;
    driver.alterRead = (read, _how, family) =>
      family === 'ipv4' ? { ...read, missing: [entryOf(state, 1)], foreign: [element] } : read;
    const writes = driver.applied.length;
    const resync = await reconciler.sync(desired(1, 2), { full: true });
    expect(resync).to.include({ mode: 'full' });
    expect(resync.repairedElements).to.equal(undefined);
    // Each family's shape, and no repair after the reads.
    const kinds = driver.applied.slice(writes).map((ops) => ops.map((op) => op.kind));
    expect(kinds).to.deep.equal([['writeShape'], ['writeShape']]);
  });

  it('does not put back what a partial sync removed while the verification read', async () => {
    const driver = new FakeDriver();
    const reconciler = new Reconciler(driver);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([lbService(1), lbService(2), lbService(3)], NODE), { full: true });
    // Another writer retargeted svc-3's element: the read finds ours missing and theirs foreign.
    const v4 = driver.kernel.get('ipv4')!;
    v4.elements.set('ipv4|192.0.2.3|TCP|80', { ...v4.elements.get('ipv4|192.0.2.3|TCP|80')!, clusterIp: '10.1.1.3' });
    let partial: Promise<unknown> | undefined;
    driver.duringRead = () => {
      driver.duringRead = undefined;
      // svc-3 goes while the verification reads: its partial sync removes the element.
      partial = reconciler.sync(model.update([lbService(1), lbService(2)], NODE), { full: false });
    };
    const full = await reconciler.sync(model.update([lbService(1), lbService(2), lbService(3)], NODE), {
      full: true,
    });
    expect(await partial).to.include({ mode: 'partial' });
    expect(full.repairedElements ?? 0, 'nothing of svc-3 repaired').to.equal(0);
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 TCP 80 -> 10.96.0.1', '192.0.2.2 TCP 80 -> 10.96.0.2']);
  });

  it('a read that fails fails the sync, and the next full sync writes the family whole', async () => {
    const driver = new FakeDriver();
    const reconciler = new Reconciler(driver);
    await reconciler.sync(desired(1, 2), { full: true });
    // Someone removed our table while the read began.
    driver.duringRead = () => {
      driver.duringRead = undefined;
      driver.kernel.delete('ipv4');
    };
    const err = await rejectionOf(reconciler.sync(desired(1, 2), { full: true }), BackendError);
    expect(err.message).to.equal('nft sync failed: ipv4: verifying the map: the table is missing');
    const again = await reconciler.sync(desired(1, 2), { full: true });
    expect(again).to.include({ mode: 'full' });
    expect(driver.applied.at(-1)!.map((op) => op.kind)).to.deep.equal(['writeFamily']);
    expect(driver.held('ipv4')).to.have.length(2);
  });

  it('a repair the kernel refuses fails the sync, and the next sync writes the family whole', async () => {
    const driver = new FakeDriver();
    const reconciler = new Reconciler(driver);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([lbService(1), lbService(2)], NODE), { full: true });
    driver.kernel.get('ipv4')!.elements.delete('ipv4|192.0.2.2|TCP|80');
    refuseOnce(driver, (ops) => ops.some((op) => op.kind === 'elements'), 'Cannot allocate memory');
    const err = await rejectionOf(
      reconciler.sync(model.update([lbService(1), lbService(2)], NODE), { full: true }),
      BackendError,
    );
    expect(err.message).to.equal('nft sync failed: ipv4: verifying the map: Cannot allocate memory');
    // A change now finds the family not programmed.
    const next = await reconciler.sync(model.update([lbService(1), lbService(2), lbService(3)], NODE), {
      full: false,
    });
    expect(next).to.include({ mode: 'full', fallbackReason: 'not-programmed' });
    expect(driver.held('ipv4')).to.have.length(3);
  });

  for (const overlapped of [true, false]) {
    it(`a shape drift read alongside our writes is ${
      overlapped ? 'read again between them when a partial sync committed meanwhile' : 'repaired as read when none did'
    }`, async () => {
      const driver = new FakeDriver('nft', { readsAlongsideWrites: true });
      const reconciler = new Reconciler(driver);
      const model = new DesiredStateModel(CONFIG);
      await reconciler.sync(model.update([lbService(1), lbService(2)], NODE), { full: true });
      const asked: string[] = [];
      // The listing saw a chain of the shape as a partial sync left it half-way: it differs from
      // what the read compared it with, though the kernel holds what was programmed.
      driver.alterRead = (read, how, family) => {
        if (family !== 'ipv4') return read;
        asked.push(how);
        return how === 'alongside-writes' ? { ...read, shapeDrift: ['source-ranges-0123456789abcdef'] } : read;
      };
      let partial: Promise<unknown> | undefined;
      if (overlapped) {
        driver.duringRead = () => {
          driver.duringRead = undefined;
          partial = reconciler.sync(model.update([lbService(1), lbService(2), lbService(3)], NODE), { full: false });
        };
      }
      const writes = driver.applied.length;
      const full = await reconciler.sync(model.update([lbService(1), lbService(2)], NODE), { full: true });
      const repairs = driver.applied
        .slice(writes)
        .flat()
        .filter((op) => op.kind === 'repairShape');
      if (overlapped) {
        expect(await partial).to.include({ mode: 'partial' });
        expect(asked).to.deep.equal(['alongside-writes', 'between-writes']);
        expect(full.repairedElements, 'the second read found nothing to repair').to.equal(undefined);
        expect(repairs).to.deep.equal([]);
        expect(driver.held('ipv4')).to.have.length(3);
      } else {
        expect(asked).to.deep.equal(['alongside-writes']);
        expect(full.repairedElements).to.equal(1);
        expect(repairs.map((op) => op.kind === 'repairShape' && op.parts)).to.deep.equal([
          ['source-ranges-0123456789abcdef'],
        ]);
      }
    });
  }

  it('a read that cannot finish between our writes either skips the verification, says so, and holds back our writes once per eleven', async () => {
    const driver = new FakeDriver('nft', { readsAlongsideWrites: true });
    const reconciler = new Reconciler(driver);
    await reconciler.sync(desired(1), { full: true });
    // Another writer commits throughout every listing: none finishes, alongside or between.
    const asked: string[] = [];
    driver.alterRead = (_read, how, family) => {
      if (family === 'ipv4') asked.push(how);
      return 'unfinished';
    };
    const results = [];
    for (let i = 0; i < 2 * (MAX_SKIPPED_VERIFICATIONS + 1); i++) {
      results.push(await reconciler.sync(desired(1), { full: true }));
    }
    expect(results.every((r) => r.mode === 'full' && r.repairedElements === undefined)).to.equal(true);
    const unverified = results.map((r) => r.unverified);
    const once = [...Array<undefined>(MAX_SKIPPED_VERIFICATIONS).fill(undefined), ['ipv4', 'ipv6']];
    expect(unverified, 'said so only when the read between our writes did not finish').to.deep.equal([
      ...once,
      ...once,
    ]);
    const round = [...Array<string>(MAX_SKIPPED_VERIFICATIONS).fill('alongside-writes'), 'between-writes'];
    expect(asked).to.deep.equal([...round, ...round]);
    // A change still goes through meanwhile.
    expect(await reconciler.sync(desired(1, 2), { full: false })).to.include({ mode: 'partial' });
  });

  it('a driver that cannot read either way fails the verification', async () => {
    const driver = new FakeDriver('nft', { readsAlongsideWrites: true });
    const reconciler = new Reconciler(driver);
    await reconciler.sync(desired(1), { full: true });
    driver.alterRead = () => 'not-alongside';
    const err = await rejectionOf(reconciler.sync(desired(1), { full: true }), BackendError);
    expect(err.message).to.equal(
      'nft sync failed: ipv4: verifying the map: nft could not read back; ipv6: verifying the map: nft could not read back',
    );
  });
});

describe('Reconciler: writes refused, and writes that overlap a refusal (no root)', () => {
  it('a family a partial sync finds unprogrammed at its turn (a resync before it was refused) is written whole', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: true });
    const slow = holdWrite(driver, writesIpv4Shape);
    const full = reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: true });
    await slow.held;
    const change = model.update([dual(1), dual(2), dual(3)], DUAL_NODE);
    const partial = reconciler.sync(change, { full: false });
    await settle();
    refuseOnce(driver, writesIpv4Shape, 'No such file or directory');
    slow.release();
    const [, partialResult] = await Promise.all([full, partial]);
    expect(partialResult).to.include({ mode: 'full', fallbackReason: 'partial-failed' });
    expect(driver.holding()).to.deep.equal(heldBy(change));
    expectToldAsWritten(driver, told);
  });

  it('a family a resync finds unprogrammed at its turn (a partial write before it was refused) is written whole', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    const reconciler = new Reconciler(driver, [told]);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1), dual(2)], DUAL_NODE), { full: true });
    const writes = driver.applied.length;
    const writesIpv4Elements = (ops: readonly DriverOperation[]) =>
      ops.some((op) => op.kind === 'elements' && op.family === 'ipv4');
    const slow = holdWrite(driver, writesIpv4Elements);
    const partial = reconciler.sync(model.update([dual(1), dual(2), dual(3)], DUAL_NODE), { full: false });
    await slow.held;
    const periodic = model.update([dual(1), dual(2), dual(3)], DUAL_NODE);
    const full = reconciler.sync(periodic, { full: true });
    await settle();
    refuseOnce(driver, writesIpv4Elements, 'No such file or directory');
    slow.release();
    const [partialResult, fullResult] = await Promise.all([partial, full]);
    expect(partialResult).to.include({ mode: 'full', fallbackReason: 'partial-failed' });
    expect(fullResult).to.include({ mode: 'full' });
    const whole = driver.applied
      .slice(writes)
      .filter((ops) => ops.some((op) => op.kind === 'writeFamily' && op.family === 'ipv4'));
    expect(whole, 'IPv4 written whole, by each sync').to.have.length(2);
    expect(driver.holding()).to.deep.equal(heldBy(periodic));
    expectToldAsWritten(driver, told);
  });

  it('a driver that can neither write families together nor replace one reports a refused family at once', async () => {
    const driver = new FakeDriver('iptables');
    const reconciler = new Reconciler(driver);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([dual(1)], DUAL_NODE), { full: true });
    // The IPv4 pod range moves: IPv4 alone is written whole, and the kernel refuses it.
    refuseOnce(driver, (ops) => ops.some((op) => op.kind === 'writeFamily'), 'Resource temporarily unavailable');
    const writes = driver.applied.length;
    const err = await rejectionOf(reconciler.sync(model.update([dual(1)], DUAL_NODE_MOVED), { full: false }));
    expect(err.message).to.equal('iptables sync failed: ipv4: Resource temporarily unavailable');
    const tried = driver.applied
      .slice(writes)
      .flatMap((ops) => ops.map((op) => `${op.kind} ${'family' in op ? op.family : ''}`));
    expect(tried, 'one attempt, no replacement').to.deep.equal(['writeFamily ipv4']);
  });
});

describe('Reconciler: what the driver brings to a sync (no root)', () => {
  it("checks a state with the driver's prepare before anything is written, and a refusal fails the sync", async () => {
    const driver = new FakeDriver('ebpf');
    const prepared: string[] = [];
    driver.preparing = async (state, full) => {
      prepared.push(`${state.ipv4.entries.length} ${full ? 'full' : 'partial'}`);
      if (state.ipv4.entries.length > 2) throw new BackendError('3 ipv4 entries exceed the map capacity', 'ebpf');
    };
    const reconciler = new Reconciler(driver);
    await reconciler.sync(desired(1, 2), { full: true });
    const writes = driver.applied.length;
    const err = await rejectionOf(reconciler.sync(desired(1, 2, 3), { full: false }), BackendError);
    expect(err.message).to.equal('3 ipv4 entries exceed the map capacity');
    expect(driver.applied.length, 'nothing written').to.equal(writes);
    expect(prepared).to.deep.equal(['2 full', '3 partial']);
  });

  it('hands memory back after a full sync, and a failure to do so fails nothing', async () => {
    const driver = new FakeDriver();
    let asked = 0;
    driver.releasing = async () => {
      asked++;
      throw new Error('malloc_trim is not there');
    };
    const reconciler = new Reconciler(driver);
    expect(await reconciler.sync(desired(1), { full: true })).to.include({ mode: 'full' });
    expect(asked).to.equal(1);
    await reconciler.sync(desired(1, 2), { full: false });
    expect(asked, 'not after a small partial sync').to.equal(1);
  });

  it('releases the driver on close, and says which driver a refused removal was', async () => {
    const driver = new FakeDriver();
    let closed = false;
    driver.closing = async () => void (closed = true);
    const reconciler = new Reconciler(driver);
    await reconciler.sync(desired(1), { full: true });
    refuseOnce(driver, (ops) => ops.some((op) => op.kind === 'removeAll'), 'Operation not permitted');
    const err = await rejectionOf(reconciler.cleanup(), BackendError);
    expect(err).to.include({ message: 'nft cleanup failed: Operation not permitted', backend: 'nft' });
    await reconciler.close();
    expect(closed).to.equal(true);
  });

  it('writes nothing for a change the driver elements cannot hold (a Service renamed, in eBPF maps)', async () => {
    const driver = new FakeDriver('ebpf');
    driver.keepsComments = false;
    const reconciler = new Reconciler(driver);
    const model = new DesiredStateModel(CONFIG);
    await reconciler.sync(model.update([lbService(1)], NODE), { full: true });
    const renamed = await reconciler.sync(model.update([lbService(1, { name: 'renamed' })], NODE), { full: false });
    expect(renamed).to.include({ mode: 'noop' });
    expect(driver.applied.at(-1)![0]).to.include({ kind: 'elements' });
    // What it holds is what it was asked to hold: the next full sync repairs nothing.
    const resync = await reconciler.sync(model.update([lbService(1, { name: 'renamed' })], NODE), { full: true });
    expect(resync.repairedElements ?? 0).to.equal(0);
  });

  it('a subscriber that fails fails the sync that told it, and the next change is told from where that one ended', async () => {
    const driver = new FakeDriver();
    const told = new Told();
    let fail = true;
    const reconciler = new Reconciler(driver, [
      {
        kernelChanged: (change) => {
          told.kernelChanged(change);
          if (fail) throw new Error('the subscriber broke');
        },
      },
    ]);
    const err = await rejectionOf(reconciler.sync(desired(1), { full: true }));
    expect(err.message).to.equal('the subscriber broke');
    fail = false;
    await reconciler.sync(desired(1, 2), { full: false });
    expect(told.changes.map((c) => c.next.ipv4.length)).to.deep.equal([1, 2]);
    expectToldAsWritten(driver, told);
  });
});

describe('Reconciler: entries given out of order, or twice (no root)', () => {
  it('finds the changes by key when known entries come out of order, and follows the new order', async () => {
    const driver = new FakeDriver();
    const reconciler = new Reconciler(driver);
    const first = desired(1, 2, 3);
    await reconciler.sync(first, { full: true });
    const reordered = (entries: DesiredState['ipv4']['entries']): DesiredState => ({
      ...first,
      ipv4: { ...first.ipv4, entries, changes: undefined },
    });
    const added = entryOf(desired(4), 4);
    const shuffled = reordered([...first.ipv4.entries].reverse().concat(added));
    expect(await reconciler.sync(shuffled, { full: false })).to.include({ mode: 'partial' });
    expect(driver.applied.at(-1)).to.deep.equal([
      { kind: 'elements', family: 'ipv4', remove: [], add: [added], rangedByService: undefined, annex: undefined },
    ]);
    // The record follows the entries it was given: the same objects in their first order are no change.
    expect(await reconciler.sync(reordered([...first.ipv4.entries, added]), { full: false })).to.include({
      mode: 'noop',
    });
    expect(driver.held('ipv4')).to.have.length(4);
  });

  it('keeps an entry a state lists twice, when the next state lists it once', async () => {
    const driver = new FakeDriver();
    const reconciler = new Reconciler(driver);
    const first = desired(1, 2);
    const [one, two] = first.ipv4.entries;
    await reconciler.sync({ ...first, ipv4: { ...first.ipv4, entries: [one!, one!, two!] } }, { full: true });
    const next = await reconciler.sync({ ...first, ipv4: { ...first.ipv4, entries: [one!, two!] } }, { full: false });
    expect(next).to.include({ mode: 'noop' });
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 TCP 80 -> 10.96.0.1', '192.0.2.2 TCP 80 -> 10.96.0.2']);
  });
});
