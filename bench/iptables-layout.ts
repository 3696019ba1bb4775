// What one change costs iptables-restore at N entries, for two layouts of the same rules: the
// backend's (IPVS_PREROUTING and IPVS_OUTPUT hold one rule per entry each) and one spread over 256
// chains per hook by the last byte of the destination (`-d 0.0.0.B/0.0.0.255 -j <hook>_B`, about
// N/256 rules per chain). A change is what a partial sync writes for one entry whose address
// moved: a `-D` by spec and an `-A` in each hook's chain, one `-restore --noflush -w`. Both
// variants. Prints figures; asserts nothing. Re-runs itself inside `unshare --net`, so the
// machine's own firewall is never touched.
//
//   node dist/bench/iptables-layout.js [--entries 10000] [--changes 10]

import { execFileSync } from 'node:child_process';
import { performance } from 'node:perf_hooks';
import { parseArgs } from 'node:util';
import { variantCommand, type IptablesVariant } from '../src/backends/iptables/executor.js';
import { inPrivateNetworkNamespace } from './namespace.js';
import { median } from './stats.js';

const BUCKETS = 256;
type Layout = 'flat' | 'buckets';

const address = (i: number) => `100.64.${Math.floor(i / 250)}.${(i % 250) + 1}`;
const preRule = (ip: string, i: number) =>
  `-s 10.244.1.0/24 -d ${ip}/32 -p tcp -m comment --comment "bench/svc-${i}" -m tcp --dport 80 -j DNAT --to-destination 10.96.0.1`;
const outRule = (ip: string, i: number) =>
  `-d ${ip}/32 -p tcp -m comment --comment "bench/svc-${i}" -m addrtype --src-type LOCAL -m tcp --dport 80 -j DNAT --to-destination 10.96.0.1`;

function chains(layout: Layout, ip: string): [string, string] {
  if (layout === 'flat') return ['IPVS_PREROUTING', 'IPVS_OUTPUT'];
  const bucket = Number(ip.split('.')[3]);
  return [`IPVS_PRE_${bucket}`, `IPVS_OUT_${bucket}`];
}

function restore(variant: IptablesVariant, text: string): number {
  const start = performance.now();
  execFileSync(variantCommand(variant, 'ipv4', 'restore'), ['-w', '--noflush'], { input: text });
  return performance.now() - start;
}

function wholeTable(layout: Layout, entries: number): string {
  const lines = ['*nat', ':IPVS_PREROUTING - [0:0]', ':IPVS_OUTPUT - [0:0]'];
  if (layout === 'buckets') {
    for (let b = 0; b < BUCKETS; b++) {
      lines.push(`:IPVS_PRE_${b} - [0:0]`, `:IPVS_OUT_${b} - [0:0]`);
      lines.push(`-A IPVS_PREROUTING -d 0.0.0.${b}/0.0.0.255 -j IPVS_PRE_${b}`);
      lines.push(`-A IPVS_OUTPUT -d 0.0.0.${b}/0.0.0.255 -j IPVS_OUT_${b}`);
    }
  }
  for (let i = 0; i < entries; i++) {
    const ip = address(i);
    const [pre, out] = chains(layout, ip);
    lines.push(`-A ${pre} ${preRule(ip, i)}`, `-A ${out} ${outRule(ip, i)}`);
  }
  lines.push('-I PREROUTING 1 -j IPVS_PREROUTING', '-I OUTPUT 1 -j IPVS_OUTPUT', 'COMMIT', '');
  return lines.join('\n');
}

function removeAll(variant: IptablesVariant, layout: Layout): void {
  const lines = ['*nat', '-D PREROUTING -j IPVS_PREROUTING', '-D OUTPUT -j IPVS_OUTPUT'];
  const names = ['IPVS_PREROUTING', 'IPVS_OUTPUT'];
  if (layout === 'buckets') for (let b = 0; b < BUCKETS; b++) names.push(`IPVS_PRE_${b}`, `IPVS_OUT_${b}`);
  for (const name of names) lines.push(`:${name} - [0:0]`);
  for (const name of names) lines.push(`-X ${name}`);
  restore(variant, [...lines, 'COMMIT', ''].join('\n'));
}

function measure(variant: IptablesVariant, layout: Layout, entries: number, changes: number): string[] {
  const wholeMs = restore(variant, wholeTable(layout, entries));
  // One entry moves back and forth between its address and one in another range, same last byte.
  const i = Math.floor(entries / 2);
  let [from, to] = [address(i), address(i).replace(/^100\.64\./, '100.99.')];
  const changeMs: number[] = [];
  for (let k = 0; k < changes; k++) {
    const [preFrom, outFrom] = chains(layout, from);
    const [preTo, outTo] = chains(layout, to);
    changeMs.push(
      restore(
        variant,
        [
          '*nat',
          `-D ${preFrom} ${preRule(from, i)}`,
          `-D ${outFrom} ${outRule(from, i)}`,
          `-A ${preTo} ${preRule(to, i)}`,
          `-A ${outTo} ${outRule(to, i)}`,
          'COMMIT',
          '',
        ].join('\n'),
      ),
    );
    [from, to] = [to, from];
  }
  removeAll(variant, layout);
  const ms = (v: number) => `${v.toFixed(1)} ms`;
  return [
    `iptables-${variant}`,
    layout,
    String(2 * entries),
    ms(wholeMs),
    ms(median(changeMs)),
    ms(Math.max(...changeMs)),
  ];
}

function benchmark(entries: number, changes: number): void {
  const header = ['variant', 'layout', 'rules', 'whole write', 'change p50', 'change max'];
  const rows: string[][] = [];
  for (const variant of ['legacy', 'nft'] as const) {
    for (const layout of ['flat', 'buckets'] as const) rows.push(measure(variant, layout, entries, changes));
  }
  const widths = header.map((h, c) => Math.max(h.length, ...rows.map((r) => r[c]!.length)));
  const line = (cells: string[]) => cells.map((v, c) => (c < 2 ? v.padEnd(widths[c]!) : v.padStart(widths[c]!)));
  console.log(`${entries} entries, one DNAT rule per entry and hook; a change: a -D and an -A per hook,`);
  console.log(`one -restore --noflush -w (${changes} changes; p50 and the slowest).`);
  for (const cells of [header, ...rows]) console.log(`   ${line(cells).join('  ')}`);
}

await inPrivateNetworkNamespace(import.meta.url, (args) => {
  const { values } = parseArgs({
    args,
    options: {
      entries: { type: 'string', default: '10000' },
      changes: { type: 'string', default: '10' },
    },
  });
  benchmark(Number(values.entries), Number(values.changes));
});
