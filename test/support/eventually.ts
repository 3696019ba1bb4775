// Waiting in tests for a condition, not for a time: the deadline only keeps a broken run from
// hanging (pass/fail never depends on timing beyond it).

/**
 * Polls `check` every `everyMs` until it returns a truthy value, and returns that value. A check
 * that throws counts as not yet; past `limitMs` the wait fails, naming `what` and the last error.
 */
export async function eventually<T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  limitMs = 30_000,
  everyMs = 100,
): Promise<T> {
  const deadline = Date.now() + limitMs;
  let last: unknown;
  for (;;) {
    try {
      const v = await check();
      if (v) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

/**
 * Polls `cond` every `everyMs` until it holds; past `limitMs` the wait fails with "timed out
 * waiting for `what`". Unlike eventually(), a condition that throws fails the wait at once.
 */
export async function waitFor(
  cond: () => boolean | Promise<boolean>,
  what: string,
  limitMs = 30_000,
  everyMs = 10,
): Promise<void> {
  const deadline = Date.now() + limitMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, everyMs));
  }
}
