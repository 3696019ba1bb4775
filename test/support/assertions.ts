// What chai's `expect` does not say by itself: what a promise rejected with.

import { expect } from 'chai';

type ErrorClass<T extends Error> = abstract new (...args: never[]) => T;

/**
 * Awaits `promise` (or the promise `run` returns) and returns the error it rejected with; fails
 * the test when it fulfils or rejects with something that is not an Error (or not a `type`).
 *
 *   expect((await rejectionOf(httpGet(url))).message).to.match(/ECONNREFUSED/);
 *   const err = await rejectionOf(backend.sync(desired), BackendError);
 */
export async function rejectionOf<T extends Error = Error>(
  promise: Promise<unknown> | (() => Promise<unknown>),
  type: ErrorClass<T> = Error as unknown as ErrorClass<T>,
  message?: string,
): Promise<T> {
  let value: unknown;
  try {
    value = await (typeof promise === 'function' ? promise() : promise);
  } catch (reason) {
    expect(reason, message).to.be.instanceOf(type);
    return reason as T;
  }
  return expect.fail(
    `${message ? `${message}: ` : ''}expected a rejection, the promise fulfilled with ${String(value)}`,
  );
}
