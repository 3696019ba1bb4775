// nft text of the typed objects (objects.ts): what --dry-run prints and `nft -f` reads, as
// `nft list table` prints a table with its elements. Pure: no I/O.

import {
  fullLength,
  type BaseChainSpec,
  type ChainObject,
  type CounterObject,
  type ElementObject,
  type MapElement,
  type MapObject,
  type NftFamily,
  type RuleObject,
  type SetObject,
  type Statement,
  type TableObject,
} from './objects.js';

export function quote(s: string): string {
  return `"${s.replace(/["\\]/g, '\\$&')}"`;
}

export function statementText(family: NftFamily, s: Statement): string {
  const key = `${family} daddr . meta l4proto . th dport`;
  switch (s.kind) {
    case 'localAddress':
      return `fib ${s.field} type local`;
    case 'sourceInPrefix':
      return `${family} saddr ${s.length === fullLength(family) ? s.address : `${s.address}/${s.length}`}`;
    case 'inputInterface':
      return `iifname ${quote(s.name)}`;
    case 'destinationIn':
      return `${key} @${s.name}`;
    case 'orMark':
      return `meta mark set meta mark | 0x${s.mark.toString(16).padStart(8, '0')}`;
    case 'dnatByMap':
      return `dnat ${family} to ${key} map @${s.map}`;
    case 'verdictByMap':
      return `${key} vmap @${s.map}`;
    case 'keyAndSourceIn':
      return `${key} . ${family} saddr @${s.set}`;
    case 'sourceInPrefixes':
      return `${family} saddr { ${s.prefixes.map((p) => (p.length === fullLength(family) ? p.address : `${p.address}/${p.length}`)).join(', ')} }`;
    case 'counter':
      return `counter name ${quote(s.name)}`;
    case 'jump':
      return `jump ${s.chain}`;
    case 'accept':
      return 'accept';
    case 'return':
      return 'return';
  }
}

export function ruleText(r: RuleObject): string {
  return r.statements.map((s) => statementText(r.family, s)).join(' ');
}

/** One map element as nft text: `198.51.100.7 . tcp . 443 comment "ns/name" : 10.96.0.10`. */
export function mapElementText(e: MapElement): string {
  const comment = e.comment === undefined ? '' : ` comment ${quote(e.comment)}`;
  return `${e.key.join(' . ')}${comment} : ${e.value}`;
}

function elementsText(o: ElementObject): string[] {
  if ('keys' in o) return o.elements.map((e) => e.key.join(' . '));
  if ('verdicts' in o) return o.elements.map((e) => `${e.key.join(' . ')} : jump ${e.chain}`);
  return 'map' in o ? o.elements.map(mapElementText) : o.elements.map((e) => `${e.address}/${e.length}`);
}

function chainSpecText(base: BaseChainSpec): string {
  return `type ${base.type} hook ${base.hook} priority ${base.priority}; policy ${base.policy};`;
}

/** The contents of one table, as `nft list table` shows them (with elements). */
export interface TableContents {
  table: TableObject;
  sets: SetObject[];
  maps: MapObject[];
  /** Named counters (their values are the kernel's: `nft -f` of this text leaves them as they are). */
  counters?: CounterObject[];
  /** Elements of the sets and maps above. */
  elements: ElementObject[];
  chains: ChainObject[];
  rules: RuleObject[];
  /** Comment lines written before the chains (why a chain is left out, say). */
  notes?: string[];
}

/** A table as an `nft -f` block, as `nft list table` prints it. */
export function tableText(t: TableContents): string {
  const lines: string[] = [`table ${t.table.family} ${t.table.name} {`];
  if (t.table.comment) lines.push(`\tcomment ${quote(t.table.comment)}`, '');
  const elementsOf = (name: string) => t.elements.filter((e) => e.set === name).flatMap(elementsText);
  for (const s of t.sets) {
    lines.push(`\tset ${s.name} {`, `\t\ttype ${typeof s.type === 'string' ? s.type : s.type.join(' . ')}`);
    if (s.flags) lines.push(`\t\tflags ${s.flags.join(',')}`);
    if (s.size !== undefined) lines.push(`\t\tsize ${s.size}`);
    if (s.comment) lines.push(`\t\tcomment ${quote(s.comment)}`);
    const elements = elementsOf(s.name);
    // A set of concatenated keys is written a key a line, as a map is; prefixes on one line.
    if (elements.length > 0 && typeof s.type !== 'string') {
      lines.push('\t\telements = {', `\t\t\t${elements.join(',\n\t\t\t')}`, '\t\t}');
    } else if (elements.length > 0) lines.push(`\t\telements = { ${elements.join(', ')} }`);
    lines.push('\t}', '');
  }
  for (const m of t.maps) {
    lines.push(`\tmap ${m.name} {`, `\t\ttype ${m.type.join(' . ')} : ${m.data}`);
    if (m.size !== undefined) lines.push(`\t\tsize ${m.size}`);
    if (m.comment) lines.push(`\t\tcomment ${quote(m.comment)}`);
    const elements = elementsOf(m.name);
    if (elements.length > 0) lines.push('\t\telements = {', `\t\t\t${elements.join(',\n\t\t\t')}`, '\t\t}');
    lines.push('\t}', '');
  }
  for (const c of t.counters ?? []) lines.push(`\tcounter ${c.name} {`, '\t}', '');
  for (const note of t.notes ?? []) lines.push(`\t# ${note.replace(/[\r\n]+/g, ' ')}`, '');
  t.chains.forEach((c, i) => {
    lines.push(`\tchain ${c.name} {`);
    if (c.base) lines.push(`\t\t${chainSpecText(c.base)}`);
    for (const r of t.rules) if (r.chain === c.name) lines.push(`\t\t${ruleText(r)}`);
    lines.push('\t}');
    if (i < t.chains.length - 1) lines.push('');
  });
  lines.push('}');
  return lines.join('\n') + '\n';
}
