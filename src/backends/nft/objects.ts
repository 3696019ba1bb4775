// Typed nftables objects and transactions (sigs.k8s.io/knftables is the model): a transaction is
// a list of verbs (add, delete, flush) on objects (table, chain, rule, set, map, element). Two
// writers derive from the same objects: the nft JSON document libnftables applies, and nft text.
// Pure: no I/O.

export type NftFamily = 'ip' | 'ip6';

export interface TableObject {
  kind: 'table';
  family: NftFamily;
  name: string;
  comment?: string;
}

export interface BaseChainSpec {
  type: 'nat';
  hook: 'prerouting' | 'output';
  priority: number;
  policy: 'accept';
}

export interface ChainObject {
  kind: 'chain';
  family: NftFamily;
  table: string;
  name: string;
  /** Set for a base chain: the hook packets enter it from. */
  base?: BaseChainSpec;
}

/** The statements our rules are made of; the family of the rule says which address header. */
export type Statement =
  /** fib saddr|daddr type local: the packet comes from (goes to) an address of this node. */
  | { kind: 'localAddress'; field: 'saddr' | 'daddr' }
  /** <family> saddr <address>/<length> (the address alone when the length is the whole address) */
  | { kind: 'sourceInPrefix'; address: string; length: number }
  /** iifname "name" (a trailing `*` matches a prefix) */
  | { kind: 'inputInterface'; name: string }
  /** <family> daddr . meta l4proto . th dport @name: the key in a map (no data read) or a set */
  | { kind: 'destinationIn'; name: string }
  /** meta mark set meta mark | mark */
  | { kind: 'orMark'; mark: number }
  /** dnat <family> to <family> daddr . meta l4proto . th dport map @map */
  | { kind: 'dnatByMap'; map: string }
  /** <family> daddr . meta l4proto . th dport vmap @map: the verdict of the key's element, if any */
  | { kind: 'verdictByMap'; map: string }
  /** <family> daddr . meta l4proto . th dport . <family> saddr @set */
  | { kind: 'keyAndSourceIn'; set: string }
  /** <family> saddr { prefix, ... }: an anonymous set, replaced with the rule that holds it */
  | { kind: 'sourceInPrefixes'; prefixes: readonly PrefixElement[] }
  /** counter name "name": counts the packets of the rule in a counter object of the table */
  | { kind: 'counter'; name: string }
  | { kind: 'jump'; chain: string }
  | { kind: 'accept' }
  | { kind: 'return' };

export interface RuleObject {
  kind: 'rule';
  family: NftFamily;
  table: string;
  chain: string;
  statements: Statement[];
}

/**
 * A named counter of the table: what the rules that name it matched, packets and bytes. A rule
 * rewritten or a chain flushed leaves it as it is; the kernel refuses to delete it while a rule
 * names it. In a nat chain only a connection's first packet is seen, so its packets are the
 * connections the rules translated.
 */
export interface CounterObject {
  kind: 'counter';
  family: NftFamily;
  table: string;
  name: string;
}

export interface SetObject {
  kind: 'set';
  family: NftFamily;
  table: string;
  name: string;
  /** Key type, e.g. `ipv4_addr`, or the types of a concatenation. */
  type: string | string[];
  flags?: Array<'interval'>;
  /** As a map's size (MapObject.size). */
  size?: number;
  comment?: string;
}

export interface MapObject {
  kind: 'map';
  family: NftFamily;
  table: string;
  name: string;
  /** Concatenated key types. */
  type: string[];
  /** Data type. */
  data: string;
  /**
   * The most elements the map holds (`size`). Declared, the kernel keeps the map in a hash of
   * fixed buckets made for that many (nft_set_hash's `hash` type); undeclared, in a resizable
   * hash that starts small and is rehashed as it grows. An element beyond it is refused (ENFILE).
   */
  size?: number;
  comment?: string;
}

