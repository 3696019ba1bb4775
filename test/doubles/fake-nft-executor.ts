// An NftExecutor without a kernel (knftables' Fake is the model): it keeps a model of the tables
// and applies the driver's typed transactions to it, verb by verb on the objects as the JSON
// writer describes them, with the kernel's rules for what fails (a missing object, a base chain
// whose hook changed, an element added again with another value, a set still named by a rule),
// atomically. Unit tests drive the nft driver through it without root; the kernel tests stay the
// proof with packets.

import { listedSetLines } from '../../src/backends/nft/element-diff.js';
import {
  NftError,
  type NftCommit,
  type NftExecutor,
  type SetRead,
  type SetsRead,
} from '../../src/backends/nft/executor.js';
import {
  JsonWriter,
  type MapElement,
  type NftCommand,
  type NftFamily,
  type Transaction,
} from '../../src/backends/nft/objects.js';
import { MAP_NAME, TABLE_NAME } from '../../src/backends/nft/render.js';
import { elementsTransaction, type MapElementChanges, type MapTarget } from '../../src/backends/nft/transactions.js';

interface FakeChain {
  base?: { type: unknown; hook: unknown; prio: unknown };
  policy?: unknown;
  rules: Array<{ handle: number; expr: unknown[] }>;
}

interface FakeSet {
  kind: 'set' | 'map';
  spec: Record<string, unknown>;
  /** Element by its key's JSON; the value (map data) is undefined for a set. */
  elements: Map<string, { json: unknown; value: unknown }>;
}

interface FakeTable {
  family: string;
  name: string;
  comment?: unknown;
  chains: Map<string, FakeChain>;
  sets: Map<string, FakeSet>;
  /** Named counters: what their rules counted (the fake sends no packets: 0 unless a test sets it). */
  counters: Map<string, number>;
}

type Command = Record<string, Record<string, Record<string, unknown>>>;

const json = new JsonWriter();

/** A transaction's commands (as nft JSON objects), for assertions. */
export function commandsOf(tx: Transaction): NftCommand[] {
  return json.commands(tx);
}

const ENOENT = 'Error: Could not process rule: No such file or directory';

export class FakeNftExecutor implements NftExecutor {
  readonly kind = 'cli' as const;
  /** As the nft command: element changes are JSON transactions. */
  readonly writesElementBatches = false;
  tables = new Map<string, FakeTable>();
  /** Every transaction run (committed or not), oldest first. */
  readonly transactions: Transaction[] = [];
  /** Makes matching transactions fail as the kernel would, with this message. */
  refuse: ((tx: Transaction) => string | undefined) | undefined;
  private handle = 1;
  /** The ruleset generation: bumped by every commit, ours or (through `commitElsewhere`) another's. */
  private generationId = 1;
  /** Whether this executor reads generations (the addon does, the nft command does not). */
  readsGenerations = true;
  /** Whether readSets reads the sets (as the nft command lists them); else it rejects, as an addon without libnftnl. */
  readsElements = false;
  /** Calls of readSets. */
  setReads = 0;

  async run(tx: Transaction): Promise<NftCommit> {
    this.transactions.push(tx);
    this.tables = this.apply(tx);
    const before = this.generationId++;
    return this.readsGenerations ? { generations: { before, after: this.generationId } } : {};
  }

  async generation(): Promise<number | undefined> {
    return this.readsGenerations ? this.generationId : undefined;
  }

  /** Calls of releaseMemory. */
  memoryReleases = 0;

  async releaseMemory(): Promise<void> {
    this.memoryReleases++;
  }

  /** Another writer's commit, made by editing `tables` directly: the generation moves. */
  committedElsewhere(): void {
    this.generationId++;
  }

  async check(tx: Transaction): Promise<void> {
    this.apply(tx);
  }

  async applyElements(
    family: NftFamily,
    changes: MapElementChanges,
    target: MapTarget = { table: TABLE_NAME, map: MAP_NAME },
  ): Promise<NftCommit> {
    return this.run(elementsTransaction(family, changes, target));
  }

  /** Flushes the map and its key set and adds every element, in one transaction. */
  async replaceElements(family: NftFamily, elements: readonly MapElement[], target: MapTarget): Promise<NftCommit> {
    return this.run(elementsTransaction(family, { removed: [], added: elements, flush: true }, target));
  }

