// Entries <-> the bytes of the BPF entry maps (bpf/ipvs_node_controller.bpf.c). Pure.
//
// Layout, byte for byte as the programs read the socket address (network byte order):
//   IPv4 key   (8):  address[4]  port[2]  protocol[1]  pad[1]
//   IPv4 value (8):  address[4]  port[2]  pad[2]
//   IPv6 key   (20): address[16] port[2]  protocol[1]  pad[1]
//   IPv6 value (20): address[16] port[2]  pad[2]

import { canonicalAddress, ipBytes, parseIp } from '../../model/ip.js';
import { entryKey, type Entry, type Family, type Protocol } from '../../model/types.js';

/** Must equal MAX_ENTRIES in the BPF source: the size the entry maps are created with. */
export const ENTRY_MAP_CAPACITY = 65536;

const ADDRESS_BYTES: Record<Family, number> = { ipv4: 4, ipv6: 16 };
export const KEY_SIZE: Record<Family, number> = { ipv4: 8, ipv6: 20 };
export const VALUE_SIZE: Record<Family, number> = { ipv4: 8, ipv6: 20 };

const PROTOCOL_NUMBER: Record<Protocol, number> = { TCP: 6, UDP: 17, SCTP: 132 };
const PROTOCOL_BY_NUMBER = new Map<number, Protocol>(
  Object.entries(PROTOCOL_NUMBER).map(([name, n]) => [n, name as Protocol]),
);

/** What one map element says: the match and where it goes. */
export interface MapEntry {
  family: Family;
  externalIp: string;
  /** A number when the element holds a protocol the model does not know (written by something else). */
  protocol: Protocol | number;
  port: number;
  clusterIp: string;
  clusterPort: number;
}

/** The fields of a map key. */
export type KeyFields = Pick<MapEntry, 'externalIp' | 'protocol' | 'port'>;

export function addressBytes(family: Family, address: string): Buffer {
  const ip = parseIp(address);
  if (!ip || ip.family !== family) throw new Error(`not an ${family} address: ${address}`);
  return Buffer.from(ipBytes(ip));
}

export function addressText(family: Family, bytes: Buffer): string {
  if (family === 'ipv4') return Array.from(bytes.subarray(0, 4)).join('.');
  const groups: string[] = [];
  for (let i = 0; i < 16; i += 2) groups.push(bytes.readUInt16BE(i).toString(16));
  return canonicalAddress(groups.join(':'));
}

function writeKey(family: Family, e: KeyFields, out: Buffer, at: number): void {
  const n = ADDRESS_BYTES[family];
  addressBytes(family, e.externalIp).copy(out, at);
  out.writeUInt16BE(e.port, at + n);
  out.writeUInt8(typeof e.protocol === 'number' ? e.protocol : PROTOCOL_NUMBER[e.protocol], at + n + 2);
  out.writeUInt8(0, at + n + 3);
}

function writeValue(family: Family, e: Pick<Entry, 'clusterIp' | 'port'>, out: Buffer, at: number): void {
  const n = ADDRESS_BYTES[family];
  addressBytes(family, e.clusterIp).copy(out, at);
  out.writeUInt16BE(e.port, at + n);
  out.writeUInt16BE(0, at + n + 2);
}

/** Packed keys of `entries`, all of `family`. */
export function encodeKeys(family: Family, entries: readonly KeyFields[]): Buffer {
  const out = Buffer.alloc(entries.length * KEY_SIZE[family]);
  entries.forEach((e, i) => writeKey(family, e, out, i * KEY_SIZE[family]));
  return out;
}

/** Packed values of `entries` (ClusterIP, same port), all of `family`. */
export function encodeValues(family: Family, entries: ReadonlyArray<Pick<Entry, 'clusterIp' | 'port'>>): Buffer {
  const out = Buffer.alloc(entries.length * VALUE_SIZE[family]);
  entries.forEach((e, i) => writeValue(family, e, out, i * VALUE_SIZE[family]));
  return out;
}

/** The elements of a dumped map. */
export function decodeElements(family: Family, keys: Buffer, values: Buffer): MapEntry[] {
  const ks = KEY_SIZE[family];
  const vs = VALUE_SIZE[family];
  const n = ADDRESS_BYTES[family];
  const count = checkDump(family, keys, values);
  const out: MapEntry[] = [];
  for (let i = 0; i < count; i++) {
    const key = keys.subarray(i * ks, (i + 1) * ks);
    const value = values.subarray(i * vs, (i + 1) * vs);
    const protoNumber = key.readUInt8(n + 2);
    out.push({
      family,
      externalIp: addressText(family, key.subarray(0, n)),
      protocol: PROTOCOL_BY_NUMBER.get(protoNumber) ?? protoNumber,
      port: key.readUInt16BE(n),
      clusterIp: addressText(family, value.subarray(0, n)),
      clusterPort: value.readUInt16BE(n),
    });
  }
  return out;
}

