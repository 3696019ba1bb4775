// What one change costs iptables-restore at N entries, for two layouts of the same rules: the
// backend's (IPVS_PREROUTING and IPVS_OUTPUT go to bucket chains by the destination's last byte,
// src/backends/iptables/layout.ts) and the flat one of earlier versions (every rule in
// IPVS_PREROUTING / IPVS_OUTPUT themselves). The rules are the backend's own (render.ts and
// partial-write.ts): one TCP port per entry, one local pod CIDR, so a mark and a DNAT rule per
// entry in each hook (4 N rules). A change is what a partial sync writes for one entry whose
// address moved to another with the same last byte: two `-D` by spec and two `-A` per family, one
// `-restore --noflush -w`. "floor": the same restore process appending and deleting one rule of a
// one-rule chain of another writer in the same table: for iptables-legacy, the whole-table replace
// that any write costs. Both variants, IPv4. Prints figures; asserts nothing. Re-runs itself
// inside `unshare --net`, so the machine's own firewall is never touched.
//
//   node dist/bench/iptables-layout.js [--entries 10000] [--changes 10]

import { execFileSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { variantCommand, type IptablesVariant } from '../src/backends/iptables/executor.js';
import { emptyNatTable } from '../src/backends/iptables/parse.js';
import { planPartialWrite } from '../src/backends/iptables/partial-write.js';
import { IptablesAnnex } from '../src/backends/iptables/annex.js';
import { renderFamilyRestore } from '../src/backends/iptables/render.js';
import type { Entry, LocalPodMatch } from '../src/model/types.js';
import { inPrivateNamespaces } from './namespace.js';
import { median, options, table } from './stats.js';

type Layout = 'flat' | 'buckets';
const POD_MATCH: LocalPodMatch = { kind: 'cidrs', cidrs: ['10.244.1.0/24'] };
const MARK = 0x4000;

const address = (i: number) => `100.64.${Math.floor(i / 250)}.${(i % 250) + 1}`;
const entry = (i: number, externalIp = address(i)): Entry => ({
  family: 'ipv4',
  externalIp,
  protocol: 'TCP',
  port: 80,
  clusterIp: `10.96.${(i >> 8) & 255}.${i & 255}`,
  service: `bench/svc-${i}`,
});

/** The flat layout of the same restore input: no bucket chains, no gotos, every rule in its entry chain. */
function flat(text: string): string {
  return text
    .split('\n')
    .filter((l) => !/^:IPVS_\w+_\w+ /.test(l) && !/ -g IPVS_/.test(l))
    .map((l) => l.replace(/^(-[AD]) (IPVS_PREROUTING|IPVS_OUTPUT)_\w+ /, '$1 $2 '))
    .join('\n');
}

function restore(variant: IptablesVariant, text: string): number {
  const start = performance.now();
  execFileSync(variantCommand(variant, 'ipv4', 'restore'), ['-w', '--noflush'], { input: text });
  return performance.now() - start;
}

function removeAll(variant: IptablesVariant): void {
  const save = execFileSync(variantCommand(variant, 'ipv4', 'save'), ['-t', 'nat'], {
    encoding: 'utf8',
    maxBuffer: 1 << 30,
  });
  const chains = [...save.matchAll(/^:(IPVS_\w+|BENCH-FLOOR) /gm)].map((m) => m[1]!);
  const lines = ['*nat', '-D PREROUTING -j IPVS_PREROUTING', '-D OUTPUT -j IPVS_OUTPUT'];
  restore(
    variant,
    [...lines, ...chains.map((c) => `:${c} - [0:0]`), ...chains.map((c) => `-X ${c}`), 'COMMIT', ''].join('\n'),
  );
}

function measure(variant: IptablesVariant, layout: Layout, entries: number, changes: number): string[] {
  const all = Array.from({ length: entries }, (_, i) => entry(i));
  const whole = renderFamilyRestore('ipv4', { entries: all, localPodMatch: POD_MATCH }, MARK, emptyNatTable());
  const shape = { localPodMatch: POD_MATCH, masqueradeMark: MARK, useKubeMarkMasq: false };
  const record = IptablesAnnex.of(whole, shape);
  const as = (text: string) => (layout === 'flat' ? flat(text) : text);
  const wholeMs = restore(variant, as(whole.text));
  restore(variant, '*nat\n:BENCH-FLOOR - [0:0]\n-A BENCH-FLOOR -j RETURN\nCOMMIT\n');
  // One entry moves back and forth between its address and one in another range, same last byte.
  const i = Math.floor(entries / 2);
  let [from, to] = [entry(i), entry(i, address(i).replace(/^100\.64\./, '100.99.'))];
  const changeMs: number[] = [];
  const floorMs: number[] = [];
  for (let k = 0; k < changes; k++) {
    const write = planPartialWrite('ipv4', record, [from], [to], Number.POSITIVE_INFINITY);
    changeMs.push(restore(variant, as(write.text!)));
    for (const [bucket, held] of write.buckets) record.setBucket(bucket, held);
    [from, to] = [to, from];
    floorMs.push(restore(variant, '*nat\n-A BENCH-FLOOR -j RETURN\n-D BENCH-FLOOR -j RETURN\nCOMMIT\n'));
  }
  removeAll(variant);
  const ms = (v: number) => `${v.toFixed(1)} ms`;
  const rules = as(whole.text)
    .split('\n')
    .filter((l) => l.startsWith('-A ')).length;
  return [
    `iptables-${variant}`,
    layout,
    String(rules),
    ms(wholeMs),
    ms(median(changeMs)),
    ms(Math.max(...changeMs)),
    ms(median(floorMs)),
  ];
}

function benchmark(entries: number, changes: number): void {
  const header = ['variant', 'layout', 'rules', 'whole write', 'change p50', 'change max', 'floor p50'];
  const rows: string[][] = [];
  for (const variant of ['legacy', 'nft'] as const) {
    for (const layout of ['flat', 'buckets'] as const) rows.push(measure(variant, layout, entries, changes));
  }
  console.log(`${entries} entries (one TCP port, one pod CIDR: a mark and a DNAT rule per entry and hook, and`);
  console.log(`the gotos of the bucket layout); a change: two -D and two -A, one -restore --noflush -w`);
  console.log(`(${changes} changes; p50 and the slowest). floor: a restore of one rule in another chain.`);
  for (const line of table(header, rows, '   ', [0, 1])) console.log(line);
}

await inPrivateNamespaces(import.meta.url, 'iptables-layout', (args: string[]) => {
  const { entries, changes } = options(args, { entries: 10_000, changes: 10 });
  benchmark(entries, changes);
});
