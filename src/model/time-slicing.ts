// Time slicing of the model's work. The model computes as a generator (Steps) that yields where it
// may pause: counted by a WorkMeter, every WORK_PER_LOOK units of work (claims, records, keys).
// update() runs the steps to the end at once; updateCooperatively() gives the event loop a turn
// every SLICE_MS, so that /healthz and the watches are served while a large change is derived.
// Pausing never changes the result: only when it comes.

/** A step of the computation: yields where it may pause, returns its result. */
export type Steps<T> = Generator<void, T, void>;

/** Units of work (claims, records, keys) between looks at the clock in a cooperative update. */
const WORK_PER_LOOK = 2048;
/** A cooperative update gives the event loop a turn after this much work. */
const SLICE_MS = 10;

/** Counts the work done; says when it is time to yield. */
export class WorkMeter {
  private work = 0;

  /** True every WORK_PER_LOOK units of work: the moment to yield. */
  worked(units = 1): boolean {
    this.work += units;
    if (this.work < WORK_PER_LOOK) return false;
    this.work = 0;
    return true;
  }
}

/** Runs the steps to the end, without a pause. */
export function runToEnd<T>(steps: Steps<T>): T {
  for (;;) {
    const step = steps.next();
    if (step.done) return step.value;
  }
}

/** Runs the steps, giving the event loop a turn every SLICE_MS. */
export async function runInSlices<T>(steps: Steps<T>): Promise<T> {
  let sliceStart = performance.now();
  for (;;) {
    const step = steps.next();
    if (step.done) return step.value;
    if (performance.now() - sliceStart >= SLICE_MS) {
      await new Promise((resolve) => setImmediate(resolve));
      sliceStart = performance.now();
    }
  }
}
