// Preloaded into the controller process by the benchmark (node --expose-gc --import ...):
// on SIGUSR2 a full garbage collection runs, then the process's memory figures are written to
// stderr as one line, so that resident memory can be read after garbage has been collected.

const MEMORY_LINE_PREFIX = 'bench-memory ';

process.on('SIGUSR2', () => {
  const gc = (globalThis as { gc?: () => void }).gc;
  gc?.();
  process.stderr.write(
    `${MEMORY_LINE_PREFIX}${JSON.stringify({ collected: gc !== undefined, ...process.memoryUsage() })}\n`,
  );
});
