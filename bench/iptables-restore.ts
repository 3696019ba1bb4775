// The iptables backend programming N LoadBalancer Services (one TCP port each, one local pod
// CIDR: four rules per Service) through one `-restore --noflush` per family, for both variants;
// and, for comparison, the original controller's way: per rule one `iptables -C` and, as the rule
// is missing, one `iptables -A` (a process each). Prints figures; asserts nothing. Re-runs itself
// inside `unshare --net` so that the machine's own firewall is never touched.
//
//   node dist/bench/iptables-restore.js [--original-max N]

import { Reconciler } from '../src/reconciler/reconciler.js';
import { performance } from 'node:perf_hooks';
import { execa } from 'execa';
import { IptablesCommands, variantCommand, type IptablesVariant } from '../src/backends/iptables/executor.js';
import { IptablesDriver } from '../src/backends/iptables/iptables-driver.js';
import { readJumpView } from '../src/backends/iptables/nat-view.js';
import { renderFamilyRestore } from '../src/backends/iptables/render.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import type { DesiredState, ServiceInfo } from '../src/model/types.js';
import { inPrivateNetworkNamespace } from './namespace.js';

const SIZES = [100, 1_000, 10_000];
const ORIGINAL_SIZES = [100, 1_000];
const VARIANTS: IptablesVariant[] = ['legacy', 'nft'];
const RESYNC_REPEATS = 3;
const POD_CIDR = '10.244.1.0/24';

