// Preloaded into the controller process by the benchmark (node --import ...): on SIGUSR2 a full
// garbage collection runs, then the process's memory figures are written to stderr as one line,
// so that resident memory can be read after garbage has been collected. The collection is made
// available at that moment (v8.setFlagsFromString), not by --expose-gc on the command line, which
// would make Node refuse its built-in modules' code cache and change what is measured
// (src/cli/v8-settings.ts).

import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';

const MEMORY_LINE_PREFIX = 'bench-memory ';

let gc: (() => void) | undefined;

process.on('SIGUSR2', () => {
  if (!gc) {
    setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as () => void;
  }
  gc();
  process.stderr.write(`${MEMORY_LINE_PREFIX}${JSON.stringify({ collected: true, ...process.memoryUsage() })}\n`);
});
