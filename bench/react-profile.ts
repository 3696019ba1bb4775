// Where a change's CPU goes, per build (bench/react.ts --cpu-prof): the controller of each run
// writes a V8 CPU profile (--cpu-prof, a sample every 100 us); only the samples taken during the
// run's change phase count (the profile's clock and the probers' are both CLOCK_MONOTONIC). Per
// function (name and file), the time per change spent in it (self) and under it (inclusive),
// side by side for the builds, the largest differences first.

import { readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import type { RunResult } from './react-measure.js';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}

interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

interface Costs {
  /** ms per change by function key. */
  self: Map<string, number>;
  inclusive: Map<string, number>;
  /** Sampled (non-idle) ms per change. */
  busy: number;
}

const IDLE = new Set(['(idle)', '(root)']);

function keyOf(node: ProfileNode): string {
  const { functionName, url, lineNumber } = node.callFrame;
  const file = url ? basename(url) : '';
  // Line numbers differ between builds; a name does not. Anonymous functions keep their line.
  return `${functionName || `(anonymous):${lineNumber + 1}`}${file ? ` ${file}` : ''}`;
}

/** Costs of the samples of `profile` inside [fromUs, toUs], per change. */
function costs(profile: CpuProfile, [fromUs, toUs]: [number, number], changes: number): Costs {
  const byId = new Map(profile.nodes.map((n) => [n.id, n] as const));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  let busy = 0;
  let t = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    const delta = profile.timeDeltas[i] ?? 0;
    t += delta;
    if (t < fromUs || t > toUs) continue;
    // A sample stands for the time since the previous one.
    const ms = delta / 1000 / changes;
    const leaf = byId.get(profile.samples[i]!)!;
    if (IDLE.has(leaf.callFrame.functionName)) continue;
    busy += ms;
    self.set(keyOf(leaf), (self.get(keyOf(leaf)) ?? 0) + ms);
    const seen = new Set<string>();
    for (let id: number | undefined = leaf.id; id !== undefined; id = parent.get(id)) {
      const key = keyOf(byId.get(id)!);
      if (seen.has(key)) continue;
      seen.add(key);
      inclusive.set(key, (inclusive.get(key) ?? 0) + ms);
    }
  }
  return { self, inclusive, busy };
}

function average(all: Costs[]): Costs {
  const mean = (maps: Array<Map<string, number>>) => {
    const out = new Map<string, number>();
    for (const m of maps) for (const [k, v] of m) out.set(k, (out.get(k) ?? 0) + v / maps.length);
    return out;
  };
  return {
    self: mean(all.map((c) => c.self)),
    inclusive: mean(all.map((c) => c.inclusive)),
    busy: all.reduce((s, c) => s + c.busy, 0) / all.length,
  };
}

/** The printed comparison of the change phases' profiles in `dir` (files named by pid). */
export function changePhaseProfile(dir: string, runs: RunResult[], top = 25): string {
  const files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
  const byBuild = new Map<string, Costs[]>();
  for (const run of runs) {
    if (!run.changeWindowUs || run.pid === undefined || run.reactMs.length === 0) continue;
    // CPU.<date>.<time>.<pid>.<thread>.<sequence>.cpuprofile
    const file = files.find((f) => f.split('.')[3] === String(run.pid));
    if (!file) continue;
    const profile = JSON.parse(readFileSync(join(dir, file), 'utf8')) as CpuProfile;
    const key = `${run.build}, ${run.node}`;
    byBuild.set(key, [...(byBuild.get(key) ?? []), costs(profile, run.changeWindowUs, run.reactMs.length + run.lost)]);
  }
  if (byBuild.size === 0) return 'CPU profiles: none matched a change phase\n';
  const builds = [...byBuild.keys()];
  const avg = builds.map((b) => average(byBuild.get(b)!));
  let out = `\nCPU of the controller's main thread per change (V8 samples in the change phase, ms per change, mean of the rounds)\n`;
  out += `sampled busy time: ${builds.map((b, i) => `${b}: ${avg[i]!.busy.toFixed(2)} ms`).join('; ')}\n`;
  for (const kind of ['inclusive', 'self'] as const) {
    const keys = new Set(avg.flatMap((c) => [...c[kind].keys()]));
    const rows = [...keys]
      .map((k) => ({ k, v: avg.map((c) => c[kind].get(k) ?? 0) }))
      .map((r) => ({ ...r, spread: Math.max(...r.v) - Math.min(...r.v), most: Math.max(...r.v) }))
      .filter((r) => r.most >= 0.01)
      .sort((a, b) => b.spread - a.spread || b.most - a.most)
      .slice(0, top);
    out += `\n| ${kind}, largest differences first | ${builds.join(' | ')} |\n| --- |${builds.map(() => ' ---: |').join('')}\n`;
    for (const r of rows) out += `| ${r.k.replace(/\|/g, '\\|')} | ${r.v.map((v) => v.toFixed(3)).join(' | ')} |\n`;
  }
  return out;
}
