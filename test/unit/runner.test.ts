// The sync runner's ordering guarantees, driven with real (short) timers. Nothing here asserts a
// duration: only which syncs happen, in what order, full or partial.

import assert from 'node:assert/strict';
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
  assert.fail(`timed out waiting for ${what}`);
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
    assert.deepEqual(
      r.calls.map((c) => c.full),
      [true, false],
    );
    assert.equal(r.calls[0]!.changedAt, undefined);
    assert.equal(typeof r.calls[1]!.changedAt, 'number');
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
    assert.equal(r.calls.length, 2, 'fifty requests made one sync');
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
    assert.deepEqual(errors, ['sync 2 failed']);
    assert.deepEqual(
      r.calls.map((c) => c.full),
      [true, false, true],
    );
    assert.equal(r.calls[2]!.changedAt, r.calls[1]!.changedAt, 'the retry still serves the failed change');
  });

  it('runs a full resync every fullInterval', async () => {
    const r = recorder();
    const runner = new SyncRunner({ minIntervalMs: 0, fullIntervalMs: 30, sync: (i) => r.sync(i) });
    runner.start();
    await until(() => r.calls.length >= 3, 'periodic syncs');
    await runner.stop();
    assert.ok(r.calls.every((c) => c.full));
  });

  it('does not sync after stop', async () => {
    const r = recorder();
    const runner = new SyncRunner({ minIntervalMs: 0, fullIntervalMs: 60_000, sync: (i) => r.sync(i) });
    runner.start();
    await until(() => r.calls.length === 1, 'first sync');
    await runner.stop();
    runner.request();
    await sleep(30);
    assert.equal(r.calls.length, 1);
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
    assert.deepEqual(
      r.calls.map((c) => c.full),
      [true, true, false],
    );
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
      assert.equal(r.calls.length, 1, `partialDuringFull: ${partialDuringFull}`);
      r.release();
      await until(() => r.calls.length === 2, 'the change after the full sync');
      await runner.stop();
      assert.deepEqual(
        r.calls.map((c) => c.full),
        [true, false],
      );
    }
  });
});
