// What a whole write writes to a set or map that already holds elements: the difference, never
// the elements that stay. An element deleted and added again in one transaction is missed by
// packet lookups while the transaction commits on the kernels nodes run (nf_tables before
// "netfilter: nf_tables: restart set lookup on base_seq change", 2025: hash sets now and then,
// interval and concatenated interval sets often), and a new connection whose first packet is
// missed stays untranslated for its life. Elements that are only added or removed beside it
// leave it found. Also how a removal names an element a read back listed (ListedRef). Pure: no I/O.

import { listedAddress } from '../../model/ip.js';
import type { MapElement, VerdictElement } from './objects.js';
import type { KernelElement } from '../../driver/driver.js';
import type { Entry } from '../../model/types.js';
import { mapElement } from './render.js';

/** What a map and its key set hold, one element a line as the addon reads them (readElements). */
export interface HeldElements {
  /** `address protocol port value[ comment]` lines. */
  map: string;
  /** `address protocol port` lines; undefined: no key set. */
  keySet?: string;
}

/** The changes that bring a map (and its key set) from what it holds to what it must hold. */
export interface ElementDifference {
  /** Map elements to remove, `address protocol port` a line: unwanted, or with another value or comment. */
  removed: string;
  /** Map elements to add, `address protocol port value[ comment]` a line: missing, or replacing one removed. */
  added: string;
  /** The key set's: keys it holds that no wanted element has, and wanted keys it lacks (a key stays when only its value changes). */
  keysRemoved: string;
  keysAdded: string;
  /** Counts of the above, and of the wanted elements the map already holds exactly (not written). */
  counts: { removed: number; added: number; keysRemoved: number; keysAdded: number; kept: number };
}

/**
 * The lists writeElements reads, or undefined when an element cannot be written that way (a
 * comment the line format cannot carry, or one libnftables would write otherwise): the caller
 * then writes the changes as JSON.
 */
export function elementLines(elements: readonly MapElement[], withData: boolean): string | undefined {
  const lines = new Array<string>(elements.length);
  for (let i = 0; i < elements.length; i++) {
    const e = elements[i]!;
    if (e.key.length !== 3) return undefined;
    let line = `${e.key[0]} ${e.key[1]} ${e.key[2]}`;
    if (withData) {
      line += ` ${e.value}`;
      const comment = e.comment;
      if (comment !== undefined) {
        // A line ends at a newline; an empty comment would be no comment; nft caps comments at 128 bytes.
        if (comment === '' || comment.includes('\n') || comment.includes('\0')) return undefined;
        if (comment.length > 42 && Buffer.byteLength(comment) > 128) return undefined;
        line += ` ${comment}`;
      }
    }
    lines[i] = line;
  }
  return lines.join('\n');
}

/** The key of a line: its first three fields (address, protocol, port). */
function keyOf(line: string): string {
  const first = line.indexOf(' ');
  const second = line.indexOf(' ', first + 1);
  const third = line.indexOf(' ', second + 1);
  return third < 0 ? line : line.slice(0, third);
}

function linesOf(text: string): string[] {
  return text === '' ? [] : text.split('\n').filter((l) => l !== '');
}

/**
 * The difference between `held` and `wanted` (`address protocol port value[ comment]` lines, one
 * per key, as elementLines writes them). A held element is kept when its line is exactly a
 * wanted line, so an address printed otherwise than the model writes it is replaced, never lost.
 */
export function elementDifference(held: HeldElements, wanted: string): ElementDifference {
  // One element per key in the kernel, one per key wanted: a held line that is a wanted line is
  // kept, and a key whose lines differ is removed and added.
  const wantedLines = linesOf(wanted);
  const heldLines = linesOf(held.map);
  const wantedSet = new Set(wantedLines);
  const heldSet = new Set(heldLines);
  const removed: string[] = [];
  let kept = 0;
  for (const line of heldLines) {
    if (wantedSet.has(line)) kept++;
    else removed.push(keyOf(line));
  }
  const added = wantedLines.filter((line) => !heldSet.has(line));
  const keysRemoved: string[] = [];
  const keysAdded: string[] = [];
  if (held.keySet !== undefined) {
    const wantedKeys = new Set(wantedLines.map(keyOf));
    const heldKeys = linesOf(held.keySet);
    const heldKeySet = new Set(heldKeys);
    for (const key of heldKeys) if (!wantedKeys.has(key)) keysRemoved.push(key);
    for (const key of wantedKeys) if (!heldKeySet.has(key)) keysAdded.push(key);
  }
  return {
    removed: removed.join('\n'),
    added: added.join('\n'),
    keysRemoved: keysRemoved.join('\n'),
    keysAdded: keysAdded.join('\n'),
    counts: {
      removed: removed.length,
      added: added.length,
      keysRemoved: keysRemoved.length,
      keysAdded: keysAdded.length,
      kept,
    },
  };
}

