// Desired state -> nftables objects, as JSON commands (partial syncs, the probe) and as nft text
// (full syncs, and what --dry-run prints). Pure: no I/O. Both come from the same names and the
// same element list; a kernel test checks that both give the same table.

import type { DesiredState, Entry, Family, FamilyState, LocalPodMatch } from '../../model/types.js';

export const TABLE_NAME = 'ipvs-node-controller';
export const MAP_NAME = 'external-ip-to-cluster-ip';
export const LOCAL_POD_SET = 'local-pod-cidrs';
export const PREROUTING_CHAIN = 'prerouting-from-local-pods';
export const OUTPUT_CHAIN = 'output-from-node';
export const TRANSLATE_CHAIN = 'mark-for-masquerade-and-dnat';
/** dstnat - 10: before kube-proxy's NAT. Written as a number: nft 1.0.6 rejects `dstnat` on output. */
export const CHAIN_PRIORITY = -110;

export type NftFamily = 'ip' | 'ip6';
export const NFT_FAMILY: Record<Family, NftFamily> = { ipv4: 'ip', ipv6: 'ip6' };
const ADDR_TYPE: Record<Family, string> = { ipv4: 'ipv4_addr', ipv6: 'ipv6_addr' };

/** One nft JSON command, e.g. `{ add: { table: {...} } }`. */
export type NftCommand = Record<string, unknown>;

export function nftDocument(commands: NftCommand[]): string {
  return JSON.stringify({ nftables: commands });
}

function protoName(e: Pick<Entry, 'protocol'>): string {
  return e.protocol.toLowerCase();
}

// ---- JSON ----------------------------------------------------------------------------------

function tableRef(family: Family) {
  return { family: NFT_FAMILY[family], name: TABLE_NAME };
}

function daddrKeyExpr(family: Family) {
  return {
    concat: [
      { payload: { protocol: NFT_FAMILY[family], field: 'daddr' } },
      { meta: { key: 'l4proto' } },
      { payload: { protocol: 'th', field: 'dport' } },
    ],
  };
}

export function mapElementJson(e: Entry): unknown {
  return [{ elem: { val: { concat: [e.externalIp, protoName(e), e.port] }, comment: e.service } }, e.clusterIp];
}

export function mapKeyJson(e: Pick<Entry, 'externalIp' | 'protocol' | 'port'>): unknown {
  return { concat: [e.externalIp, protoName(e), e.port] };
}

function cidrElementJson(cidr: string): unknown {
  const [addr, len] = cidr.split('/');
  return { prefix: { addr, len: Number(len) } };
}

function localPodMatchExpr(family: Family, match: LocalPodMatch): unknown | undefined {
  switch (match.kind) {
    case 'cidrs':
      return {
        match: {
          op: '==',
          left: { payload: { protocol: NFT_FAMILY[family], field: 'saddr' } },
          right: `@${LOCAL_POD_SET}`,
        },
      };
    case 'interface':
      return { match: { op: '==', left: { meta: { key: 'iifname' } }, right: match.name } };
    case 'interfacePrefix':
      return { match: { op: '==', left: { meta: { key: 'iifname' } }, right: `${match.prefix}*` } };
    case 'none':
      return undefined;
  }
}

/**
 * The whole table of one family, replacing whatever is there, as one transaction:
 * `add table` (so that `delete` cannot fail), `delete table`, then everything anew.
 */
export function renderFullSyncJson(
  family: Family,
  state: FamilyState,
  masqueradeMark: number,
  elementJson: (e: Entry) => unknown = mapElementJson,
): NftCommand[] {
  const t = tableRef(family);
  const base = { family: t.family, table: TABLE_NAME };
  const lookup = { match: { op: '==', left: daddrKeyExpr(family), right: `@${MAP_NAME}` } };
  const jump = { jump: { target: TRANSLATE_CHAIN } };
  const cmds: NftCommand[] = [
    { add: { table: t } },
    { delete: { table: t } },
    { add: { table: { ...t, comment: 'managed by ipvs-node-controller; do not edit' } } },
    {
      add: {
        map: {
          ...base,
          name: MAP_NAME,
          type: [ADDR_TYPE[family], 'inet_proto', 'inet_service'],
          map: ADDR_TYPE[family],
          comment: 'external IP . protocol . port : ClusterIP',
        },
      },
    },
  ];
  if (state.entries.length > 0) {
    cmds.push({ add: { element: { ...base, name: MAP_NAME, elem: state.entries.map(elementJson) } } });
  }
  const podMatch = localPodMatchExpr(family, state.localPodMatch);
  if (state.localPodMatch.kind === 'cidrs') {
    cmds.push({
      add: {
        set: { ...base, name: LOCAL_POD_SET, type: ADDR_TYPE[family], flags: ['interval'], comment: 'local pod CIDRs' },
      },
    });
    if (state.localPodMatch.cidrs.length > 0) {
      cmds.push({
        add: { element: { ...base, name: LOCAL_POD_SET, elem: state.localPodMatch.cidrs.map(cidrElementJson) } },
      });
    }
  }
  cmds.push(
    {
      add: {
        chain: { ...base, name: TRANSLATE_CHAIN },
      },
    },
    {
      add: {
        rule: {
          ...base,
          chain: TRANSLATE_CHAIN,
          expr: [
            {
              mangle: {
                key: { meta: { key: 'mark' } },
                value: { '|': [{ meta: { key: 'mark' } }, masqueradeMark] },
              },
            },
            {
              dnat: { family: NFT_FAMILY[family], addr: { map: { key: daddrKeyExpr(family), data: `@${MAP_NAME}` } } },
            },
          ],
        },
      },
    },
    {
      add: {
        chain: { ...base, name: OUTPUT_CHAIN, type: 'nat', hook: 'output', prio: CHAIN_PRIORITY, policy: 'accept' },
      },
    },
    {
      add: {
        rule: {
          ...base,
          chain: OUTPUT_CHAIN,
          expr: [
            { match: { op: '==', left: { fib: { result: 'type', flags: ['saddr'] } }, right: 'local' } },
            lookup,
            jump,
          ],
        },
      },
    },
  );
  if (podMatch) {
    cmds.push(
      {
        add: {
          chain: {
            ...base,
            name: PREROUTING_CHAIN,
            type: 'nat',
            hook: 'prerouting',
            prio: CHAIN_PRIORITY,
            policy: 'accept',
          },
        },
      },
      { add: { rule: { ...base, chain: PREROUTING_CHAIN, expr: [podMatch, lookup, jump] } } },
    );
  }
  return cmds;
}

