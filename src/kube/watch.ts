// One watch request to the API server, streamed over node:https with the credentials and TLS
// settings of a kubeconfig (client-node's applyToHTTPSOptions, as request.ts). The body is
// newline-delimited JSON: each complete line is parsed and handed over, a line that is not JSON
// is reported (not dropped unseen), and a line longer than a cap ends the stream as broken, so
// that a server or proxy gone mad cannot make the process buffer without bound.
//
// client-node's own Watch is not used: it streams through node-fetch, whose URL parser
// (whatwg-url, with tr46's Unicode tables) costs megabytes of memory for one streaming GET, and
// it dropped lines that are not JSON without a word. The bundle leaves node-fetch out altogether
// (scripts/bundle-kubeconfig.mjs).

import http from 'node:http';
import https from 'node:https';
import type { KubeConfig } from '@kubernetes/client-node/dist/config.js';
import { formatSize } from '../bytes.js';
import { MAX_RESPONSE_BYTES, requestOptions } from './request.js';

/** Longest line accepted (bytes): one event holds one object, as large as a response may be (request.ts). */
export const MAX_WATCH_LINE_BYTES = MAX_RESPONSE_BYTES;
/** Most of an error response's body read for its message. */
const MAX_ERROR_BODY_BYTES = 64 << 10;
/** TCP keepalive on the watch connection: a dead peer is noticed even while the stream is quiet. */
const TCP_KEEPALIVE_MS = 30_000;

export interface WatchStreamHandlers {
  /** The API server accepted the watch (HTTP 200): events follow. */
  onOpen?(): void;
  /** One line of the stream, parsed as JSON. */
  onValue(value: unknown): void;
  /** One line that is not JSON (blank lines are skipped, not reported). */
  onUndecodable(problem: string): void;
  /**
   * The stream is over: `err` undefined when the server ended it (its timeout), else why, with
   * `statusCode` when the server answered with an HTTP error status. Called once, and never after
   * the returned abort function was called.
   */
  onEnd(err?: WatchStreamError): void;
}

export class WatchStreamError extends Error {
  constructor(
    message: string,
    readonly statusCode?: number,
  ) {
    super(message);
  }
}

/** A line grew past MAX_WATCH_LINE_BYTES: it was not read further, and the stream is over. */
export class WatchLineTooLongError extends WatchStreamError {
  constructor(path: string) {
    super(`watching ${path}: a watch line longer than ${formatSize(MAX_WATCH_LINE_BYTES)}: the stream is broken`);
    this.name = 'WatchLineTooLongError';
  }
}

/**
 * Starts a watch of `path` (e.g. /api/v1/services) with `query` (resourceVersion,
 * timeoutSeconds, ...; watch=true is added). Returns a function that ends it at once: the socket
 * is destroyed and no handler is called any more.
 */
export function startWatch(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | number | boolean | undefined>,
  handlers: WatchStreamHandlers,
): () => void {
  let over = false;
  let request: http.ClientRequest | undefined;
  const end = (err?: WatchStreamError) => {
    if (over) return;
    over = true;
    request?.destroy();
    handlers.onEnd(err);
  };
  const abort = () => {
    if (over) return;
    over = true;
    request?.destroy();
  };

  open(kc, path, query).then(
    ({ url, options }) => {
      if (over) return;
      const client = url.protocol === 'http:' ? http : https;
      const req = client.request(url, options, (response) => {
        if (over) return;
        if (response.statusCode !== 200) {
          readError(response, url.pathname).then(end, () =>
            end(new WatchStreamError(`watching ${url.pathname}: HTTP ${response.statusCode}`, response.statusCode)),
          );
          return;
        }
        try {
          handlers.onOpen?.();
        } catch {
          // an observer's failure must not end the watch
        }
        readLines(response, url.pathname, handlers, end, () => over);
      });
      request = req;
      req.on('socket', (socket) => socket.setKeepAlive(true, TCP_KEEPALIVE_MS));
      req.on('error', (err) => end(new WatchStreamError(`watching ${url.pathname}: ${err.message}`)));
      req.end();
    },
    (err: unknown) =>
      end(new WatchStreamError(`watching ${path}: ${err instanceof Error ? err.message : String(err)}`)),
  );
  return abort;
}

/** The URL and request options: credentials and TLS of the kubeconfig, on a keep-alive agent (request.ts). */
async function open(
  kc: KubeConfig,
  path: string,
  query: Record<string, string | number | boolean | undefined>,
): Promise<{ url: URL; options: https.RequestOptions }> {
  const cluster = kc.getCurrentCluster();
  if (!cluster) throw new Error('the kubeconfig has no current cluster');
  const url = new URL(cluster.server.replace(/\/+$/, '') + path);
  url.searchParams.set('watch', 'true');
  for (const [key, value] of Object.entries(query)) {
    if (value !== undefined) url.searchParams.set(key, String(value));
  }
  const options = await requestOptions(kc, url);
  options.method = 'GET';
  options.headers = { ...options.headers, Accept: 'application/json' };
  return { url, options };
}

