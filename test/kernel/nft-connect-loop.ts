// Child process of nft-resync.test.ts, run inside a pod namespace: starts a TCP connection every
// INTERVAL_MS until its stdin closes, then prints, as one JSON line, how many were answered by
// EXPECTED and how many SYNs the kernel of this namespace retransmitted meanwhile. A first SYN
// lost to a table change is retransmitted: the kernel's own counter says so, no clock does.
// Prints `started` once one was answered.
// Usage: nft-connect-loop.js ADDRESS PORT EXPECTED INTERVAL_MS

import { readFileSync } from 'node:fs';
import * as net from 'node:net';

const [address, portText, expected, intervalText] = process.argv.slice(2);
const port = Number(portText);
const intervalMs = Number(intervalText);
let stopping = false;

/** TcpExt TCPSynRetrans of this network namespace (/proc/net/netstat: a header line, then values). */
function synRetransmits(): number {
  const lines = readFileSync('/proc/net/netstat', 'utf8').split('\n');
  const header = lines.findIndex((l) => l.startsWith('TcpExt:'));
  const names = lines[header]!.split(/\s+/);
  const values = lines[header + 1]!.split(/\s+/);
  const at = names.indexOf('TCPSynRetrans');
  if (at < 0) throw new Error('no TCPSynRetrans in /proc/net/netstat');
  return Number(values[at]);
}
const synRetransmitsAtStart = synRetransmits();

/** How long an answer may take once connected. */
const ANSWER_TIMEOUT_MS = 10_000;

interface Failure {
  startedMs: number;
  /** When it started, in ms since the epoch (performance.timeOrigin): comparable with the parent's clock. */
  at: number;
  answer: string;
  /** Time to connect (undefined: it never connected). */
  connectMs?: number;
}

const started = performance.now();
let total = 0;
let answered = 0;
const failures: Failure[] = [];
let open = 0;

function connectOnce(): void {
  total++;
  open++;
  const t0 = performance.now();
  let data = '';
  let done = false;
  let connectMs: number | undefined;
  const sock = net.connect({ host: address!, port });
  sock.on('connect', () => (connectMs = performance.now() - t0));
  const finish = (answer: string) => {
    if (done) return;
    done = true;
    open--;
    clearTimeout(timer);
    sock.destroy();
    if (answer === expected) {
      if (answered++ === 0) process.stdout.write('started\n');
    } else {
      failures.push({
        startedMs: Math.round(t0 - started),
        at: Math.round(performance.timeOrigin + t0),
        answer,
        connectMs: connectMs && Math.round(connectMs),
      });
    }
    if (stopping && open === 0) report();
  };
  const timer = setTimeout(() => finish('timeout'), ANSWER_TIMEOUT_MS);
  sock.on('data', (d) => (data += d.toString()));
  sock.on('end', () => finish(data.trim() || 'empty'));
  sock.on('error', (err: NodeJS.ErrnoException) => finish(`error:${err.code}`));
}

function report(): void {
  process.stdout.write(
    `${JSON.stringify({
      total,
      answered,
      failures: failures.slice(0, 20),
      failed: failures.length,
      synRetransmits: synRetransmits() - synRetransmitsAtStart,
    })}\n`,
  );
  process.exit(0);
}

const loop = setInterval(connectOnce, intervalMs);
process.stdin.resume();
process.stdin.on('end', () => {
  stopping = true;
  clearInterval(loop);
  if (open === 0) report();
});
