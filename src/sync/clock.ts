// The time source of the sync runner: the real one in the product, a driven one in its tests
// (test/support/fake-clock.ts), so that they assert ordering without sleeping.

export interface Clock {
  /** Milliseconds on a monotonic scale (performance.now()). */
  now(): number;
  setTimeout(callback: () => void, ms: number): unknown;
  clearTimeout(handle: unknown): void;
}

export const systemClock: Clock = {
  now: () => performance.now(),
  setTimeout: (callback, ms) => setTimeout(callback, ms),
  clearTimeout: (handle) => clearTimeout(handle as NodeJS.Timeout | undefined),
};