/** The elements of the source-range check map and of the own-address set. */
export interface SourceRangeSets {
  checks: readonly VerdictElement[];
  own: readonly MapElement[];
}

const keyText = (e: MapElement) => e.key.join(' ');
const checkText = (e: VerdictElement) => `${e.key.join(' ')} jump ${e.chain}`;

/** Removals and additions that bring `held` to `wanted`, elements compared by `text`. */
function difference<T>(held: readonly T[], wanted: readonly T[], text: (e: T) => string): { removed: T[]; added: T[] } {
  const heldTexts = new Set(held.map(text));
  const wantedTexts = new Set(wanted.map(text));
  return {
    removed: held.filter((e) => !wantedTexts.has(text(e))),
    added: wanted.filter((e) => !heldTexts.has(text(e))),
  };
}

/** The changes that bring the source-range check map and own-address set from `held` to `wanted`. */
export function sourceRangeDifference(
  held: SourceRangeSets,
  wanted: SourceRangeSets,
): {
  checks: { removed: VerdictElement[]; added: VerdictElement[] };
  own: { removed: MapElement[]; added: MapElement[] };
} {
  return {
    checks: difference(held.checks, wanted.checks, checkText),
    own: difference(held.own, wanted.own, keyText),
  };
}

const protocolOf = (text: string) => (/^\d+$/.test(text) ? Number(text) : text);

/**
 * The source-range elements from their lines (SetRead: `address protocol port verdict chain`
 * checks, `address protocol port source` own addresses). Throws on a verdict other than a jump,
 * which the controller never writes: the map is then flushed and refilled.
 */
export function sourceRangeLines(checks: string, own: string): SourceRangeSets {
  return {
    checks: linesOf(checks).map((line) => {
      const [address, protocol, port, verdict, chain, ...rest] = line.split(' ');
      if (verdict !== 'jump' || chain === undefined || rest.length > 0)
        throw new Error(`unexpected check element: ${line}`);
      return { key: [address!, protocolOf(protocol!), Number(port)], chain };
    }),
    own: linesOf(own).map((line) => {
      const [address, protocol, port, source, ...rest] = line.split(' ');
      if (source === undefined || rest.length > 0) throw new Error(`unexpected own-address element: ${line}`);
      return { key: [address!, protocolOf(protocol!), Number(port), source], value: '' };
    }),
  };
}

/**
 * The elements of one set or verdict map as `nft -j list set|map` shows them: concatenations of
 * address, protocol and port (`withSource`: and a source address); a verdict map's each with a
 * jump. Throws on an element of another form: the set is then written whole.
 */
export function listedSetElements(listing: string, kind: 'keys'): MapElement[];
export function listedSetElements(listing: string, kind: 'sourced'): MapElement[];
export function listedSetElements(listing: string, kind: 'verdicts'): VerdictElement[];
export function listedSetElements(
  listing: string,
  kind: 'keys' | 'sourced' | 'verdicts',
): Array<MapElement | VerdictElement> {
  const doc = JSON.parse(listing) as { nftables?: Array<{ set?: { elem?: unknown[] }; map?: { elem?: unknown[] } }> };
  const found = doc.nftables?.find((o) => o.set ?? o.map);
  const set = found?.set ?? found?.map;
  if (!set) throw new Error('the listing holds no set');
  const out: Array<MapElement | VerdictElement> = [];
  for (const raw of set.elem ?? []) {
    const unexpected = () => new Error(`unexpected set element ${JSON.stringify(raw)}`);
    let item = raw;
    let chain: unknown;
    if (kind === 'verdicts') {
      if (!Array.isArray(raw) || raw.length !== 2) throw unexpected();
      item = raw[0];
      chain = (raw[1] as { jump?: { target?: unknown } } | undefined)?.jump?.target;
      if (typeof chain !== 'string') throw unexpected();
    }
    const wrapped = (item as { elem?: { val?: unknown } }).elem;
    const parts = ((wrapped ? wrapped.val : item) as { concat?: unknown[] }).concat;
    if (!Array.isArray(parts) || parts.length !== (kind === 'sourced' ? 4 : 3)) throw unexpected();
    const [address, protocol, port, source] = parts;
    if (typeof address !== 'string' || (typeof protocol !== 'string' && typeof protocol !== 'number')) {
      throw unexpected();
    }
    if (typeof port !== 'number') throw unexpected();
    const key = [listedAddress(address), protocol, port];
    if (kind === 'verdicts') out.push({ key, chain: chain as string });
    else if (kind === 'keys') out.push({ key, value: '' });
    else {
      if (typeof source !== 'string') throw unexpected();
      out.push({ key: [...key, listedAddress(source)], value: '' });
    }
  }
  return out;
}

