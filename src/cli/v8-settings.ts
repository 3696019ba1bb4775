// V8 settings the controller makes from inside the process rather than on Node's command line.
//
// Node.js ships its own modules (node:https, node:tls, ...) with a code cache that V8 accepts only
// when the process runs with the flags the cache was made with. `--no-opt`, `--no-maglev` and
// `--expose-gc` on the command line each make V8 refuse it, so every built-in module the
// controller loads was compiled from source at each start (docs/operations.md, Resources, has
// what the react bench reads of it). Set once the process runs, they cost nothing at the start
// and do the same: the first two once every module the run needs is loaded (a built-in module
// loaded after a flag changed is compiled from source again) and before the first list is read,
// the controller's first hot code (main.ts); the third only when the collection is wanted.
// `--max-semi-space-size` does not touch the cache, and the heap is sized at the process's start:
// it stays on the command line (package.json's ipvsNodeController.nodeFlags).

import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

/**
 * Leaves V8's optimising compilers out: about 20 MiB less resident memory at 10,000 Services; the
 * controller's work is in JSON, the kernel and native code (docs/operations.md, Resources).
 */
export function leaveOptimisingCompilersOut(): void {
  setFlagsFromString('--no-opt');
  setFlagsFromString('--no-maglev');
}

type Collect = (options: { type: 'major'; execution: 'sync'; flavor: 'last-resort' }) => void;
let collect: Collect | undefined;

/**
 * One last-resort collection of the whole heap, which also shrinks the heap V8 grew and returns
 * its free pages (what `--expose-gc`'s gc() does): the function is made on the first call.
 */
export function collectEverything(): void {
  if (!collect) {
    setFlagsFromString('--expose-gc');
    collect = runInNewContext('gc') as Collect;
  }
  collect({ type: 'major', execution: 'sync', flavor: 'last-resort' });
}
