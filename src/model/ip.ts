// Address parsing for values that come from API objects and flags.
// Everything that reaches a backend went through here: canonical text, known family.

import { isIPv4, isIPv6 } from 'node:net';
import type { Family } from './types.js';

export interface ParsedIp {
  family: Family;
  /** Canonical text: dotted quad, or RFC 5952 compressed lower-case IPv6. */
  address: string;
}

/** Parses an IP address, or returns undefined. Zones, IPv4-mapped IPv6 and leading zeros are refused. */
export function parseIp(text: unknown): ParsedIp | undefined {
  if (typeof text !== 'string' || text.length === 0 || text.length > 45) return undefined;
  if (isIPv4(text)) {
    // node accepts only canonical dotted quads already (no leading zeros, four parts).
    return { family: 'ipv4', address: text };
  }
  if (isIPv6(text) && !text.includes('%') && !text.includes('.')) {
    const groups = ipv6Groups(text);
    if (!groups) return undefined;
    if (groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff) return undefined;
    return { family: 'ipv6', address: formatIpv6(groups) };
  }
  return undefined;
}

export interface ParsedCidr {
  family: Family;
  /** Network address (host bits cleared), canonical. */
  address: string;
  prefixLength: number;
}

/** Parses `addr/len`; host bits are cleared. */
export function parseCidr(text: unknown): ParsedCidr | undefined {
  if (typeof text !== 'string') return undefined;
  const slash = text.indexOf('/');
  if (slash < 0) return undefined;
  const ip = parseIp(text.slice(0, slash));
  const lenText = text.slice(slash + 1);
  if (!ip || !/^\d{1,3}$/.test(lenText)) return undefined;
  const prefixLength = Number(lenText);
  const bits = ip.family === 'ipv4' ? 32 : 128;
  if (prefixLength > bits) return undefined;
  const bytes = ipBytes(ip);
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, prefixLength - i * 8));
    bytes[i]! &= (0xff << (8 - keep)) & 0xff;
  }
  return { family: ip.family, address: formatBytes(ip.family, bytes), prefixLength };
}

export function formatCidr(c: ParsedCidr): string {
  return `${c.address}/${c.prefixLength}`;
}

function ipv6Groups(text: string): number[] | undefined {
  const halves = text.split('::');
  if (halves.length > 2) return undefined;
  const parse = (s: string) => (s === '' ? [] : s.split(':').map((g) => parseInt(g, 16)));
  const head = parse(halves[0]!);
  const tail = halves.length === 2 ? parse(halves[1]!) : [];
  const fill = 8 - head.length - tail.length;
  if (halves.length === 1 ? fill !== 0 : fill < 1) return undefined;
  const groups = [...head, ...new Array<number>(halves.length === 2 ? fill : 0).fill(0), ...tail];
  return groups.every((g) => Number.isInteger(g) && g >= 0 && g <= 0xffff) ? groups : undefined;
}