/** An error status as an error carrying the server's message (a metav1.Status body) and code. */
async function readError(response: http.IncomingMessage, path: string): Promise<WatchStreamError> {
  const status = response.statusCode ?? 0;
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of response as AsyncIterable<Buffer>) {
    chunks.push(chunk);
    size += chunk.length;
    // A Status is small: the rest of a longer body is not waited for.
    if (size >= MAX_ERROR_BODY_BYTES) break;
  }
  let message: unknown;
  try {
    message = (JSON.parse(Buffer.concat(chunks).toString('utf8')) as { message?: unknown } | null)?.message;
  } catch {
    // not a Status: the HTTP status says it all
  }
  const text = typeof message === 'string' && message !== '' ? message : `HTTP ${status}`;
  return new WatchStreamError(`watching ${path}: ${text}`, status);
}

/**
 * Newline-delimited text from chunks split anywhere. Lines are cut at the newline byte, which
 * never occurs inside a multi-byte UTF-8 character, so a line's bytes are decoded once, whole: a
 * line inside one chunk straight from it, a line across chunks from its pieces joined. A line may
 * hold at most `maxLineBytes` bytes (its newline not counted).
 */
export class LineSplitter {
  /** The pieces of the line not yet ended, from earlier chunks. */
  private pending: Buffer[] = [];
  private lineBytes = 0;

  constructor(private readonly maxLineBytes: number = MAX_WATCH_LINE_BYTES) {}

  /**
   * Feeds one chunk; `onLine` gets each line it completes, and may return false to stop early
   * (the rest of the chunk is dropped). Returns false when a line grew past the cap: the
   * stream is broken, and nothing more may be fed.
   */
  push(chunk: Buffer, onLine: (line: string) => boolean | void): boolean {
    let start = 0;
    for (let nl = chunk.indexOf(10); nl !== -1; nl = chunk.indexOf(10, start)) {
      let line: string;
      if (this.pending.length === 0) {
        if (nl - start > this.maxLineBytes) return false;
        line = chunk.toString('utf8', start, nl);
      } else {
        if (this.lineBytes + (nl - start) > this.maxLineBytes) return false;
        this.pending.push(chunk.subarray(start, nl));
        line = Buffer.concat(this.pending).toString('utf8');
        this.pending = [];
        this.lineBytes = 0;
      }
      start = nl + 1;
      if (onLine(line) === false) return true;
    }
    if (start === chunk.length) return true;
    this.lineBytes += chunk.length - start;
    if (this.lineBytes > this.maxLineBytes) return false;
    // A copy: the chunk's memory is not kept alive by the piece of it that waits.
    this.pending.push(Buffer.from(chunk.subarray(start)));
    return true;
  }

  /** What is left after the last newline (the stream ended without one). */
  end(): string {
    const rest = Buffer.concat(this.pending).toString('utf8');
    this.pending = [];
    this.lineBytes = 0;
    return rest;
  }
}

/** Hands each line of a 200 response over as it completes, then the end of the stream. */
function readLines(
  response: http.IncomingMessage,
  path: string,
  handlers: WatchStreamHandlers,
  end: (err?: WatchStreamError) => void,
  over: () => boolean,
): void {
  const lines = new LineSplitter();
  const emit = (text: string) => {
    if (over()) return false;
    // Blank lines carry nothing (a proxy's keep-alive, a stray CRLF): skipped, not counted.
    if (/^\s*$/.test(text)) return true;
    let value: unknown;
    let parsed = true;
    try {
      value = JSON.parse(text);
    } catch {
      parsed = false;
    }
    try {
      if (parsed) handlers.onValue(value);
      else handlers.onUndecodable(`not JSON: ${JSON.stringify(text.slice(0, 40))}${text.length > 40 ? '...' : ''}`);
    } catch (err) {
      // Nothing may throw out of a stream's event handler: a handler's failure ends the watch.
      end(new WatchStreamError(`handling a watch line: ${err instanceof Error ? err.message : String(err)}`));
    }
    return !over();
  };

  response.on('data', (chunk: Buffer) => {
    if (over()) return;
    if (!lines.push(chunk, emit)) end(new WatchLineTooLongError(path));
  });
  response.on('end', () => {
    if (over()) return;
    // The API server ends every line; a last one without its newline is still a line.
    emit(lines.end());
    end();
  });
  // A reset, or a connection closed in the middle of the stream: 'close' without 'end'.
  response.on('close', () => {
    if (!response.complete) end(new WatchStreamError('the watch connection was closed before the stream ended'));
  });
  response.on('error', (err) => end(new WatchStreamError(`the watch stream failed: ${err.message}`)));
}
