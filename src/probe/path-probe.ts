// One path tried from this node's network namespace, as a process of the node would use it: a TCP
// connect (opened, then closed at once without sending data) or one UDP datagram on a connected
// socket (PROBE_DATAGRAM), to a translated address and port; then the conntrack entry of that very
// connection, read by its original tuple, which shows whether it was translated (the reply comes
// from another address than the one dialled) and where to.

import { execa } from 'execa';
import * as dgram from 'node:dgram';
import * as net from 'node:net';
import { canonicalAddress } from '../model/ip.js';
import type { Protocol } from '../model/types.js';

/** What `check` and the continuous probe send in a UDP try: its endpoints see this one datagram. */
export const PROBE_DATAGRAM = 'ipvs-node-controller check\n';

export type PathOutcome = 'answered' | 'refused' | 'timed out' | 'unreachable' | 'failed';

/** A conntrack entry's tuples, as `conntrack -G` prints them. */
export interface ConntrackView {
  state?: string;
  original: { src: string; dst: string; sport: number; dport: number };
  reply: { src: string; dst: string; sport: number; dport: number };
  /** Whether no packet came back (conntrack's [UNREPLIED]). */
  unreplied: boolean;
  /** The reply comes from another address or port than the one dialled: the connection was translated. */
  translated: boolean;
  /** The entry's original destination is already the translated one: rewritten at the socket (eBPF). */
  atSocket?: true;
}

export interface PathTry {
  protocol: Protocol;
  address: string;
  port: number;
  outcome: PathOutcome;
  /** The connect's or the exchange's time. */
  ms: number;
  /** The error the socket gave, when it gave one. */
  error?: string;
  /** The conntrack entry of the connection; undefined with `conntrackProblem` when it could not be read. */
  conntrack?: ConntrackView;
  conntrackProblem?: string;
}

interface SocketTry {
  outcome: PathOutcome;
  ms: number;
  error?: string;
  local?: { address: string; port: number };
}

/** Tries one path and reads its conntrack entry while the socket is still open. */
export async function tryPath(
  protocol: Protocol,
  address: string,
  port: number,
  timeoutMs: number,
  /** Where the translation leads: a socket-level translation (eBPF) sends its packets there. */
  translatedTo?: { address: string; port: number },
  /** null: the socket's outcome alone (the continuous probe reads no conntrack entry). */
  readConntrack: ConntrackReader | null = readConntrackEntry,
): Promise<PathTry> {
  let entry: { view?: ConntrackView; problem?: string } = {};
  const read = async (local: { address: string; port: number }) => {
    if (!readConntrack) return;
    entry = await readConntrack(protocol, local, { address, port });
    if (entry.view || !translatedTo) return;
    // Rewritten at connect() or sendmsg(): the kernel's packets, and so the entry, carry the ClusterIP.
    const atSocket = await readConntrack(protocol, local, translatedTo);
    if (atSocket.view) entry = { view: { ...atSocket.view, translated: true, atSocket: true } };
  };
  const tried =
    protocol === 'TCP'
      ? await tryTcp(address, port, timeoutMs, read)
      : protocol === 'UDP'
        ? await tryUdp(address, port, timeoutMs, read)
        : { outcome: 'failed' as const, ms: 0, error: `${protocol} is not probed (TCP and UDP are)` };
  const result: PathTry = { protocol, address, port, outcome: tried.outcome, ms: tried.ms };
  if (tried.error !== undefined) result.error = tried.error;
  if (entry.view) result.conntrack = entry.view;
  else if (readConntrack && (protocol === 'TCP' || protocol === 'UDP'))
    result.conntrackProblem = entry.problem ?? 'no local port to look up';
  return result;
}

const UNREACHABLE = new Set(['EHOSTUNREACH', 'ENETUNREACH', 'EADDRNOTAVAIL', 'ENETDOWN']);

function outcomeOf(err: NodeJS.ErrnoException): PathOutcome {
  if (err.code === 'ECONNREFUSED') return 'refused';
  if (err.code !== undefined && UNREACHABLE.has(err.code)) return 'unreachable';
  return 'failed';
}

