// The sync runner's ordering guarantees, driven with real (short) timers. Nothing here asserts a
// duration: only which syncs happen, in what order, full or partial.

import { expect } from 'chai';
import { setTimeout as sleep } from 'node:timers/promises';
import { SyncRunner, type SyncRequestInfo } from '../../src/sync/runner.js';

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

async function until(cond: () => boolean, what: string): Promise<void> {
  for (let i = 0; i < 2000; i++) {
    if (cond()) return;
    await sleep(5);
  }
  expect.fail(`timed out waiting for ${what}`);
}

describe('sync runner', () => {
  it('starts with a full sync, then serves an isolated change with a partial sync', async () => {
    const r = recorder();
    const runner = new SyncRunner({ minIntervalMs: 0, fullIntervalMs: 60_000, sync: (i) => r.sync(i) });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    runner.request();
    await until(() => r.calls.length === 2, 'second sync');
    await runner.stop();
    expect(r.calls.map((c) => c.full)).to.deep.equal([true, false]);
    expect(r.calls[0]!.changedAt).to.equal(undefined);
    expect(typeof r.calls[1]!.changedAt).to.equal('number');
  });

  it('coalesces a burst of changes during a sync into one more sync', async () => {
    const r = recorder();
    const runner = new SyncRunner({ minIntervalMs: 20, fullIntervalMs: 60_000, sync: (i) => r.sync(i) });
    r.holdNext();
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    for (let i = 0; i < 50; i++) runner.request();
    r.release();
    await until(() => r.calls.length === 2, 'coalesced sync');
    await sleep(80);
    await runner.stop();
    expect(r.calls, 'fifty requests made one sync').to.have.lengthOf(2);
  });

  it('retries a failed sync as a full sync and reports the error', async () => {
    const r = recorder((n) => n === 2);
    const errors: string[] = [];
    const runner = new SyncRunner({
      minIntervalMs: 0,
      fullIntervalMs: 60_000,
      sync: (i) => r.sync(i),
      onError: (err) => errors.push(err.message),
    });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    runner.request();
    await until(() => r.calls.length === 3, 'retry');
    await runner.stop();
    expect(errors).to.deep.equal(['sync 2 failed']);
    expect(r.calls.map((c) => c.full)).to.deep.equal([true, false, true]);
    expect(r.calls[2]!.changedAt, 'the retry still serves the failed change').to.equal(r.calls[1]!.changedAt);
  });

  it('runs a full resync every fullInterval', async () => {
    const r = recorder();
    const runner = new SyncRunner({ minIntervalMs: 0, fullIntervalMs: 30, sync: (i) => r.sync(i) });
    runner.start();
    await until(() => r.calls.length >= 3, 'periodic syncs');
    await runner.stop();
    expect(r.calls.every((c) => c.full)).to.equal(true);
  });

  it('does not sync after stop', async () => {
    const r = recorder();
    const runner = new SyncRunner({ minIntervalMs: 0, fullIntervalMs: 60_000, sync: (i) => r.sync(i) });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    await runner.stop();
    runner.request();
    await sleep(30);
    expect(r.calls).to.have.lengthOf(1);
  });

  it('with partialDuringFull, serves a change while a periodic full sync is under way', async () => {
    const r = recorder();
    const runner = new SyncRunner({
      minIntervalMs: 0,
      fullIntervalMs: 60_000,
      partialDuringFull: true,
      sync: (i) => r.sync(i),
    });
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
      const runner = new SyncRunner({
        minIntervalMs: 0,
        fullIntervalMs: 60_000,
        partialDuringFull,
        sync: (i) => r.sync(i),
      });
      r.holdNext();
      runner.start();
      await until(() => r.calls.length === 1, 'the held first sync');
      runner.request();
      await sleep(30);
      expect(r.calls, `partialDuringFull: ${partialDuringFull}`).to.have.lengthOf(1);
      r.release();
      await until(() => r.calls.length === 2, 'the change after the full sync');
      await runner.stop();
      expect(r.calls.map((c) => c.full)).to.deep.equal([true, false]);
    }
  });
});
