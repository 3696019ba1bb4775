// Address parsing for values that come from API objects and flags.
// Everything that reaches a backend went through here: canonical text, known family.

import { isIPv4, isIPv6 } from 'node:net';
import type { Family } from './types.js';

export interface ParsedIp {
  family: Family;
  /** Canonical text: dotted quad, or RFC 5952 compressed lower-case IPv6. */
  address: string;
}

// The one address text, between the model and every read back (the native element dump writes
// the same in C++: native/nft_element_dump.cc, AppendAddress). IPv4: the dotted quad. IPv6: RFC
// 5952 section 4: lower-case hexadecimal groups without leading zeros, the longest run of two or
// more zero groups written `::` (the first of equal runs), a single zero group written `0`; and
// never the mixed notation of its section 5 (`::ffff:1.2.3.4`). That is what a URL's host is
// (WHATWG URL), what Go's netip.Addr.String writes (Kubernetes) for every address the model takes,
// and what inet_ntop writes for every address but those of ::/96 whose seventh group is not zero
// and of ::ffff:0:0/96: nft, iptables-save and inet_ntop print `::1.2.3.4` and `::ffff:1.2.3.4`
// where this text is `::102:304` and `::ffff:102:304`. Mixed notation is left out: section 5
// asks for it only where the address is known to embed an IPv4 address, the IPv4-compatible
// form ::a.b.c.d is deprecated (RFC 4291 2.5.5.1) and names no IPv4 host, and the model refuses
// IPv4-mapped addresses (parseIp); one rule with no exception is what every reader can match.
//
// The code is a string so that the listing worker (backends/nft/listing-diff.ts) runs this very
// function: a worker is given source text, and bundling renames what a function refers to.
/**
 * The body of canonicalAddress(text): plain JavaScript that refers to nothing outside itself.
 * Text with no `:` is returned as it is (a dotted quad, which every tool prints canonically).
 */
const CANONICAL_ADDRESS_BODY = `
  if (typeof text !== 'string' || text.indexOf(':') < 0 || text.length > 45) return text;
  const groups = [0, 0, 0, 0, 0, 0, 0, 0];
  const length = text.length;
  let n = 0;
  let gap = -1;
  let i = 0;
  if (text.charCodeAt(0) === 58) {
    if (text.charCodeAt(1) !== 58) return text;
    gap = 0;
    i = 2;
  }
  while (i < length) {
    const start = i;
    let value = 0;
    while (i < length && i - start < 5) {
      const c = text.charCodeAt(i);
      const digit = c >= 48 && c <= 57 ? c - 48 : c >= 97 && c <= 102 ? c - 87 : c >= 65 && c <= 70 ? c - 55 : -1;
      if (digit < 0) break;
      value = value * 16 + digit;
      i++;
    }
    if (i < length && text.charCodeAt(i) === 46) {
      // A dotted quad for the last two groups: four decimal parts without leading zeros.
      if (n > 6) return text;
      let part = 0;
      let parts = 0;
      let digits = 0;
      let quad = 0;
      for (let j = start; j <= length; j++) {
        const c = j < length ? text.charCodeAt(j) : 46;
        if (c === 46) {
          if (digits === 0 || parts === 4) return text;
          quad = quad * 256 + part;
          parts++;
          part = 0;
          digits = 0;
        } else if (c >= 48 && c <= 57) {
          if (digits > 0 && part === 0) return text;
          part = part * 10 + c - 48;
          digits++;
          if (part > 255) return text;
        } else return text;
      }
      if (parts !== 4) return text;
      groups[n++] = Math.floor(quad / 65536);
      groups[n++] = quad % 65536;
      i = length;
      break;
    }
    if (i === start || i - start > 4 || n === 8) return text;
    groups[n++] = value;
    if (i === length) break;
    if (text.charCodeAt(i) !== 58) return text;
    i++;
    if (i < length && text.charCodeAt(i) === 58) {
      if (gap >= 0) return text;
      gap = n;
      i++;
    } else if (i === length) return text;
  }
  if (gap < 0 ? n !== 8 : n > 7) return text;
  if (gap >= 0) {
    // The groups after the gap move to the end; the gap is zeros.
    const after = n - gap;
    for (let k = 0; k < after; k++) groups[7 - k] = groups[n - 1 - k];
    for (let k = gap; k < 8 - after; k++) groups[k] = 0;
  }
  let bestStart = -1;
  let bestLength = 1;
  for (let k = 0; k < 8; ) {
    if (groups[k] !== 0) {
      k++;
      continue;
    }
    let end = k;
    while (end < 8 && groups[end] === 0) end++;
    if (end - k > bestLength) {
      bestStart = k;
      bestLength = end - k;
    }
    k = end;
  }
  let out = '';
  for (let k = 0; k < 8; k++) {
    if (k === bestStart) {
      out += '::';
      k += bestLength - 1;
      continue;
    }
    if (k > 0 && k !== bestStart + bestLength) out += ':';
    out += groups[k].toString(16);
  }
  return out;
`;

/**
 * The model's text of an address as any tool prints it (nft, iptables-save, inet_ntop, a map's
 * bytes as groups): IPv6 in any valid form, upper case, uncompressed or in mixed notation, comes
 * back as above; text that is no IPv6 address comes back unchanged, so it equals no address of
 * the model unless it is the same dotted quad.
 */
// eslint-disable-next-line @typescript-eslint/no-implied-eval
export const canonicalAddress = new Function('text', CANONICAL_ADDRESS_BODY) as (text: string) => string;

/**
 * The body of listedAddress(text): canonicalAddress for text with a `.`, the rest as it is. inet_ntop
 * (what nft, iptables-save and ip6tables-save print with) writes RFC 5952 but for mixed notation,
 * which is the only text it prints with both `:` and `.`: so only that text needs parsing, and an
 * address listed in the common form costs one indexOf (4 ms of CPU per 100,000, against 50 parsed).
 */
export const LISTED_ADDRESS_BODY = `
  if (typeof text !== 'string' || text.indexOf('.') < 0) return text;
${CANONICAL_ADDRESS_BODY}`;

/**
 * The model's text of an address as nft, iptables-save or inet_ntop printed it: every place that
 * reads a listed address takes it through here (the listing worker runs LISTED_ADDRESS_BODY).
 */
// eslint-disable-next-line @typescript-eslint/no-implied-eval
export const listedAddress = new Function('text', LISTED_ADDRESS_BODY) as (text: string) => string;

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
    return { family: 'ipv6', address: canonicalAddress(text) };
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
  return canonicalAddress(groups.map((g) => g.toString(16)).join(':'));
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