function formatIpv6(groups: number[]): string {
  // RFC 5952: compress the longest run (length >= 2) of zero groups, the first on ties.
  let bestStart = -1;
  let bestLen = 0;
  for (let i = 0; i < 8;) {
    if (groups[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) {
      bestStart = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = groups.map((g) => g.toString(16));
  if (bestLen < 2) return hex.join(':');
  return `${hex.slice(0, bestStart).join(':')}::${hex.slice(bestStart + bestLen).join(':')}`;
}

/** The address's bytes in network order (4 or 16). */
export function ipBytes(ip: ParsedIp): number[] {
  if (ip.family === 'ipv4') return ip.address.split('.').map(Number);
  const groups = ipv6Groups(ip.address)!;
  return groups.flatMap((g) => [g >> 8, g & 0xff]);
}

function formatBytes(family: Family, bytes: number[]): string {
  if (family === 'ipv4') return bytes.join('.');
  const groups: number[] = [];
  for (let i = 0; i < 16; i += 2) groups.push((bytes[i]! << 8) | bytes[i + 1]!);
  return formatIpv6(groups);
}

/** A key that sorts canonical addresses of one family numerically (fixed-width hex of the bytes). */
export function ipSortKey(address: string): string {
  const ip = parseIp(address);
  return ip ? parsedIpSortKey(ip) : address;
}

/** ipSortKey of an address parsed already (one per Service address at start-up). */
export function parsedIpSortKey(ip: ParsedIp): string {
  if (ip.family === 'ipv4') {
    // The dotted quad as one number, read in place: no arrays for 10,000 addresses.
    const text = ip.address;
    let value = 0;
    let part = 0;
    for (let i = 0; i < text.length; i++) {
      const c = text.charCodeAt(i);
      if (c === 0x2e) {
        value = value * 256 + part;
        part = 0;
      } else {
        part = part * 10 + c - 0x30;
      }
    }
    return (value * 256 + part).toString(16).padStart(8, '0');
  }
  return ipBytes(ip)
    .map((b) => b.toString(16).padStart(2, '0'))
    .join('');
}

/** Whether `ip` is inside `cidr` (same family, same leading prefixLength bits). */
export function cidrContains(cidr: ParsedCidr, ip: ParsedIp): boolean {
  if (cidr.family !== ip.family) return false;
  const network = ipBytes(cidr);
  const bytes = ipBytes(ip);
  for (let i = 0; i < bytes.length; i++) {
    const keep = Math.max(0, Math.min(8, cidr.prefixLength - i * 8));
    const mask = (0xff << (8 - keep)) & 0xff;
    if ((bytes[i]! & mask) !== network[i]) return false;
  }
  return true;
}

/**
 * Why an address always means this node, whatever node it is on (semantics.md): loopback,
 * unspecified ("this network"), link-local (169.254.169.254 is the cloud metadata address),
 * multicast, limited broadcast. Undefined for any other address.
 */
export function nodeScopedKind(ip: ParsedIp): string | undefined {
  const b = ipBytes(ip);
  if (ip.family === 'ipv4') {
    if (b[0] === 0) return 'unspecified';
    if (b[0] === 127) return 'loopback';
    if (b[0] === 169 && b[1] === 254) return 'link-local';
    if (b[0]! >= 224 && b[0]! <= 239) return 'multicast';
    if (b.every((x) => x === 255)) return 'broadcast';
    return undefined;
  }
  if (b.every((x) => x === 0)) return 'unspecified';
  if (b.slice(0, 15).every((x) => x === 0) && b[15] === 1) return 'loopback';
  if (b[0] === 0xfe && (b[1]! & 0xc0) === 0x80) return 'link-local';
  if (b[0] === 0xff) return 'multicast';
  return undefined;
}

/**
 * Parses a CIDR as kube-proxy reads loadBalancerSourceRanges: surrounding spaces are trimmed and
 * IPv4 octets may have leading zeros (read as decimal, as Go's ParseCIDRSloppy does); host bits
 * are cleared.
 */
export function parseSourceRange(text: unknown): ParsedCidr | undefined {
  if (typeof text !== 'string') return undefined;
  const trimmed = text.trim();
  const v4 = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(\/.*)$/.exec(trimmed);
  if (v4) return parseCidr(`${v4.slice(1, 5).map(Number).join('.')}${v4[5]}`);
  return parseCidr(trimmed);
}

/** Orders CIDRs by network address, then by prefix length (the wider first). */
function compareCidrs(a: ParsedCidr, b: ParsedCidr): number {
  const x = parsedIpSortKey(a);
  const y = parsedIpSortKey(b);
  if (x !== y) return x < y ? -1 : 1;
  return a.prefixLength - b.prefixLength;
}

/** The same addresses as `cidrs` (one family): sorted, each CIDR inside another one left out. */
export function disjointCidrs(cidrs: readonly ParsedCidr[]): ParsedCidr[] {
  const sorted = [...cidrs].sort(compareCidrs);
  const out: ParsedCidr[] = [];
  for (const c of sorted) {
    const last = out[out.length - 1];
    if (last && cidrContains(last, c)) continue;
    out.push(c);
  }
  return out;
}