function services(n: number): ServiceInfo[] {
  return Array.from({ length: n }, (_, i) => ({
    namespace: 'bench',
    name: `service-${i}`,
    type: 'LoadBalancer',
    creationTimestamp: '2024-01-01T00:00:00Z',
    clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}`,
    ports: [{ port: 443, protocol: 'TCP' }],
    ingress: [{ ip: `198.${18 + ((i >> 16) & 1)}.${(i >> 8) & 255}.${i & 255}` }],
  }));
}

function desiredState(list: ServiceInfo[]): DesiredState {
  return buildDesiredState(
    list,
    { name: 'bench-node', podCIDRs: [POD_CIDR] },
    {
      detectLocalMode: 'NodeCIDR',
      clusterCidrs: [],
      masqueradeBit: 14,
      localTrafficPolicyOnly: false,
    },
  );
}

async function timed<T>(work: () => Promise<T>): Promise<[number, T]> {
  const start = performance.now();
  const result = await work();
  return [performance.now() - start, result];
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

const ms = (value: number) => `${value >= 100 ? value.toFixed(0) : value.toFixed(1)} ms`;

async function createKubeMarkMasq(variant: IptablesVariant): Promise<void> {
  await new IptablesCommands(variant, 'ipv4').restore(
    '*nat\n:KUBE-MARK-MASQ - [0:0]\n-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\nCOMMIT\n',
  );
}

interface Row {
  what: string;
  n: number;
  rules: number;
  figures: string[];
}

async function measureBackend(variant: IptablesVariant, n: number): Promise<Row> {
  const all = services(n);
  const desired = desiredState(all);
  const oneFewer = desiredState(all.slice(1));
  const backend = new Reconciler(new IptablesDriver(variant));
  const commands = new IptablesCommands(variant, 'ipv4');
  const [firstMs] = await timed(() => backend.sync(desired, { full: true }));
  const resyncMs: number[] = [];
  for (let i = 0; i < RESYNC_REPEATS; i++) resyncMs.push((await timed(() => backend.sync(desired, { full: true })))[0]);
  const changeMs: number[] = [];
  for (let i = 0; i < RESYNC_REPEATS * 2; i++) {
    changeMs.push((await timed(() => backend.sync(i % 2 === 0 ? oneFewer : desired, { full: false })))[0]);
  }
  // The parts of one IPv4 resync: read the nat table, render, restore.
  const [readMs, current] = await timed(() => readJumpView(commands));
  const [renderMs, rendered] = await timed(async () =>
    renderFamilyRestore('ipv4', desired.ipv4, desired.masqueradeMark, current),
  );
  const [restoreMs] = await timed(() => commands.restore(rendered.text));
  await backend.cleanup();
  return {
    what: `iptables-${variant}-restore`,
    n,
    rules: rendered.rules.length,
    figures: [ms(firstMs), ms(median(resyncMs)), ms(median(changeMs)), ms(readMs), ms(renderMs), ms(restoreMs)],
  };
}

/** The original controller: per IP four rules, each `-C` (missing) then `-A`, one process each. */
async function measureOriginal(variant: IptablesVariant, n: number): Promise<Row> {
  const command = variantCommand(variant, 'ipv4', '');
  const nat = ['-w', '-t', 'nat'];
  await execa(command, [...nat, '-N', 'IPVS_PREROUTING']);
  await execa(command, [...nat, '-N', 'IPVS_OUTPUT']);
  await execa(command, [...nat, '-I', 'PREROUTING', '1', '-j', 'IPVS_PREROUTING']);
  await execa(command, [...nat, '-I', 'OUTPUT', '1', '-j', 'IPVS_OUTPUT']);
  const rules: string[][] = [];
  for (const svc of services(n)) {
    const ip = `${svc.ingress![0]!.ip}/32`;
    const comment = ['-m', 'comment', '--comment', `${svc.namespace}/${svc.name}`];
    const pre = ['IPVS_PREROUTING', '-s', POD_CIDR, '-d', ip, ...comment];
    const out = ['IPVS_OUTPUT', '-d', ip, ...comment, '-m', 'addrtype', '--src-type', 'LOCAL'];
    for (const head of [pre, out]) {
      rules.push([...head, '-j', 'KUBE-MARK-MASQ'], [...head, '-j', 'DNAT', '--to-destination', svc.clusterIP!]);
    }
  }
  const [totalMs] = await timed(async () => {
    for (const rule of rules) {
      const check = await execa(command, [...nat, '-C', ...rule], { reject: false });
      if (check.exitCode !== 0) await execa(command, [...nat, '-A', ...rule]);
    }
  });
  await execa(variantCommand(variant, 'ipv4', 'restore'), ['--noflush', '-w'], {
    input:
      '*nat\n-D PREROUTING -j IPVS_PREROUTING\n-D OUTPUT -j IPVS_OUTPUT\n:IPVS_PREROUTING - [0:0]\n' +
      ':IPVS_OUTPUT - [0:0]\n-X IPVS_PREROUTING\n-X IPVS_OUTPUT\nCOMMIT\n',
  });
  return {
    what: `original (${command} -C, -A)`,
    n,
    rules: rules.length,
    figures: [ms(totalMs), '', '', '', '', ''],
  };
}

async function benchmark(originalMax: number): Promise<void> {
  const header = ['how', 'Services', 'rules', 'first sync', 'resync', 'change 1', 'read', 'render', 'restore'];
  const widths = [34, 8, 6, 10, 9, 9, 8, 8, 9];
  const line = (cells: string[]) =>
    cells.map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!))).join('  ');
  console.log('N LoadBalancer Services, one TCP port each, one pod CIDR: 4 IPv4 rules per Service;');
  console.log('KUBE-MARK-MASQ exists.');
  console.log('first sync: empty chains -> N Services; resync: full sync of an unchanged state;');
  console.log('change 1: a sync that removes or adds one Service (medians); all through backend.sync (both families).');
  console.log('read / render / restore: the parts of one IPv4 rewrite. original: total time of its per-rule commands.');
  console.log(line(header));
  for (const variant of VARIANTS) {
    await createKubeMarkMasq(variant);
    for (const n of SIZES) {
      const row = await measureBackend(variant, n);
      console.log(line([row.what, String(row.n), String(row.rules), ...row.figures]));
    }
    for (const n of ORIGINAL_SIZES.filter((s) => s <= originalMax)) {
      const row = await measureOriginal(variant, n);
      console.log(line([row.what, String(row.n), String(row.rules), ...row.figures]));
    }
  }
}

await inPrivateNetworkNamespace(import.meta.url, async (args) => {
  const maxFlag = args.indexOf('--original-max');
  await benchmark(maxFlag >= 0 ? Number(args[maxFlag + 1]) : Infinity);
});