/** Map changes only: deletions first, then additions, in one transaction. */
export function renderMapChangesJson(family: Family, removed: Entry[], added: Entry[]): NftCommand[] {
  const base = { family: NFT_FAMILY[family], table: TABLE_NAME, name: MAP_NAME };
  const cmds: NftCommand[] = [];
  if (removed.length > 0) cmds.push({ delete: { element: { ...base, elem: removed.map(mapKeyJson) } } });
  if (added.length > 0) cmds.push({ add: { element: { ...base, elem: added.map(mapElementJson) } } });
  return cmds;
}

export function renderDeleteTablesJson(families: readonly Family[]): NftCommand[] {
  return families.flatMap((f) => [{ add: { table: tableRef(f) } }, { delete: { table: tableRef(f) } }]);
}

// ---- text (--dry-run, and what a full sync applies) ------------------------------------------

function quote(s: string): string {
  return s.includes('"') || s.includes('\\') ? `"${s.replace(/["\\]/g, '\\$&')}"` : `"${s}"`;
}

/** One map element as nft text: `198.51.100.7 . tcp . 443 comment "ns/name" : 10.96.0.10`. */
export function mapElementText(e: Entry): string {
  // Joined rather than a template literal: one flat string, which the backend keeps per entry.
  return [e.externalIp, ' . ', protoName(e), ' . ', e.port, ' comment ', quote(e.service), ' : ', e.clusterIp].join('');
}

function localPodMatchText(family: Family, match: LocalPodMatch): string | undefined {
  switch (match.kind) {
    case 'cidrs':
      return `${NFT_FAMILY[family]} saddr @${LOCAL_POD_SET}`;
    case 'interface':
      return `iifname ${quote(match.name)}`;
    case 'interfacePrefix':
      return `iifname ${quote(`${match.prefix}*`)}`;
    case 'none':
      return undefined;
  }
}

/** The table of one family as `nft -f` input (what `nft list table` would show, with elements). */
export function renderFamilyText(family: Family, state: FamilyState, masqueradeMark: number): string {
  const nf = NFT_FAMILY[family];
  const key = `${nf} daddr . meta l4proto . th dport`;
  const lines: string[] = [`table ${nf} ${TABLE_NAME} {`];
  lines.push(`\tcomment "managed by ipvs-node-controller; do not edit"`, '');
  if (state.localPodMatch.kind === 'cidrs') {
    lines.push(`\tset ${LOCAL_POD_SET} {`, `\t\ttype ${ADDR_TYPE[family]}`, '\t\tflags interval');
    lines.push(`\t\tcomment "local pod CIDRs"`);
    if (state.localPodMatch.cidrs.length > 0) lines.push(`\t\telements = { ${state.localPodMatch.cidrs.join(', ')} }`);
    lines.push('\t}', '');
  }
  lines.push(`\tmap ${MAP_NAME} {`, `\t\ttype ${ADDR_TYPE[family]} . inet_proto . inet_service : ${ADDR_TYPE[family]}`);
  lines.push(`\t\tcomment "external IP . protocol . port : ClusterIP"`);
  if (state.entries.length > 0) {
    lines.push('\t\telements = {', `\t\t\t${state.entries.map(mapElementText).join(',\n\t\t\t')}`, '\t\t}');
  }
  lines.push('\t}', '');
  const podMatch = localPodMatchText(family, state.localPodMatch);
  if (podMatch) {
    lines.push(`\tchain ${PREROUTING_CHAIN} {`);
    lines.push(`\t\ttype nat hook prerouting priority ${CHAIN_PRIORITY}; policy accept;`);
    lines.push(`\t\t${podMatch} ${key} @${MAP_NAME} jump ${TRANSLATE_CHAIN}`, '\t}', '');
  } else if (state.localPodMatch.kind === 'none') {
    // One line whatever the reason holds: the text is also applied.
    lines.push(`\t# no prerouting chain: ${state.localPodMatch.reason.replace(/[\r\n]+/g, ' ')}`, '');
  }
  lines.push(`\tchain ${OUTPUT_CHAIN} {`);
  lines.push(`\t\ttype nat hook output priority ${CHAIN_PRIORITY}; policy accept;`);
  lines.push(`\t\tfib saddr type local ${key} @${MAP_NAME} jump ${TRANSLATE_CHAIN}`, '\t}', '');
  lines.push(`\tchain ${TRANSLATE_CHAIN} {`);
  // One rule, as in the JSON rendering: mark, then DNAT.
  const mark = `meta mark set meta mark | 0x${masqueradeMark.toString(16).padStart(8, '0')}`;
  lines.push(`\t\t${mark} dnat ${nf} to ${key} map @${MAP_NAME}`, '\t}', '}');
  return lines.join('\n') + '\n';
}

export function renderDesiredStateText(desired: DesiredState): string {
  return (['ipv4', 'ipv6'] as const).map((f) => renderFamilyText(f, desired[f], desired.masqueradeMark)).join('\n');
}