type LocalEnd = { address: string; port: number };

/**
 * One try's bookkeeping: the first outcome settles it (a timeout after `timeoutMs`); the
 * conntrack entry of the local end is read before the socket is closed.
 */
function settleOnce(
  timeoutMs: number,
  read: (local: LocalEnd) => Promise<void>,
  close: () => void,
  resolve: (t: SocketTry) => void,
): { finish: (outcome: PathOutcome, error?: string) => void; setLocal: (local: LocalEnd) => void } {
  const started = performance.now();
  let done = false;
  let local: LocalEnd | undefined;
  const finish = (outcome: PathOutcome, error?: string) => {
    if (done) return;
    done = true;
    clearTimeout(timer);
    const ms = performance.now() - started;
    const end = local;
    void (end ? read(end) : Promise.resolve()).then(() => {
      close();
      resolve({ outcome, ms, ...(error !== undefined ? { error } : {}), ...(end ? { local: end } : {}) });
    });
  };
  const timer = setTimeout(() => finish('timed out'), timeoutMs);
  return { finish, setLocal: (l) => (local = l) };
}

function tryTcp(address: string, port: number, timeoutMs: number, read: (local: LocalEnd) => Promise<void>) {
  return new Promise<SocketTry>((resolve) => {
    const socket = net.connect({ host: address, port });
    const { finish, setLocal } = settleOnce(timeoutMs, read, () => socket.destroy(), resolve);
    // Node.js connects to an address on the next tick; this tick comes after it, before any
    // answer (a refusal closes the socket, and its local end with it): the end the entry names.
    process.nextTick(() => {
      if (socket.localAddress && socket.localPort) setLocal({ address: socket.localAddress, port: socket.localPort });
    });
    socket.once('connect', () => finish('answered'));
    socket.once('error', (err: NodeJS.ErrnoException) => finish(outcomeOf(err), err.message));
  });
}

function tryUdp(address: string, port: number, timeoutMs: number, read: (local: LocalEnd) => Promise<void>) {
  return new Promise<SocketTry>((resolve) => {
    const socket = dgram.createSocket(net.isIPv6(address) ? 'udp6' : 'udp4');
    const { finish, setLocal } = settleOnce(timeoutMs, read, () => socket.close(), resolve);
    // A connected socket hears an ICMP port unreachable as ECONNREFUSED.
    socket.on('error', (err: NodeJS.ErrnoException) => finish(outcomeOf(err), err.message));
    socket.once('message', () => finish('answered'));
    socket.connect(port, address, () => {
      const a = socket.address();
      setLocal({ address: a.address, port: a.port });
      socket.send(PROBE_DATAGRAM, (err) => {
        if (err) finish(outcomeOf(err), err.message);
      });
    });
  });
}

export type ConntrackReader = (
  protocol: Protocol,
  local: { address: string; port: number },
  remote: { address: string; port: number },
) => Promise<{ view?: ConntrackView; problem?: string }>;

const CONNTRACK_TIMEOUT_MS = 2000;

/** The conntrack entry of one connection, by its original tuple, with the conntrack command. */
async function readConntrackEntry(
  protocol: Protocol,
  local: { address: string; port: number },
  remote: { address: string; port: number },
): Promise<{ view?: ConntrackView; problem?: string }> {
  // -G takes no family: the addresses give it.
  const args = ['-G', '-p', protocol.toLowerCase(), '-s', local.address, '-d', remote.address];
  args.push('--sport', String(local.port), '--dport', String(remote.port));
  const run = await execa('conntrack', args, { reject: false, timeout: CONNTRACK_TIMEOUT_MS, stdin: 'ignore' }).catch(
    (err: Error) => ({ exitCode: undefined, stdout: '', stderr: err.message, timedOut: false, failed: true }),
  );
  if (run.timedOut) return { problem: `conntrack -G did not answer within ${CONNTRACK_TIMEOUT_MS} ms` };
  const view = parseConntrackLine(String(run.stdout).split('\n')[0] ?? '');
  if (view) return { view };
  const why = String(run.stderr).trim().split('\n').at(-1) ?? '';
  return { problem: `conntrack -G found no entry${why ? `: ${why}` : ''}` };
}

