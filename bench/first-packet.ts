// First-packet cost: TCP connection set-up time to the last-added Service, the scenarios taking
// turns round after round, each round in a fresh network namespace (bench/first-packet-lab.ts).

import { execFile } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import type { ConnectFigures, LabSpec } from './first-packet-lab.js';
import type { Programs } from './first-packet-programs.js';
import { BENCH_PORT, POD_CIDR, clusterIp, ingressIp, serviceName } from './services.js';

const LAB = fileURLToPath(new URL('./first-packet-lab.js', import.meta.url));
const run = promisify(execFile);

export interface FirstPacketScenario {
  label: string;
  services: number;
  rules: LabSpec['rules'];
}

export interface FirstPacketResult {
  label: string;
  services: number;
  client: 'node' | 'pod';
  answers: string;
  failures: number;
  /** One figure per round. */
  p50Us: number[];
  p99Us: number[];
}

/**
 * The original controller's rules for Services 0..n-1: per Service a KUBE-MARK-MASQ and a DNAT
 * rule in IPVS_OUTPUT (local sources) and in IPVS_PREROUTING (pod sources), jumped to from rule
 * 1 of nat OUTPUT / PREROUTING, matched on the address alone as it did.
 */
export function originalIptablesRules(n: number): string {
  const lines = [
    '*nat',
    ':PREROUTING ACCEPT [0:0]',
    ':INPUT ACCEPT [0:0]',
    ':OUTPUT ACCEPT [0:0]',
    ':POSTROUTING ACCEPT [0:0]',
    ':KUBE-MARK-MASQ - [0:0]',
    ':IPVS_OUTPUT - [0:0]',
    ':IPVS_PREROUTING - [0:0]',
    '-A PREROUTING -j IPVS_PREROUTING',
    '-A OUTPUT -j IPVS_OUTPUT',
    '-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000',
  ];
  for (let i = 0; i < n; i++) {
    const { namespace, name } = serviceName(i);
    const comment = `-m comment --comment "${namespace}/${name}"`;
    const toService = `-j DNAT --to-destination ${clusterIp(i)}`;
    const output = `-A IPVS_OUTPUT -d ${ingressIp(i)}/32 ${comment} -m addrtype --src-type LOCAL`;
    const prerouting = `-A IPVS_PREROUTING -s ${POD_CIDR} -d ${ingressIp(i)}/32 ${comment}`;
    lines.push(`${output} -j KUBE-MARK-MASQ`, `${output} ${toService}`);
    lines.push(`${prerouting} -j KUBE-MARK-MASQ`, `${prerouting} ${toService}`);
  }
  lines.push('COMMIT', '');
  return lines.join('\n');
}

export interface FirstPacketOptions {
  programs: Programs;
  workDir: string;
  rounds: number;
  warmup: number;
  connects: number;
  onRound?(round: number): void;
}

export async function measureFirstPacket(
  scenarios: FirstPacketScenario[],
  options: FirstPacketOptions,
): Promise<FirstPacketResult[]> {
  const results = new Map<string, FirstPacketResult>();
  for (let round = 0; round < options.rounds; round++) {
    options.onRound?.(round);
    for (const [index, scenario] of scenarios.entries()) {
      const target = scenario.services - 1;
      const spec: LabSpec = {
        ...options.programs,
        ingressIp: ingressIp(target),
        clusterIp: clusterIp(target),
        port: BENCH_PORT,
        rules: scenario.rules,
        warmup: options.warmup,
        connects: options.connects,
      };
      const specFile = join(options.workDir, `first-packet-${index}.json`);
      writeFileSync(specFile, JSON.stringify(spec));
      const { stdout } = await run('unshare', ['--net', '--', process.execPath, LAB, specFile], {
        maxBuffer: 1 << 20,
      });
      const figures = JSON.parse(stdout) as Record<'node' | 'pod', ConnectFigures>;
      for (const client of ['node', 'pod'] as const) {
        const key = `${scenario.label}|${scenario.services}|${client}`;
        const r = results.get(key) ?? {
          label: scenario.label,
          services: scenario.services,
          client,
          answers: '',
          failures: 0,
          p50Us: [],
          p99Us: [],
        };
        const f = figures[client];
        r.answers += f.answer;
        r.failures += f.failures;
        r.p50Us.push(f.p50Us);
        r.p99Us.push(f.p99Us);
        results.set(key, r);
      }
    }
  }
  return [...results.values()];
}