/** One element of a concatenated map: key parts, the data, a comment. */
export interface MapElement {
  key: ReadonlyArray<string | number>;
  value: string;
  comment?: string;
}

/** One element of an interval set: a prefix. */
export interface PrefixElement {
  address: string;
  length: number;
}

/** One element of a verdict map: a key and the chain it jumps to. */
export interface VerdictElement {
  key: ReadonlyArray<string | number>;
  chain: string;
}

export type ElementObject =
  | { kind: 'element'; family: NftFamily; table: string; set: string; map: true; elements: readonly MapElement[] }
  /** The keys of map elements, in a set of the same key type (their values are not written). */
  | { kind: 'element'; family: NftFamily; table: string; set: string; keys: true; elements: readonly MapElement[] }
  /** Keys of a verdict map, each jumping to a chain. */
  | {
      kind: 'element';
      family: NftFamily;
      table: string;
      set: string;
      verdicts: true;
      elements: readonly VerdictElement[];
    }
  | { kind: 'element'; family: NftFamily; table: string; set: string; elements: readonly PrefixElement[] };

export type NftObject = TableObject | ChainObject | RuleObject | SetObject | MapObject | CounterObject | ElementObject;

export type Verb = 'add' | 'delete' | 'flush';

export interface Operation {
  verb: Verb;
  object: NftObject;
}

/** An ordered list of operations, applied as one atomic transaction. */
export class Transaction {
  readonly operations: Operation[] = [];

  add(...objects: NftObject[]): this {
    for (const object of objects) this.operations.push({ verb: 'add', object });
    return this;
  }

  /** Deletes a table, chain, set or map; for elements, deletes them by key (the value is ignored). */
  delete(...objects: NftObject[]): this {
    for (const object of objects) this.operations.push({ verb: 'delete', object });
    return this;
  }

  /** Empties a chain (of its rules), a set or a map (of its elements). */
  flush(...objects: Array<ChainObject | SetObject | MapObject>): this {
    for (const object of objects) this.operations.push({ verb: 'flush', object });
    return this;
  }

  get size(): number {
    return this.operations.length;
  }
}

// ---- JSON writer ----------------------------------------------------------------------------

/** One nft JSON command, e.g. `{ add: { table: {...} } }`. */
export type NftCommand = Record<string, unknown>;

function daddrKey(family: NftFamily): unknown {
  return {
    concat: [
      { payload: { protocol: family, field: 'daddr' } },
      { meta: { key: 'l4proto' } },
      { payload: { protocol: 'th', field: 'dport' } },
    ],
  };
}

/** The bits of a whole address of the family. */
export function fullLength(family: NftFamily): number {
  return family === 'ip6' ? 128 : 32;
}

function statementJson(family: NftFamily, s: Statement): unknown {
  switch (s.kind) {
    case 'localAddress':
      return { match: { op: '==', left: { fib: { result: 'type', flags: [s.field] } }, right: 'local' } };
    case 'sourceInPrefix': {
      // As a listing shows it: a whole address is an address, not a prefix.
      const right = s.length === fullLength(family) ? s.address : { prefix: { addr: s.address, len: s.length } };
      return { match: { op: '==', left: { payload: { protocol: family, field: 'saddr' } }, right } };
    }
    case 'inputInterface':
      return { match: { op: '==', left: { meta: { key: 'iifname' } }, right: s.name } };
    case 'destinationIn':
      return { match: { op: '==', left: daddrKey(family), right: `@${s.name}` } };
    case 'orMark':
      return { mangle: { key: { meta: { key: 'mark' } }, value: { '|': [{ meta: { key: 'mark' } }, s.mark] } } };
    case 'dnatByMap':
      // No `family`: the table's family says it, and a listing leaves it out too.
      return { dnat: { addr: { map: { key: daddrKey(family), data: `@${s.map}` } } } };
    case 'verdictByMap':
      return { vmap: { key: daddrKey(family), data: `@${s.map}` } };
    case 'keyAndSourceIn':
      return {
        match: {
          op: '==',
          left: {
            concat: [
              ...(daddrKey(family) as { concat: unknown[] }).concat,
              { payload: { protocol: family, field: 'saddr' } },
            ],
          },
          right: `@${s.set}`,
        },
      };
    case 'sourceInPrefixes': {
      const items = s.prefixes.map((p) =>
        p.length === fullLength(family) ? p.address : { prefix: { addr: p.address, len: p.length } },
      );
      return { match: { op: '==', left: { payload: { protocol: family, field: 'saddr' } }, right: { set: items } } };
    }
    case 'counter':
      return { counter: s.name };
    case 'jump':
      return { jump: { target: s.chain } };
    case 'accept':
      return { accept: null };
    case 'return':
      return { return: null };
  }
}