/** The changes that bring a map and its key set to a state's entries, as elements: what a JSON transaction writes. */
export interface MapDifference {
  /** By key (the value is not written). */
  removed: MapElement[];
  added: MapElement[];
  keysRemoved: MapElement[];
  keysAdded: MapElement[];
}

/**
 * elementDifference between what a map and its key set hold and `elements`, as elements; undefined
 * when an element cannot be written as a line (the map is then written whole).
 */
export function mapDifference(held: HeldElements, elements: readonly MapElement[]): MapDifference | undefined {
  const wanted = elementLines(elements, true);
  if (wanted === undefined) return undefined;
  const diff = elementDifference(held, wanted);
  const byKey = new Map<string, MapElement>();
  for (const e of elements) byKey.set(`${e.key[0]} ${e.key[1]} ${e.key[2]}`, e);
  const keyElement = (key: string): MapElement => {
    const [address, protocol, port] = key.split(' ');
    return { key: [address!, /^\d+$/.test(protocol!) ? Number(protocol) : protocol!, Number(port)], value: '' };
  };
  return {
    removed: linesOf(diff.removed).map(keyElement),
    added: linesOf(diff.added).map((line) => byKey.get(keyOf(line))!),
    keysRemoved: linesOf(diff.keysRemoved).map(keyElement),
    keysAdded: linesOf(diff.keysAdded).map((key) => byKey.get(key)!),
  };
}

/**
 * One set or map of an `nft -j list set|map` listing as the lines the addon's dump reads
 * (SetRead, nft_element_dump.cc): `address protocol port value[ comment]` for a map, `address
 * protocol port` for a set of its keys, `address protocol port source` for the own-address set,
 * `address protocol port jump chain` for a verdict map; addresses as the model writes them.
 * Throws on an element of another form: the set is then written whole.
 */
export function listedSetLines(listing: string, kind: 'map' | 'keys' | 'sourced' | 'verdicts'): string[] {
  if (kind === 'keys') return listedSetElements(listing, 'keys').map(keyText);
  if (kind === 'sourced') return listedSetElements(listing, 'sourced').map(keyText);
  if (kind === 'verdicts') return listedSetElements(listing, 'verdicts').map(checkText);
  const doc = JSON.parse(listing) as { nftables?: Array<{ map?: { elem?: unknown[] } }> };
  const map = doc.nftables?.find((o) => o.map)?.map;
  if (!map) throw new Error('the listing holds no map');
  return (map.elem ?? []).map((raw) => {
    const unexpected = () => new Error(`unexpected map element ${JSON.stringify(raw)}`);
    if (!Array.isArray(raw) || raw.length !== 2 || typeof raw[1] !== 'string') throw unexpected();
    const wrapped = (raw[0] as { elem?: { val?: unknown; comment?: unknown } }).elem;
    const parts = ((wrapped ? wrapped.val : raw[0]) as { concat?: unknown[] }).concat;
    if (!Array.isArray(parts) || parts.length !== 3) throw unexpected();
    const [address, protocol, port] = parts;
    if (typeof address !== 'string' || (typeof protocol !== 'string' && typeof protocol !== 'number')) {
      throw unexpected();
    }
    if (typeof port !== 'number') throw unexpected();
    const line = `${listedAddress(address)} ${protocol} ${port} ${listedAddress(raw[1])}`;
    const comment = wrapped?.comment;
    return typeof comment === 'string' && comment !== '' ? `${line} ${comment}` : line;
  });
}

/**
 * Where a read back found an element (ListedRef): in the map and the key set ('both', also what
 * the elements we programmed are), or in one of them only.
 */
export interface ListedRef {
  element: MapElement;
  in: 'both' | 'map' | 'keySet';
}

export function listedIn(e: KernelElement): ListedRef['in'] {
  return (e.ref as ListedRef | undefined)?.in ?? 'both';
}

/** An element to delete: as it was listed when it was read back, else as we write it. */
export function listedElement(e: KernelElement): MapElement {
  return (e.ref as ListedRef | undefined)?.element ?? mapElement(e as Entry);
}
