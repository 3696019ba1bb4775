// `ipvs-node-controller check --output=json` as the image runs it (the shipped bundle and its Node
// flags), for the kernel and VM tests: its exit code, its report, what it said on stderr.

import { execFileSync, spawn } from 'node:child_process';
import { once } from 'node:events';
import { shippedArgs } from './shipped-controller.js';

export type Json = Record<string, any>;

export interface Checked {
  code: number | null;
  report: Json;
  stderr: string;
}

/** Runs the check; with `cgroup`, from inside that cgroup v2 directory (the eBPF backend's hooks are per cgroup). */
export async function runCheck(args: readonly string[], cgroup?: string): Promise<Checked> {
  const argv = shippedArgs(['check', '--output=json', ...args]);
  const child = cgroup
    ? spawn('sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroup, process.execPath, ...argv], {
        stdio: ['ignore', 'pipe', 'pipe'],
      })
    : spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  try {
    return { code, report: JSON.parse(out) as Json, stderr: err };
  } catch {
    throw new Error(`check printed no JSON (exit ${code}): ${out}\n${err}`);
  }
}

/** The report's path to address protocol/port; throws when it has none. */
export function checkedPath(r: Json, address: string, protocol: string, port: number): Json {
  const found = (r.paths as Json[]).find((p) => p.address === address && p.protocol === protocol && p.port === port);
  if (!found) throw new Error(`no path ${address} ${protocol}/${port} in ${JSON.stringify(r.paths)}`);
  return found;
}

/** The report's finding of `check` for `family`; throws when it has none. */
export function checkedFinding(r: Json, check: string, family: string): Json {
  const found = (r.findings as Json[]).find((f) => f.check === check && f.family === family);
  if (!found) throw new Error(`no ${check} finding for ${family} in ${JSON.stringify(r.findings)}`);
  return found;
}

/** The report's findings and paths, for an assertion's message. */
export const reportText = (r: Json) => JSON.stringify({ findings: r.findings, paths: r.paths });

/** kube-proxy's masquerade of the mark in IPVS mode (kube-proxy v1.33 writeIptablesRules), both families. */
export const KUBE_PROXY_MASQUERADE = [
  '*nat',
  ':KUBE-POSTROUTING - [0:0]',
  '-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING',
  '-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN',
  '-A KUBE-POSTROUTING -j MARK --xor-mark 0x4000',
  '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
  'COMMIT',
  '',
].join('\n');

/** The opposite of KUBE_PROXY_MASQUERADE, in both families of the variant's tools (a test leaves nothing behind). */
export function removeKubeProxyMasquerade(variant: 'nft' | 'legacy'): void {
  for (const tool of [`iptables-${variant}`, `ip6tables-${variant}`]) {
    const run = (...args: string[]) => execFileSync(tool, ['-w', '-t', 'nat', ...args], { stdio: 'ignore' });
    run('-D', 'POSTROUTING', '-m', 'comment', '--comment', 'kubernetes postrouting rules', '-j', 'KUBE-POSTROUTING');
    run('-F', 'KUBE-POSTROUTING');
    run('-X', 'KUBE-POSTROUTING');
  }
}
