// The sync runner's ordering guarantees, driven by a clock the test moves by hand: which syncs
// happen, in what order, full or partial, and not before their time. Nothing sleeps.

import { expect } from 'chai';
import { SyncRunner, type SyncRequestInfo, type SyncRunnerOptions } from '../../src/sync/runner.js';
import { FakeClock, turn } from '../support/fake-clock.js';

function recorder(fail: (n: number) => boolean = () => false) {
  const calls: SyncRequestInfo[] = [];
  let release: (() => void) | undefined;
  let hold = false;
  return {
    calls,
    holdNext() {
      hold = true;
    },
    release() {
      release?.();
    },
    async sync(info: SyncRequestInfo) {
      calls.push(info);
      if (hold) {
        hold = false;
        await new Promise<void>((r) => (release = r));
      }
      if (fail(calls.length)) throw new Error(`sync ${calls.length} failed`);
    },
  };
}

/** Lets the event loop turn (time stands still) until `cond` holds. */
async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (cond()) return;
    await turn();
  }
  expect.fail(`${what} did not happen`);
}

/** A few turns with time standing still: whatever is due now has run. */
async function settle(): Promise<void> {
  for (let i = 0; i < 10; i++) await turn();
}

function runnerWith(
  r: ReturnType<typeof recorder>,
  options: Partial<SyncRunnerOptions> = {},
): { runner: SyncRunner; clock: FakeClock } {
  const clock = new FakeClock();
  const runner = new SyncRunner({
    minIntervalMs: 0,
    fullIntervalMs: 60_000,
    sync: (i) => r.sync(i),
    clock,
    random: () => 0,
    ...options,
  });
  return { runner, clock };
}

describe('sync runner', () => {
  it('starts with a full sync, then serves an isolated change with a partial sync', async () => {
    const r = recorder();
    const { runner, clock } = runnerWith(r);
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    await clock.advance(5);
    const requestedAt = clock.now();
    runner.request();
    await until(() => r.calls.length === 2, 'second sync');
    await runner.stop();
    expect(r.calls.map((c) => c.full)).to.deep.equal([true, false]);
    expect(r.calls[0]!.changedAt).to.equal(undefined);
    expect(r.calls[1]!.changedAt).to.equal(requestedAt);
  });

  it('coalesces a burst of changes during a sync into one more sync, minInterval after the last', async () => {
    const r = recorder();
    const { runner, clock } = runnerWith(r, { minIntervalMs: 20 });
    r.holdNext();
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    for (let i = 0; i < 50; i++) runner.request();
    r.release();
    await settle();
    await clock.advance(19);
    expect(r.calls, 'not before minInterval').to.have.lengthOf(1);
    await clock.advance(1);
    expect(r.calls).to.have.lengthOf(2);
    await clock.advance(1000);
    await runner.stop();
    expect(r.calls, 'fifty requests made one sync').to.have.lengthOf(2);
  });

  it('retries a failed sync as a full sync after the backoff and reports the error', async () => {
    const r = recorder((n) => n === 2);
    const errors: string[] = [];
    const { runner, clock } = runnerWith(r, {
      onError: (err, retryIn) => errors.push(`${err.message}, retry in ${retryIn}`),
    });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    runner.request();
    await until(() => errors.length === 1, 'the failure');
    await clock.advance(999);
    expect(r.calls, 'not before the backoff').to.have.lengthOf(2);
    await clock.advance(1);
    await until(() => r.calls.length === 3, 'retry');
    await runner.stop();
    expect(errors).to.deep.equal(['sync 2 failed, retry in 1000']);
    expect(r.calls.map((c) => c.full)).to.deep.equal([true, false, true]);
    expect(r.calls[2]!.changedAt, 'the retry still serves the failed change').to.equal(r.calls[1]!.changedAt);
  });

  it('spreads retries: up to a quarter longer than the backoff step, never shorter', async () => {
    const r = recorder((n) => n === 2);
    const errors: number[] = [];
    const { runner, clock } = runnerWith(r, { random: () => 0.8, onError: (_err, retryIn) => errors.push(retryIn) });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    runner.request();
    await until(() => errors.length === 1, 'the failure');
    expect(errors).to.deep.equal([1200]);
    await clock.advance(1199);
    expect(r.calls, 'not before the jittered delay').to.have.lengthOf(2);
    await clock.advance(1);
    await until(() => r.calls.length === 3, 'retry');
    await runner.stop();
  });

  it('runs a full resync every fullInterval', async () => {
    const r = recorder();
    const { runner, clock } = runnerWith(r, { fullIntervalMs: 30 });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    await clock.advance(29);
    expect(r.calls).to.have.lengthOf(1);
    await clock.advance(1);
    expect(r.calls).to.have.lengthOf(2);
    await clock.advance(30);
    await runner.stop();
    expect(r.calls).to.have.lengthOf(3);
    expect(r.calls.every((c) => c.full)).to.equal(true);
  });

  it('does not sync after stop, and leaves no timer behind', async () => {
    const r = recorder();
    const { runner, clock } = runnerWith(r);
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    await runner.stop();
    expect(clock.pending).to.equal(0);
    runner.request();
    await clock.advance(120_000);
    expect(r.calls).to.have.lengthOf(1);
  });

  it('with partialDuringFull, serves a change while a periodic full sync is under way', async () => {
    const r = recorder();
    const { runner } = runnerWith(r, { partialDuringFull: true });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    r.holdNext();
    runner.requestFull();
    await until(() => r.calls.length === 2, 'the held full sync');
    runner.request();
    await until(() => r.calls.length === 3, 'a partial sync beside the full one');
    r.release();
    await runner.stop();
    expect(r.calls.map((c) => c.full)).to.deep.equal([true, true, false]);
  });

  it('without partialDuringFull, or before any sync succeeded, a change waits for the full sync', async () => {
    for (const partialDuringFull of [false, true]) {
      const r = recorder();
      const { runner, clock } = runnerWith(r, { partialDuringFull });
      r.holdNext();
      runner.start();
      await until(() => r.calls.length === 1, 'the held first sync');
      runner.request();
      await clock.advance(1000);
      expect(r.calls, `partialDuringFull: ${partialDuringFull}`).to.have.lengthOf(1);
      r.release();
      await until(() => r.calls.length === 2, 'the change after the full sync');
      await runner.stop();
      expect(r.calls.map((c) => c.full)).to.deep.equal([true, false]);
    }
  });
});
