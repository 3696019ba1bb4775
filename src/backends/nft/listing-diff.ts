// Compares a table listing (`nft -j list table`) with the map elements we programmed, off the
// event loop: at 50,000 elements parsing and comparing the listing takes 200 ms, and changes must
// not wait for it. The worker matches elements by their printed form (address, protocol, port,
// value, comment; addresses read as the model writes them, model/ip.ts listedAddress: nft prints
// `::1.2.3.4` for `::102:304`); what does not match exactly (drift) comes back as a small residue
// for the backend to judge with the model's own parsing.
//
// The worker's code is a string so that it survives bundling (one file, renamed identifiers).

import { Worker } from 'node:worker_threads';
import { LISTED_ADDRESS_BODY } from '../../model/ip.js';
import type { Entry } from '../../model/types.js';
import {
  MAX_LISTING_BYTES,
  NftError,
  NftTimeoutError,
  isNoSuchObject,
  listingTooLarge,
  nftErrorMessage,
} from './executor.js';
import { sourceChainName } from './render.js';

/** What the comparison found; `unmatched` are indices into the expected lines. */
export interface ListingDiff {
  /** Rule expressions (JSON) by chain, in listing order. */
  rules: Record<string, string[]>;
  /** Expected elements not found with the same value and comment. */
  unmatched: number[];
  /** Listed map elements (`[key, value]` as in the listing) that matched no expected line. */
  residue: unknown[];
  /** With a key set: whether each of `residue` has its key in the key set too. */
  residueInKeySet?: boolean[];
  /** With a key set: its keys (address, protocol, port as listed) that are neither expected nor in the map. */
  keyResidue?: unknown[][];
  /**
   * The source-range check map's and own-address set's elements, when the table has them:
   * checks as `ip|proto|port|chain`, own addresses as `ip|proto|port|source` (sourceRangeLines
   * writes what is expected).
   */
  sourceRanges?: { checks: string[]; own: string[] };
  /** The names of the table's chains. */
  chains?: string[];
}

/**
 * The line an entry's element is expected as: `ip|proto|port\tvalue\tcomment`, as the worker
 * writes a listed element (the protocol as nft prints it, in lower case).
 */
export function expectedLine(e: Entry): string {
  return `${e.externalIp}|${e.protocol.toLowerCase()}|${e.port}\t${e.clusterIp}\t${e.service}`;
}

/** The source-range elements `entries` need, as ListingDiff.sourceRanges lists them, sorted. */
export function sourceRangeLines(entries: readonly Entry[]): { checks: string[]; own: string[] } {
  const checks: string[] = [];
  const own: string[] = [];
  for (const e of entries) {
    if (!e.sourceRanges) continue;
    const key = `${e.externalIp}|${e.protocol.toLowerCase()}|${e.port}`;
    checks.push(`${key}|${sourceChainName(e.service)}`);
    own.push(`${key}|${e.externalIp}`);
  }
  return { checks: checks.sort(), own: own.sort() };
}

/** Entries per turn of the event loop while their lines are written. */
const LINES_PER_TURN = 2_000;

/** The expected lines of `entries`, one per line, written a slice per turn of the event loop. */
export async function expectedLines(entries: readonly Entry[]): Promise<string> {
  const lines: string[] = [];
  for (let i = 0; i < entries.length; i++) {
    if (i > 0 && i % LINES_PER_TURN === 0) await new Promise((resolve) => setImmediate(resolve));
    lines.push(expectedLine(entries[i]!));
  }
  return lines.join('\n');
}

/**
 * function(listing, expected, mapName, keySetName) -> ListingDiff; throws on an unexpected
 * element. With a key set ('' for none), an expected line matches only when its key is also in
 * the key set. Listed addresses are read as the model writes them (listedAddress, model/ip.ts).
 */
