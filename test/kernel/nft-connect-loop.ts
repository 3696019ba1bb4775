// Child process of nft-resync.test.ts, run inside a pod namespace: starts a TCP connection every
// INTERVAL_MS until its stdin closes, then prints, as one JSON line, how many connected within
// BOUND_MS and were answered by EXPECTED. A first SYN lost to a table change waits for the 1 s
// retransmit: its connect takes over the bound. The answer itself may take longer (the server
// runs in the test process, which is busy syncing). Prints `started` once one was answered.
// Usage: nft-connect-loop.js ADDRESS PORT EXPECTED INTERVAL_MS BOUND_MS

import * as net from 'node:net';

const [address, portText, expected, intervalText, boundText] = process.argv.slice(2);
const port = Number(portText);
const intervalMs = Number(intervalText);
const boundMs = Number(boundText);
let stopping = false;

/** How long an answer may take once connected. */
const ANSWER_TIMEOUT_MS = 10_000;

interface Failure {
  startedMs: number;
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
    if (answer === expected && connectMs !== undefined && connectMs <= boundMs) {
      if (answered++ === 0) process.stdout.write('started\n');
    } else {
      failures.push({ startedMs: Math.round(t0 - started), answer, connectMs: connectMs && Math.round(connectMs) });
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
    `${JSON.stringify({ total, answered, failures: failures.slice(0, 20), failed: failures.length })}\n`,
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
