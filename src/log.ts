// The controller's log, in Kubernetes structured logging style (KEP-1602): each message is a
// constant sentence ("Service address skipped"), the values are fields, a Service is
// `service: {namespace, name}` and an error is `err` ({type, message, code}), never pasted into
// the message. Two formats, chosen with --log-format:
//
// - `json` (default): pino's JSON lines, in the shape log pipelines (Loki, Elasticsearch, Cloud
//   Logging) read without mapping: `"level":"info"`, an ISO 8601 `time`, `name`, `node`, `msg`,
//   then the fields.
// - `text`: klog's text format, what kube-proxy and the kubelet write:
//   `I1125 01:02:03.456000   12345 ipvs-node-controller] "Synced" node="worker-1" mode="full" ms=3`.

import { pino, type DestinationStream, type Logger } from 'pino';

export type { Logger } from 'pino';

export const PROGRAM = 'ipvs-node-controller';

export const LOG_FORMATS = ['json', 'text'] as const;
export type LogFormat = (typeof LOG_FORMATS)[number];

export interface LoggerOptions {
  level: string;
  node: string;
  /** Default `json`. */
  format?: LogFormat;
}

/** A namespaced object as a log field, as klog's KObj: `{namespace, name}`; text shows `namespace/name`. */
export interface ObjectRef {
  namespace: string;
  name: string;
}

/** The model's `namespace/name` key as a log field (split at the first '/'). */
export function kobj(key: string): ObjectRef {
  const slash = key.indexOf('/');
  return slash < 0 ? { namespace: '', name: key } : { namespace: key.slice(0, slash), name: key.slice(slash + 1) };
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
  const text = options.format === 'text';
  const settings = {
    name: PROGRAM,
    level: options.level,
    base: { node: options.node },
    // Text lines carry the time in their header: a number is cheaper to write and to read back.
    timestamp: text ? pino.stdTimeFunctions.epochTime : pino.stdTimeFunctions.isoTime,
    formatters: { level: (label: string) => ({ level: label }) },
    serializers: { err: serializeError },
    ...(text ? { hooks: { streamWrite: jsonToKlogText } } : {}),
  };
  return destination ? pino(settings, destination) : pino(settings);
}

// ---- klog's text format ----------------------------------------------------------------------

const SEVERITY: Record<string, string> = { trace: 'I', debug: 'I', info: 'I', warn: 'W', error: 'E', fatal: 'F' };
/** klog has no debug level, only verbosity: debug lines are info lines with v=4 (as kube-proxy's -v=4). */
const VERBOSITY: Record<string, number> = { trace: 5, debug: 4 };
/** What the header carries, or what only the JSON needs. */
const HEADER_KEYS = new Set(['level', 'time', 'msg', 'name', 'pid', 'hostname']);

/** One pino JSON line (with its newline) as one klog text line. */
export function jsonToKlogText(line: string): string {
  let record: Record<string, unknown>;
  try {
    record = JSON.parse(line) as Record<string, unknown>;
  } catch {
    return line;
  }
  const level = String(record.level);
  const time = typeof record.time === 'number' ? record.time : Date.parse(String(record.time));
  let out = `${klogHeader(SEVERITY[level] ?? 'I', new Date(time), process.pid)}${quoteGo(String(record.msg ?? ''))}`;
  const v = VERBOSITY[level];
  if (v !== undefined) out += ` v=${v}`;
  for (const [key, value] of Object.entries(record)) {
    if (HEADER_KEYS.has(key) || value === undefined) continue;
    out += ` ${key}=${klogValue(key, value)}`;
  }
  return `${out}\n`;
}

/** `Lmmdd hh:mm:ss.uuuuuu threadid file:line] `, with the program in place of file:line; UTC. */
export function klogHeader(severity: string, time: Date, pid: number): string {
  const two = (n: number) => String(n).padStart(2, '0');
  const date = `${two(time.getUTCMonth() + 1)}${two(time.getUTCDate())}`;
  const clock = `${two(time.getUTCHours())}:${two(time.getUTCMinutes())}:${two(time.getUTCSeconds())}`;
  const micros = `${String(time.getUTCMilliseconds()).padStart(3, '0')}000`;
  return `${severity}${date} ${clock}.${micros} ${String(pid).padStart(7, ' ')} ${PROGRAM}] `;
}

/**
 * A value as klog's text format writes it: strings quoted, numbers and booleans bare, an object
 * reference (KObj) as "namespace/name", an error as its quoted message, other objects as JSON.
 */
export function klogValue(key: string, value: unknown): string {
  if (typeof value === 'string') return quoteGo(value);
  if (typeof value === 'number' || typeof value === 'boolean') return String(value);
  if (value === null) return 'null';
  if (isObjectRef(value)) return quoteGo(value.namespace ? `${value.namespace}/${value.name}` : value.name);
  if (key === 'err' && typeof value === 'object' && typeof (value as { message?: unknown }).message === 'string') {
    return quoteGo((value as { message: string }).message);
  }
  return JSON.stringify(value);
}

function isObjectRef(value: unknown): value is ObjectRef {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const keys = Object.keys(value);
  const o = value as Record<string, unknown>;
  return keys.length === 2 && typeof o.namespace === 'string' && typeof o.name === 'string';
}

const GO_ESCAPES: Record<string, string> = {
  '\x07': '\\a',
  '\b': '\\b',
  '\f': '\\f',
  '\n': '\\n',
  '\r': '\\r',
  '\t': '\\t',
  '\v': '\\v',
  '\\': '\\\\',
  '"': '\\"',
};

/** Go's unicode.IsPrint: letters, marks, numbers, punctuation, symbols and the ASCII space. */
const GO_PRINTABLE = /^[\p{L}\p{M}\p{N}\p{P}\p{S} ]$/u;

/** A string as Go's strconv.Quote writes it: printable characters as they are, the rest escaped. */
export function quoteGo(text: string): string {
  if (/^[ !#-[\]-~]*$/.test(text)) return `"${text}"`; // printable ASCII without " and \
  let out = '"';
  for (const ch of text) {
    const escape = GO_ESCAPES[ch];
    if (escape) out += escape;
    else if (GO_PRINTABLE.test(ch)) out += ch;
    else {
      const cp = ch.codePointAt(0)!;
      if (cp >= 0xd800 && cp <= 0xdfff)
        out += '\\ufffd'; // a lone surrogate: Go writes U+FFFD
      else if (cp < 0x80) out += `\\x${cp.toString(16).padStart(2, '0')}`;
      else if (cp < 0x10000) out += `\\u${cp.toString(16).padStart(4, '0')}`;
      else out += `\\U${cp.toString(16).padStart(8, '0')}`;
    }
  }
  return `${out}"`;
}

/**
 * The end of a run that could not do its job: a fatal line on the log stream (stdout, for the
 * pipeline; omitted where stdout carries a ruleset), then the plain line on stderr (for a person
 * at a terminal, and the last line kubelet keeps as the termination message with
 * FallbackToLogsOnError). `unexpected`: an error nobody anticipated, logged with its stack.
 */
export function logFatal(logger: Logger | undefined, err: unknown, unexpected = false): void {
  const message = err instanceof Error ? err.message : String(err);
  if (logger) {
    const fields: Record<string, unknown> = { err, exitCode: 1 };
    if (unexpected && err instanceof Error) fields.stack = err.stack;
    logger.fatal(fields, unexpected ? 'Unexpected error, exiting' : 'Exiting');
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