const DIFF_BODY = `
  const listedAddress = function (text) {${LISTED_ADDRESS_BODY}};
  // A concatenation's fields joined by |, its addresses as the model writes them.
  const keyText = (parts) => {
    let text = listedAddress(parts[0]);
    for (let i = 1; i < parts.length; i++) text += '|' + listedAddress(parts[i]);
    return text;
  };
  const doc = JSON.parse(listing);
  let sourceRanges;
  const chains = [];
  const ranges = () => (sourceRanges = sourceRanges || { checks: [], own: [] });
  const keySet = keySetName ? new Map() : undefined;
  const mapKeys = keySetName ? new Set() : undefined;
  const residueKeys = [];
  const partsOf = (k) => {
    const parts = (k && k.elem ? k.elem.val : k).concat;
    if (!Array.isArray(parts) || parts.length !== 3) throw new Error('unexpected key ' + JSON.stringify(k));
    return parts;
  };
  const rules = {};
  const lines = expected === '' ? [] : expected.split('\\n');
  const byKey = new Map();
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    byKey.set(line.slice(0, line.indexOf('\\t')), i);
  }
  const matched = new Uint8Array(lines.length);
  const residue = [];
  for (const item of doc.nftables || []) {
    const rule = item.rule;
    if (rule && rule.chain !== undefined) (rules[rule.chain] || (rules[rule.chain] = [])).push(JSON.stringify(rule.expr));
    if (item.chain && typeof item.chain.name === 'string') chains.push(item.chain.name);
    const set = item.set;
    if (set && set.name === 'source-range-own-addresses') {
      for (const k of set.elem || []) {
        const parts = (k && k.elem ? k.elem.val : k).concat;
        if (!Array.isArray(parts)) throw new Error('unexpected element ' + JSON.stringify(k));
        ranges().own.push(keyText(parts));
      }
      continue;
    }
    if (item.map && item.map.name === 'source-range-checks') {
      for (const pair of item.map.elem || []) {
        const parts = Array.isArray(pair) && pair[0] && pair[0].concat;
        const target = Array.isArray(pair) && pair[1] && pair[1].jump && pair[1].jump.target;
        if (!Array.isArray(parts)) throw new Error('unexpected element ' + JSON.stringify(pair));
        ranges().checks.push(keyText(parts) + '|' + (typeof target === 'string' ? target : JSON.stringify(pair[1])));
      }
      continue;
    }
    if (keySet && set && set.name === keySetName) {
      for (const k of set.elem || []) {
        const parts = partsOf(k);
        keySet.set(keyText(parts), parts);
      }
      continue;
    }
    const map = item.map;
    if (!map || map.name !== mapName) continue;
    for (const pair of map.elem || []) {
      if (!Array.isArray(pair) || pair.length !== 2) throw new Error('unexpected map element ' + JSON.stringify(pair));
      const k = pair[0];
      const wrapped = k && k.elem;
      const parts = (wrapped ? wrapped.val : k).concat;
      if (!Array.isArray(parts) || parts.length !== 3 || typeof pair[1] !== 'string') {
        throw new Error('unexpected map element ' + JSON.stringify(pair));
      }
      const key = keyText(parts);
      if (mapKeys) mapKeys.add(key);
      const line = key + '\\t' + listedAddress(pair[1]) + '\\t' + ((wrapped && wrapped.comment) || '');
      const i = byKey.get(key);
      if (i !== undefined && lines[i] === line && matched[i] === 0) matched[i] = 1;
      else {
        residue.push(pair);
        residueKeys.push(key);
      }
    }
  }
  const unmatched = [];
  for (let i = 0; i < lines.length; i++) {
    if (matched[i] === 0 || (keySet && !keySet.has(lines[i].slice(0, lines[i].indexOf('\\t'))))) unmatched.push(i);
  }
  if (!keySet) return sourceRanges ? { rules, chains, unmatched, residue, sourceRanges } : { rules, chains, unmatched, residue };
  const residueInKeySet = residueKeys.map((k) => keySet.has(k));
  const keyResidue = [];
  for (const [k, parts] of keySet) if (!byKey.has(k) && !mapKeys.has(k)) keyResidue.push(parts);
  const out = { rules, chains, unmatched, residue, residueInKeySet, keyResidue };
  if (sourceRanges) out.sourceRanges = sourceRanges;
  return out;
`;

