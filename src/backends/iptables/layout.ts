// Where our rules sit in the nat table. Pure.
//
// The entry points are the original controller's chains, IPVS_PREROUTING and IPVS_OUTPUT, each
// jumped to from rule 1 of nat PREROUTING / OUTPUT. They hold no translation themselves: the rules
// are spread by destination over bucket chains, one per last byte of the destination address
// (IPVS_OUTPUT_201 holds the rules of 10.19.20.201, 10.19.21.201, ...), and the entry chain goes to
// each bucket with one rule matching that byte:
//
//   -A IPVS_OUTPUT -d 0.0.0.201/0.0.0.255 -g IPVS_OUTPUT_201        (IPv4: the byte in decimal)
//   -A IPVS_OUTPUT -d ::c9/::ff -g IPVS_OUTPUT_c9                     (IPv6: in hexadecimal)
//
// A new connection walks at most 256 of those matches (one per bucket that exists), then the rules
// of one bucket: about 2 x 10,000 / 256 = 80 at 10,000 one-port Services on addresses that differ
// in their last byte, where it walked all 20,000 rules of IPVS_OUTPUT in one flat chain. The goto
// (-g) ends the walk of the entry chain: a packet that matches nothing in its bucket goes back to
// the rule after our jump in the hook, as it did from the flat chain.
//
// A one-Service change touches one bucket per hook: iptables-nft fetches only the chains it
// deletes from (a bucket, not 20,000 rules). A bucket chain exists while it has entries (a write
// that gives it its first one declares it and adds its goto; the one that takes its last removes
// both), so a node with a few Services lists a few buckets.
//
// An entry with source ranges (loadBalancerSourceRanges) has one rule in its bucket, like any
// other: it goes to the source-range chain of its Service, one per hook, which holds the
// Service's ranges once for all its entries (rules.ts):
//
//   -A IPVS_OUTPUT_10 -d 192.0.2.10/32 -p tcp ... --dport 80 -g IPVS_OUT_SR_7KQ2M4N6P3R5S2T4
//
// The name is the hook's and a hash of `namespace/name`: 16 characters of the base32 of its
// SHA-256, as kube-proxy names its per-Service chains, within the 28 characters iptables allows.

import { createHash } from 'node:crypto';
import type { Family } from '../../model/types.js';

export const PREROUTING_CHAIN = 'IPVS_PREROUTING';
export const OUTPUT_CHAIN = 'IPVS_OUTPUT';
/** The chains jumped to from the hooks, in the order a whole write declares them. */
export const ENTRY_CHAINS: readonly string[] = [PREROUTING_CHAIN, OUTPUT_CHAIN];

/** Built-in nat chain -> our entry chain, jumped to from rule 1. */
export const JUMPS: ReadonlyArray<{ from: string; to: string }> = [
  { from: 'PREROUTING', to: PREROUTING_CHAIN },
  { from: 'OUTPUT', to: OUTPUT_CHAIN },
];

/** The last byte of a destination as a bucket's name: decimal for IPv4, hexadecimal for IPv6. */
export type Bucket = string;

/**
 * The bucket of a canonical address of `family` (one that passed rules.ts's checks): its last
 * byte, read from the text without parsing the rest.
 */
export function bucketOf(family: Family, address: string): Bucket {
  if (family === 'ipv4') return address.slice(address.lastIndexOf('.') + 1);
  // Canonical IPv6 text ends with its last group, or with `::` when that group is 0.
  const group = address.slice(address.lastIndexOf(':') + 1);
  return group === '' ? '0' : (parseInt(group, 16) & 0xff).toString(16);
}

/** The byte a bucket stands for. */
function bucketByte(family: Family, bucket: Bucket): number {
  return family === 'ipv4' ? Number(bucket) : parseInt(bucket, 16);
}

/** Buckets in the order of their byte: the order a whole write gives their gotos. */
export function byBucket(family: Family): (a: Bucket, b: Bucket) => number {
  return (a, b) => bucketByte(family, a) - bucketByte(family, b);
}

/** `IPVS_OUTPUT_201`: the bucket chain of an entry chain. */
export function bucketChain(entry: string, bucket: Bucket): string {
  return `${entry}_${bucket}`;
}

/** The entry chain's rule that goes to a bucket, as `-save` prints it back (without `-A CHAIN`). */
export function gotoSpec(family: Family, entry: string, bucket: Bucket): string {
  const match = family === 'ipv4' ? `-d 0.0.0.${bucket}/0.0.0.255` : `-d ::${bucket === '0' ? '' : bucket}/::ff`;
  return `${match} -g ${bucketChain(entry, bucket)}`;
}

const BUCKET_CHAIN = /^(IPVS_PREROUTING|IPVS_OUTPUT)_([0-9a-f]{1,3})$/;

/** The prefix of a hook's source-range chains, by entry chain. */
const SERVICE_CHAIN_PREFIX: Readonly<Record<string, string>> = {
  [PREROUTING_CHAIN]: 'IPVS_PRE_SR_',
  [OUTPUT_CHAIN]: 'IPVS_OUT_SR_',
};
const SERVICE_CHAIN = /^IPVS_(PRE|OUT)_SR_[A-Z2-7]{16}$/;
const BASE32 = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ234567';

/** The first 16 characters of the base32 (RFC 4648) of the SHA-256 of `text`: 80 bits. */
function hash16(text: string): string {
  const bytes = createHash('sha256').update(text).digest();
  let out = '';
  // 16 characters are 80 bits: the first 10 bytes.
  for (let i = 0; i < 10; i += 5) {
    let bits = 0n;
    for (let j = 0; j < 5; j++) bits = (bits << 8n) | BigInt(bytes[i + j]!);
    for (let k = 7; k >= 0; k--) out += BASE32[Number((bits >> BigInt(k * 5)) & 31n)];
  }
  return out;
}

/** Hashes of Services seen lately: a family's rules name each Service's chains once per entry and hook. */
const hashes = new Map<string, string>();
const MAX_REMEMBERED_HASHES = 4096;

/** `IPVS_OUT_SR_7KQ2M4N6P3R5S2T4`: the source-range chain of a Service (`namespace/name`) in a hook. */
export function serviceChain(entry: string, service: string): string {
  let hash = hashes.get(service);
  if (hash === undefined) {
    if (hashes.size >= MAX_REMEMBERED_HASHES) hashes.clear();
    hash = hash16(service);
    hashes.set(service, hash);
  }
  return `${SERVICE_CHAIN_PREFIX[entry]!}${hash}`;
}

/** Whether a chain name is one of our source-range chains. */
export function isServiceChain(name: string): boolean {
  return SERVICE_CHAIN.test(name);
}

/** The entry chain and bucket of one of our bucket chains; undefined for any other name. */
export function parseBucketChain(name: string): { entry: string; bucket: Bucket } | undefined {
  const m = BUCKET_CHAIN.exec(name);
  return m ? { entry: m[1]!, bucket: m[2]! } : undefined;
}

/** One of our chains: an entry chain, a bucket chain or a source-range chain. */
export function isOurChain(name: string): boolean {
  return ENTRY_CHAINS.includes(name) || BUCKET_CHAIN.test(name) || SERVICE_CHAIN.test(name);
}
