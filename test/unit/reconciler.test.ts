// The reconciler on a fake driver, without root: what a verification repairs when a partial sync
// writes between its read and its repair; syncs and removals that overlap (the kernel and what
// subscribers are told never go back to an older state); entries the driver leaves out.

import { expect } from 'chai';
import { buildDesiredState, DesiredStateModel } from '../../src/model/desired-state.js';
import type { DesiredState, Family, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import type { DriverOperation } from '../../src/driver/driver.js';
import type { KernelChange } from '../../src/driver/kernel-change.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { FakeDriver } from '../doubles/fake-driver.js';
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
  kernelChanged(change: KernelChange): void {
    this.changes.push({ previous: change.previous && heldBy(change.previous), next: heldBy(change.next) });
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
    // It comes back in a partial sync, another with it.
    const again = await reconciler.sync(model.update([lbService(1), odd, lbService(3)], NODE), { full: false });
    expect(again).to.include({ mode: 'partial' });
    expect(again.rejected?.map((r) => r.item)).to.deep.equal(['default/svc-2 192.0.2.2 TCP/8080']);
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