const DIFF_WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
function diff(listing, expected, mapName, keySetName) {${DIFF_BODY}}
try {
  parentPort.postMessage({ ok: diff(workerData.listing, workerData.expected, workerData.mapName, workerData.keySetName) });
} catch (err) {
  parentPort.postMessage({ error: String((err && err.message) || err) });
}
`;

/**
 * Runs `nft -j list table` itself: the listing's megabytes never reach the event loop. It reads at
 * most maxBytes (nft is stopped beyond), and holds one copy at a time: the chunks, then their
 * concatenation, then the text, then its parse.
 */
const LIST_AND_DIFF_WORKER = `
const { parentPort, workerData } = require('node:worker_threads');
const { spawn } = require('node:child_process');
function diff(listing, expected, mapName, keySetName) {${DIFF_BODY}}
const w = workerData;
const MAX_STDERR = 64 * 1024;
const child = spawn(w.binary, ['-j', 'list', 'table', w.family, w.table], { stdio: ['ignore', 'pipe', 'pipe'] });
let chunks = [];
let size = 0;
let stderr = '';
let tooLarge = false;
let timedOut = false;
let replied = false;
const reply = (message) => {
  if (replied) return;
  replied = true;
  clearTimeout(timer);
  parentPort.postMessage(message);
};
const timer = w.timeoutMs === undefined ? undefined : setTimeout(() => {
  timedOut = true;
  child.kill('SIGKILL');
}, w.timeoutMs);
child.stdout.on('data', (chunk) => {
  if (tooLarge) return;
  size += chunk.length;
  if (size > w.maxBytes) {
    tooLarge = true;
    chunks = [];
    child.kill('SIGKILL');
    return;
  }
  chunks.push(chunk);
});
child.stderr.on('data', (chunk) => {
  if (stderr.length < MAX_STDERR) stderr += chunk.toString('utf8', 0, MAX_STDERR - stderr.length);
});
child.on('error', (err) => reply({ failed: { code: err.code, killed: false, output: String(err.message) } }));
child.on('close', (code) => {
  if (tooLarge) return reply({ tooLarge: true });
  if (timedOut) return reply({ failed: { killed: true, output: stderr } });
  if (code !== 0) {
    const stdout = Buffer.concat(chunks).toString('utf8', 0, MAX_STDERR);
    return reply({ failed: { code, killed: false, output: stderr + '\\n' + stdout } });
  }
  let listing = Buffer.concat(chunks, size);
  chunks = [];
  let text = listing.toString('utf8');
  listing = undefined;
  try {
    reply({ ok: diff(text, w.expected, w.mapName, w.keySetName) });
  } catch (e) {
    reply({ error: String((e && e.message) || e) });
  }
});
`;

interface WorkerReply {
  ok?: ListingDiff;
  error?: string;
  tooLarge?: boolean;
  failed?: { code?: string | number; killed: boolean; output: string };
}

/** The worker could not start or died: the caller may compare on the event loop instead. */
export class ListingWorkerError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'ListingWorkerError';
  }
}

/** One worker per comparison, ended after it: an idle worker would hold its own heap all the time. */
async function inWorker(source: string, workerData: Record<string, unknown>): Promise<WorkerReply> {
  let worker: Worker;
  try {
    worker = new Worker(source, { eval: true, workerData });
  } catch (err) {
    throw new ListingWorkerError(`the listing worker did not start: ${(err as Error).message}`);
  }
  try {
    return await new Promise<WorkerReply>((resolve, reject) => {
      worker.once('message', resolve);
      worker.once('error', (err) => reject(new ListingWorkerError(`the listing worker failed: ${err.message}`)));
      worker.once('exit', (code) => reject(new ListingWorkerError(`the listing worker exited with code ${code}`)));
    });
  } finally {
    void worker.terminate();
  }
}

// eslint-disable-next-line @typescript-eslint/no-implied-eval
const diffInline = new Function('listing', 'expected', 'mapName', 'keySetName', DIFF_BODY) as (
  listing: string,
  expected: string,
  mapName: string,
  keySetName: string,
) => ListingDiff;

/** Listings shorter than this are compared on the event loop: a worker's start costs more. */
export const OFF_THREAD_ABOVE_BYTES = 256 * 1024;

export async function diffListing(
  listing: string,
  expected: string,
  mapName: string,
  offThreadAboveBytes = OFF_THREAD_ABOVE_BYTES,
  keySetName = '',
): Promise<ListingDiff> {
  if (listing.length < offThreadAboveBytes) return diffInline(listing, expected, mapName, keySetName);
  const reply = await inWorker(DIFF_WORKER, { listing, expected, mapName, keySetName });
  if (reply.error !== undefined) throw new NftError(reply.error);
  return reply.ok!;
}

/**
 * `nft -j list table <family> <table>` compared with `expected`, both in a worker; undefined
 * when the table does not exist. Errors as NftCliExecutor.listTable's: a listing longer than
 * `maxBytes` is not read (listingTooLarge).
 */
export async function listAndDiff(
  binary: string,
  family: 'ip' | 'ip6',
  table: string,
  expected: string,
  mapName: string,
  timeoutMs?: number,
  maxBytes = MAX_LISTING_BYTES,
  keySetName = '',
): Promise<ListingDiff | undefined> {
  const reply = await inWorker(LIST_AND_DIFF_WORKER, {
    binary,
    family,
    table,
    expected,
    mapName,
    keySetName,
    timeoutMs,
    maxBytes,
  });
  if (reply.tooLarge) throw listingTooLarge(family, table, maxBytes);
  if (reply.failed) {
    const { code, killed, output } = reply.failed;
    const command = `nft -j list table ${family} ${table}`;
    if (code === 'ENOENT') throw new NftError(`the '${binary}' command was not found: install the nftables package`);
    if (killed && timeoutMs !== undefined)
      throw new NftTimeoutError(`${command} did not finish within ${timeoutMs} ms`);
    const error = new NftError(nftErrorMessage(output));
    if (isNoSuchObject(error)) return undefined;
    throw error;
  }
  if (reply.error !== undefined) throw new NftError(reply.error);
  return reply.ok!;
}