/** What to write so that a dumped map holds exactly the desired entries, found on the bytes. */
export interface DumpChanges {
  /** Entries whose key is missing or whose value differs. */
  upserts: Entry[];
  /** Packed keys, exactly as dumped, of the elements no entry wants. */
  deleteKeys: Buffer;
  /** Those elements decoded, in the order of `deleteKeys`. */
  extra: MapEntry[];
}

/**
 * An entry's element as bytes (key then value, one latin1 character a byte), kept per entry
 * object: the model hands back unchanged entries as the same objects, so a full sync encodes
 * only the entries that are new since the last one. Parsing 10,000 addresses costs more than
 * the whole comparison.
 */
const encodedElements = new WeakMap<Entry, string>();

function encodedElement(family: Family, e: Entry): string {
  let bytes = encodedElements.get(e);
  if (bytes === undefined) {
    const out = Buffer.alloc(KEY_SIZE[family] + VALUE_SIZE[family]);
    writeKey(family, e, out, 0);
    writeValue(family, e, out, KEY_SIZE[family]);
    bytes = out.toString('latin1');
    encodedElements.set(e, bytes);
  }
  return bytes;
}

/**
 * What to write so that a dumped map holds exactly `desired`, compared as bytes rather than decoded (a fraction of the time at
 * 10,000 elements, all of it on the event loop). Elements are exactly what the kernel matches:
 * a key that differs from ours only in its padding is someone else's, and is deleted as dumped.
 */
export function dumpChanges(
  family: Family,
  dump: { keys: Buffer; values: Buffer },
  desired: readonly Entry[],
): DumpChanges {
  const ks = KEY_SIZE[family];
  const vs = VALUE_SIZE[family];
  const count = checkDump(family, dump.keys, dump.values);
  const dumped = new Map<string, number>();
  for (let i = 0; i < count; i++) dumped.set(dump.keys.toString('latin1', i * ks, (i + 1) * ks), i);
  const upserts: Entry[] = [];
  for (const e of desired) {
    const element = encodedElement(family, e);
    const key = element.slice(0, ks);
    const j = dumped.get(key);
    if (j !== undefined) {
      dumped.delete(key);
      if (dump.values.toString('latin1', j * vs, (j + 1) * vs) === element.slice(ks)) continue;
    }
    upserts.push(e);
  }
  const deleteKeys = Buffer.alloc(dumped.size * ks);
  const extraValues = Buffer.alloc(dumped.size * vs);
  let at = 0;
  for (const j of dumped.values()) {
    dump.keys.copy(deleteKeys, at * ks, j * ks, (j + 1) * ks);
    dump.values.copy(extraValues, at * vs, j * vs, (j + 1) * vs);
    at++;
  }
  return { upserts, deleteKeys, extra: decodeElements(family, deleteKeys, extraValues) };
}

/** The number of elements in a dump; throws when keys and values do not pair up. */
function checkDump(family: Family, keys: Buffer, values: Buffer): number {
  const ks = KEY_SIZE[family];
  const vs = VALUE_SIZE[family];
  if (keys.length % ks !== 0 || values.length % vs !== 0 || keys.length / ks !== values.length / vs) {
    throw new Error(`malformed ${family} map dump: ${keys.length} key bytes, ${values.length} value bytes`);
  }
  return keys.length / ks;
}

export interface MapChanges {
  /** Elements to insert or overwrite. */
  upserts: Entry[];
  /** Keys to delete. */
  deletes: KeyFields[];
}

/**
 * What to write for changes found without reading the map (ElementStorage.changesTo, which
 * compares entries as the nft backend's elements: ClusterIP and Service). An entry removed and
 * added under one key is an overwrite, or nothing at all when only its Service changed: a map
 * element holds no name. The cost is that of the changes.
 */
export function elementWrites(changes: { removed: readonly Entry[]; added: readonly Entry[] }): MapChanges {
  const removedByKey = new Map<string, Entry>();
  for (const e of changes.removed) removedByKey.set(entryKey(e), e);
  const upserts: Entry[] = [];
  for (const e of changes.added) {
    const key = entryKey(e);
    const old = removedByKey.get(key);
    if (old) {
      removedByKey.delete(key);
      if (old.clusterIp === e.clusterIp) continue;
    }
    upserts.push(e);
  }
  return { upserts, deletes: [...removedByKey.values()] };
}
