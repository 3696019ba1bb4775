// What the iptables backend's jump guard costs: one round asks for rule 1 of nat PREROUTING and
// OUTPUT in both families (four short processes), once a second while the backend runs. Prints
// the wall time of a round and the CPU time of its processes with N Services programmed, for
// both variants; asserts nothing. Re-runs itself inside `unshare --net`.
//
//   node dist/bench/iptables-jump-guard.js

import { Reconciler } from '../src/reconciler/reconciler.js';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import type { IptablesVariant } from '../src/backends/iptables/executor.js';
import { IptablesDriver } from '../src/backends/iptables/iptables-driver.js';
import { JumpGuard } from '../src/backends/iptables/jump-guard.js';
import { buildDesiredState } from '../src/model/desired-state.js';
import type { ServiceInfo } from '../src/model/types.js';
import { inPrivateNetworkNamespace } from './namespace.js';

const SIZES = [0, 1_000, 10_000];
const ROUNDS = 20;

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

/** CPU seconds of this process's waited-for children (utime + stime of /proc/self/stat). */
function childrenCpuMs(): number {
  const stat = readFileSync('/proc/self/stat', 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // Fields 16 and 17 of stat(5) are cutime and cstime; the slice starts at field 3.
  return ((Number(fields[13]) + Number(fields[14])) * 1000) / 100;
}

async function main(): Promise<void> {
  console.log(`jump guard: one round = rule 1 of PREROUTING and OUTPUT, IPv4 and IPv6; median of ${ROUNDS} rounds`);
  console.log('variant  services  wall ms/round  child CPU ms/round');
  for (const variant of ['legacy', 'nft'] as IptablesVariant[]) {
    for (const n of SIZES) {
      const backend = new Reconciler(new IptablesDriver(variant, { jumpCheckIntervalMs: 0 }));
      const desired = buildDesiredState(
        services(n),
        { name: 'bench-node', podCIDRs: ['10.244.1.0/24'] },
        { detectLocalMode: 'NodeCIDR', clusterCidrs: [], masqueradeBit: 14, localTrafficPolicyOnly: false },
      );
      await backend.sync(desired, { full: true });
      const guard = new JumpGuard({
        variant,
        intervalMs: 1000,
        exclusive: (work) => work(),
        families: () => ['ipv4', 'ipv6'],
      });
      const walls: number[] = [];
      const cpuBefore = childrenCpuMs();
      for (let i = 0; i < ROUNDS; i++) {
        const start = performance.now();
        await guard.checkAll();
        walls.push(performance.now() - start);
      }
      const cpu = (childrenCpuMs() - cpuBefore) / ROUNDS;
      walls.sort((a, b) => a - b);
      if (guard.repairs !== 0) throw new Error('the guard repaired an intact table');
      console.log(
        `${variant.padEnd(8)} ${String(n).padStart(8)}  ${walls[ROUNDS >> 1]!.toFixed(1).padStart(13)}  ${cpu.toFixed(1).padStart(18)}`,
      );
      await backend.cleanup();
    }
  }
}

await inPrivateNetworkNamespace(import.meta.url, main);