  /** Each set as `nft -j list set|map` would list it, read into lines as the nft command's readSets does. */
  async readSets(family: NftFamily, table: string, sets: readonly SetRead[]): Promise<SetsRead> {
    this.setReads++;
    if (!this.readsElements) throw new NftError('this fake reads no elements');
    const t = this.tables.get(`${family} ${table}`);
    const read = sets.map(({ name, kind }) => {
      const s = t?.sets.get(name);
      if (!s) return undefined;
      const elem = [...s.elements.values()].map((e) => (s.kind === 'map' ? [e.json, e.value] : e.json));
      const listing = JSON.stringify({ nftables: [{ [s.kind]: { family, table, name, elem } }] });
      return listedSetLines(listing, kind).join('\n');
    });
    const generation = await this.generation();
    return { sets: read, ms: 0, ...(generation !== undefined ? { generation } : {}) };
  }

  async listChains(family: NftFamily, table: string): Promise<string[]> {
    return [...(this.tables.get(`${family} ${table}`)?.chains.keys() ?? [])];
  }

  async listTable(family: 'ip' | 'ip6', name: string): Promise<string | undefined> {
    const t = this.tables.get(`${family} ${name}`);
    if (!t) return undefined;
    const items: unknown[] = [{ metainfo: { json_schema_version: 1 } }];
    items.push({ table: { family, name, handle: 0, ...(t.comment ? { comment: t.comment } : {}) } });
    for (const [setName, s] of t.sets) {
      const elem = [...s.elements.values()].map((e) => (s.kind === 'map' ? [e.json, e.value] : e.json));
      items.push({ [s.kind]: { ...s.spec, family, table: name, name: setName, ...(elem.length > 0 ? { elem } : {}) } });
    }
    for (const [counterName, packets] of t.counters) {
      items.push({ counter: { family, table: name, name: counterName, handle: 0, packets, bytes: packets * 60 } });
    }
    for (const [chainName, c] of t.chains) {
      items.push({ chain: { family, table: name, name: chainName, ...(c.base ?? {}), policy: c.policy } });
      for (const r of c.rules)
        items.push({ rule: { family, table: name, chain: chainName, handle: r.handle, expr: r.expr } });
    }
    return JSON.stringify({ nftables: items });
  }

  /** Lists a table's counters as `nft -j list counters table` does (the lister's way). */
  async listCounters(family: 'ip' | 'ip6', name: string): Promise<string | undefined> {
    const t = this.tables.get(`${family} ${name}`);
    if (!t) return undefined;
    const items: unknown[] = [{ metainfo: { json_schema_version: 1 } }];
    for (const [counterName, packets] of t.counters) {
      items.push({ counter: { family, table: name, name: counterName, handle: 0, packets, bytes: packets * 60 } });
    }
    return JSON.stringify({ nftables: items });
  }

  /** The elements of a map as `key JSON -> value`, for assertions. */
  mapElements(family: 'ip' | 'ip6', table: string, map: string): Map<string, unknown> | undefined {
    const s = this.tables.get(`${family} ${table}`)?.sets.get(map);
    return s && new Map([...s.elements].map(([k, e]) => [k, e.value]));
  }

  /** Applies a transaction to a copy of the tables; returns the copy, or throws as nft would. */
  private apply(tx: Transaction): Map<string, FakeTable> {
    const refusal = this.refuse?.(tx);
    if (refusal !== undefined) throw new NftError(refusal);
    const tables = cloneTables(this.tables);
    for (const command of json.commands(tx) as Command[]) {
      const [verb, body] = Object.entries(command)[0]!;
      const [kind, o] = Object.entries(body)[0]!;
      this.applyOne(tables, verb, kind, o);
    }
    return tables;
  }