/** Connections conntrack holds now to one address and port: every entry, and those translated. */
export interface TrackedConnections {
  connections: number;
  translated: number;
}

/** `conntrack -L`'s output read at most: about 20,000 entries. */
const TRACKED_MAX_BYTES = 4 * 1024 * 1024;

/**
 * The entries whose original destination is address:port (open connections, and closed TCP ones
 * still in TIME_WAIT), counted from `conntrack -L`; a problem when it cannot be read or holds
 * more than TRACKED_MAX_BYTES of them.
 */
export async function trackedConnections(
  protocol: Protocol,
  address: string,
  port: number,
): Promise<TrackedConnections | { problem: string }> {
  const family = net.isIPv6(address) ? 'ipv6' : 'ipv4';
  const args = ['-L', '-f', family, '-p', protocol.toLowerCase(), '-d', address, '--dport', String(port)];
  const run = await execa('conntrack', args, {
    reject: false,
    timeout: CONNTRACK_TIMEOUT_MS,
    maxBuffer: TRACKED_MAX_BYTES,
    stdin: 'ignore',
  }).catch((err: Error) => ({
    exitCode: undefined,
    stdout: '',
    stderr: err.message,
    timedOut: false,
    isMaxBuffer: false,
  }));
  if (run.timedOut) return { problem: `conntrack -L did not answer within ${CONNTRACK_TIMEOUT_MS} ms` };
  if ('isMaxBuffer' in run && run.isMaxBuffer)
    return { problem: `more entries than ${TRACKED_MAX_BYTES} bytes of conntrack -L` };
  if (run.exitCode !== 0) {
    return { problem: `conntrack -L failed: ${String(run.stderr).trim().split('\n').at(-1) ?? ''}` };
  }
  let connections = 0;
  let translated = 0;
  for (const line of String(run.stdout).split('\n')) {
    const view = parseConntrackLine(line);
    if (!view) continue;
    connections++;
    if (view.translated) translated++;
  }
  return { connections, translated };
}

/**
 * One line of `conntrack -L/-G` (the default output): the protocol, its number, the timeout, a
 * TCP state, then the original tuple's `src= dst= sport= dport=`, perhaps `[UNREPLIED]`, and the
 * reply tuple's. Undefined when the line has no two tuples.
 */
export function parseConntrackLine(line: string): ConntrackView | undefined {
  const tuples: Array<Record<string, string>> = [];
  let state: string | undefined;
  let unreplied = false;
  for (const word of line.trim().split(/\s+/)) {
    if (word === '[UNREPLIED]') unreplied = true;
    const eq = word.indexOf('=');
    if (eq < 0) {
      if (tuples.length === 0 && /^[A-Z_]+$/.test(word)) state = word;
      continue;
    }
    const key = word.slice(0, eq);
    const value = word.slice(eq + 1);
    if (key === 'src' && tuples.length < 2) tuples.push({});
    const tuple = tuples.at(-1);
    if (tuple && !(key in tuple)) tuple[key] = value;
  }
  const [o, r] = tuples;
  const tuple = (t: Record<string, string> | undefined) => {
    if (!t || t.src === undefined || t.dst === undefined) return undefined;
    const src = canonicalOrSelf(t.src);
    const dst = canonicalOrSelf(t.dst);
    return { src, dst, sport: Number(t.sport ?? 0), dport: Number(t.dport ?? 0) };
  };
  const original = tuple(o);
  const reply = tuple(r);
  if (!original || !reply) return undefined;
  const translated = reply.src !== original.dst || reply.sport !== original.dport;
  return { ...(state !== undefined ? { state } : {}), original, reply, unreplied, translated };
}

function canonicalOrSelf(text: string): string {
  return net.isIP(text) ? canonicalAddress(text) : text;
}
