// The controller's log: JSON lines on stdout in the shape log pipelines (Loki, Elasticsearch,
// Cloud Logging) read without mapping: `"level":"info"`, an ISO 8601 `time`, the error of a line
// in `err` ({type, message, code}) and never pasted into `msg`.

import { pino, type DestinationStream, type Logger } from 'pino';

export type { Logger } from 'pino';

export const PROGRAM = 'ipvs-node-controller';

export interface LoggerOptions {
  level: string;
  node: string;
}

/** An error as a log field: what an operator acts on. A stack only where it helps (see fatal). */
export function serializeError(value: unknown): Record<string, unknown> {
  if (!(value instanceof Error)) return { type: typeof value, message: String(value) };
  const out: Record<string, unknown> = { type: value.name, message: value.message };
  const code = (value as { code?: unknown }).code;
  if (typeof code === 'string' || typeof code === 'number') out.code = code;
  return out;
}

export function createLogger(options: LoggerOptions, destination?: DestinationStream): Logger {
  const settings = {
    name: PROGRAM,
    level: options.level,
    base: { node: options.node },
    timestamp: pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
    serializers: { err: serializeError },
  };
  return destination ? pino(settings, destination) : pino(settings);
}

/**
 * The end of a run that could not do its job: a `"level":"fatal"` JSON line on the log stream
 * (stdout, for the pipeline; omitted where stdout carries a ruleset), then the plain line on
 * stderr (for a person at a terminal, and the last line kubelet keeps as the termination message
 * with FallbackToLogsOnError). `unexpected`: an error nobody anticipated, logged with its stack.
 */
export function logFatal(logger: Logger | undefined, err: unknown, unexpected = false): void {
  const message = err instanceof Error ? err.message : String(err);
  if (logger) {
    const fields: Record<string, unknown> = { err, exitCode: 1 };
    if (unexpected && err instanceof Error) fields.stack = err.stack;
    logger.fatal(fields, unexpected ? 'unexpected error, exiting' : 'exiting');
  }
  const detail = unexpected ? `unexpected error: ${(err as Error)?.stack ?? message}` : message;
  writeStderr(`${PROGRAM}: ${detail}\n`);
}

/** stderr may be a closed pipe too: a failed write must not turn an exit into a crash. */
export function writeStderr(text: string): void {
  try {
    process.stderr.write(text);
  } catch {
    // nowhere left to say it
  }
}