  private applyOne(tables: Map<string, FakeTable>, verb: string, kind: string, o: Record<string, unknown>): void {
    const tableKey = `${String(o.family)} ${String(kind === 'table' ? o.name : o.table)}`;
    if (kind === 'table') {
      if (verb === 'add') {
        const t: FakeTable = tables.get(tableKey) ?? {
          family: String(o.family),
          name: String(o.name),
          chains: new Map(),
          sets: new Map(),
          counters: new Map(),
        };
        if (o.comment !== undefined) t.comment = o.comment;
        tables.set(tableKey, t);
      } else if (verb === 'delete') {
        if (!tables.delete(tableKey)) throw new NftError(ENOENT);
      } else throw new NftError(`fake: ${verb} table is not modelled`);
      return;
    }
    const t = tables.get(tableKey);
    if (!t) throw new NftError(ENOENT);
    const name = String(kind === 'rule' ? o.chain : o.name);
    switch (kind) {
      case 'chain': {
        const c = t.chains.get(name);
        if (verb === 'add') {
          const base = o.hook !== undefined ? { type: o.type, hook: o.hook, prio: o.prio } : undefined;
          if (c && JSON.stringify(c.base) !== JSON.stringify(base)) {
            throw new NftError('Error: Could not process rule: Operation not supported');
          }
          t.chains.set(name, { base, policy: o.policy ?? c?.policy, rules: c?.rules ?? [] });
        } else if (!c) throw new NftError(ENOENT);
        else if (verb === 'flush') c.rules = [];
        else if (verb === 'delete') {
          const jumpedTo = [...t.chains.values()].some((x) => JSON.stringify(x.rules).includes(`"target":"${name}"`));
          if (c.rules.length > 0 || jumpedTo)
            throw new NftError('Error: Could not process rule: Device or resource busy');
          t.chains.delete(name);
        }
        return;
      }
      case 'rule': {
        const c = t.chains.get(name);
        if (!c || verb !== 'add') throw new NftError(c ? `fake: ${verb} rule is not modelled` : ENOENT);
        const text = JSON.stringify(o.expr);
        for (const [, set] of text.matchAll(/"@([^"]+)"/g)) if (!t.sets.has(set!)) throw new NftError(ENOENT);
        for (const [, target] of text.matchAll(/"target":"([^"]+)"/g))
          if (!t.chains.has(target!)) throw new NftError(ENOENT);
        for (const [, counter] of text.matchAll(/"counter":"([^"]+)"/g))
          if (!t.counters.has(counter!)) throw new NftError(ENOENT);
        c.rules.push({ handle: this.handle++, expr: o.expr as unknown[] });
        return;
      }
      case 'set':
      case 'map': {
        const s = t.sets.get(name);
        if (verb === 'add') {
          const { family: _f, table: _t, name: _n, ...spec } = o;
          if (s && JSON.stringify(s.spec.type) !== JSON.stringify(spec.type)) {
            throw new NftError('Error: Could not process rule: File exists');
          }
          t.sets.set(name, s ?? { kind, spec, elements: new Map() });
        } else if (!s) throw new NftError(ENOENT);
        else if (verb === 'flush') s.elements.clear();
        else if (verb === 'delete') {
          const named = [...t.chains.values()].some((c) => JSON.stringify(c.rules).includes(`"@${name}"`));
          if (named) throw new NftError('Error: Could not process rule: Device or resource busy');
          t.sets.delete(name);
        }
        return;
      }
      case 'counter': {
        if (verb === 'add') {
          if (!t.counters.has(name)) t.counters.set(name, 0);
        } else if (verb === 'delete') {
          if (!t.counters.has(name)) throw new NftError(ENOENT);
          const named = [...t.chains.values()].some((c) => JSON.stringify(c.rules).includes(`"counter":"${name}"`));
          if (named) throw new NftError('Error: Could not process rule: Device or resource busy');
          t.counters.delete(name);
        } else throw new NftError(`fake: ${verb} counter is not modelled`);
        return;
      }
      case 'element': {
        const s = t.sets.get(name);
        if (!s) throw new NftError(ENOENT);
        for (const item of o.elem as unknown[]) {
          const isPair = s.kind === 'map' && Array.isArray(item);
          const keyJson = isPair ? (item as unknown[])[0] : item;
          const wrapped = (keyJson as { elem?: { val: unknown } }).elem;
          const key = JSON.stringify(wrapped ? wrapped.val : keyJson);
          const value = isPair ? (item as unknown[])[1] : undefined;
          const old = s.elements.get(key);
          if (verb === 'add') {
            if (old && JSON.stringify(old.value) !== JSON.stringify(value)) {
              throw new NftError('Error: Could not process rule: Device or resource busy');
            }
            if (!old) s.elements.set(key, { json: keyJson, value });
          } else if (verb === 'delete') {
            if (!old) throw new NftError(ENOENT);
            s.elements.delete(key);
          } else throw new NftError(`fake: ${verb} element is not modelled`);
        }
        return;
      }
      default:
        throw new NftError(`fake: ${kind} is not modelled`);
    }
  }
}

function cloneTables(tables: Map<string, FakeTable>): Map<string, FakeTable> {
  const out = new Map<string, FakeTable>();
  for (const [k, t] of tables) {
    out.set(k, {
      ...t,
      chains: new Map([...t.chains].map(([n, c]) => [n, { ...c, rules: [...c.rules] }])),
      sets: new Map([...t.sets].map(([n, s]) => [n, { ...s, elements: new Map(s.elements) }])),
      counters: new Map(t.counters),
    });
  }
  return out;
}