/**
 * Writes transactions as nft JSON. Nothing is kept between documents: only a first sync or a
 * change of table shape writes the map whole (a resync verifies it instead), and V8's
 * JSON.stringify of plain objects is as fast as writing the text by hand.
 */
export class JsonWriter {
  document(tx: Transaction): string {
    return JSON.stringify({ nftables: this.commands(tx) });
  }

  commands(tx: Transaction): NftCommand[] {
    return tx.operations.map((op) => ({ [op.verb]: this.objectJson(op.verb, op.object) }));
  }

  private mapElement(e: MapElement): unknown {
    const val = { concat: e.key };
    return [e.comment === undefined ? val : { elem: { val, comment: e.comment } }, e.value];
  }

  private objectJson(verb: Verb, o: NftObject): Record<string, unknown> {
    switch (o.kind) {
      case 'table': {
        const table: Record<string, unknown> = { family: o.family, name: o.name };
        if (verb === 'add' && o.comment !== undefined) table.comment = o.comment;
        return { table };
      }
      case 'chain': {
        const chain: Record<string, unknown> = { family: o.family, table: o.table, name: o.name };
        if (verb === 'add' && o.base) {
          Object.assign(chain, { type: o.base.type, hook: o.base.hook, prio: o.base.priority, policy: o.base.policy });
        }
        return { chain };
      }
      case 'rule':
        return {
          rule: {
            family: o.family,
            table: o.table,
            chain: o.chain,
            expr: o.statements.map((s) => statementJson(o.family, s)),
          },
        };
      case 'set': {
        const set: Record<string, unknown> = { family: o.family, table: o.table, name: o.name };
        if (verb === 'add') {
          set.type = o.type;
          if (o.flags) set.flags = o.flags;
          if (o.size !== undefined) set.size = o.size;
          if (o.comment !== undefined) set.comment = o.comment;
        }
        return { set };
      }
      case 'map': {
        const map: Record<string, unknown> = { family: o.family, table: o.table, name: o.name };
        if (verb === 'add') {
          Object.assign(map, { type: o.type, map: o.data });
          if (o.size !== undefined) map.size = o.size;
          if (o.comment !== undefined) map.comment = o.comment;
        }
        return { map };
      }
      case 'counter':
        return { counter: { family: o.family, table: o.table, name: o.name } };
      case 'element': {
        let elem: unknown[];
        if ('keys' in o) {
          elem = o.elements.map((e) => ({ concat: e.key }));
        } else if ('verdicts' in o) {
          elem =
            verb === 'delete'
              ? o.elements.map((e) => ({ concat: e.key }))
              : o.elements.map((e) => [{ concat: e.key }, { jump: { target: e.chain } }]);
        } else if ('map' in o) {
          // A deletion names keys only.
          elem =
            verb === 'delete' ? o.elements.map((e) => ({ concat: e.key })) : o.elements.map((e) => this.mapElement(e));
        } else {
          elem = o.elements.map((e) => ({ prefix: { addr: e.address, len: e.length } }));
        }
        return { element: { family: o.family, table: o.table, name: o.set, elem } };
      }
    }
  }
}
