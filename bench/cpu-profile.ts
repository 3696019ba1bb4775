// Where the time of a change goes, per build (bench/react.ts --cpu-prof): the controller of each
// run writes a V8 CPU profile (--cpu-prof, a sample every 100 us), and only the samples taken
// while a change was under way count: from the bench sending the status PATCH to the first
// datagram through the new address (the profile's clock and the probers' are both
// CLOCK_MONOTONIC). So what is printed is what the controller's main thread did between the
// watch event and the kernel taking the element, per change: idle (waiting for the event, a
// timer, the kernel), collecting garbage, cleaning conntrack up (the `conntrack` processes a UDP
// change spawns, src/conntrack/; a change may meet those of the one before), and the rest, the
// change's own work, by function (inclusive: under it; self: in it). Functions are matched
// between builds by name (an anonymous one by the nearest named function it was called from), as
// the bundles' files and lines differ.

import { readdirSync, readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import type { RunResult } from './react.js';

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string };
  children?: number[];
}

interface CpuProfile {
  nodes: ProfileNode[];
  startTime: number;
  samples: number[];
  timeDeltas: number[];
}

interface Costs {
  /** ms per change of the change's own work, by function. */
  self: Map<string, number>;
  inclusive: Map<string, number>;
  /** Sampled ms per change, by part (PARTS). */
  parts: Map<string, number>;
}

/** V8's names for time outside JavaScript functions. */
const IDLE = '(idle)';
const GC = '(garbage collector)';
const ROOT = '(root)';
/** The conntrack clean-up's entry points in this tree and in earlier ones, and Node's process spawning. */
const CONNTRACK = new Set(['cleanConntrack', 'programmedStateChanged', 'clean', 'spawn (node:child_process)']);
const PARTS = ['sampled in all', 'idle', 'garbage collection', 'conntrack clean-up', "the change's own work"];

/** Each node's name (see the header), and each node's parent. */
function keys(profile: CpuProfile): { key: Map<number, string>; parent: Map<number, number> } {
  const byId = new Map(profile.nodes.map((n) => [n.id, n] as const));
  const parent = new Map<number, number>();
  for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const named = (n: ProfileNode) => {
    const { functionName, url } = n.callFrame;
    // Node's own modules keep their file; the bundle's chunks are named by a hash.
    return url.startsWith('node:') ? `${functionName} (${basename(url)})` : functionName;
  };
  const out = new Map<number, string>();
  for (const n of profile.nodes) {
    if (n.callFrame.functionName) {
      out.set(n.id, named(n));
      continue;
    }
    let caller: ProfileNode | undefined;
    for (let id = parent.get(n.id); id !== undefined && !caller; id = parent.get(id)) {
      const p = byId.get(id)!;
      if (p.callFrame.functionName && p.callFrame.functionName !== ROOT) caller = p;
    }
    out.set(n.id, caller ? `(anonymous, in ${named(caller)})` : '(anonymous)');
  }
  return { key: out, parent };
}

/** Costs of the samples of `profile` inside the windows (sorted, us), per window. */
function costs(profile: CpuProfile, windows: Array<[number, number]>): Costs {
  const { key, parent } = keys(profile);
  const self = new Map<string, number>();
  const inclusive = new Map<string, number>();
  const parts = new Map<string, number>();
  const add = (m: Map<string, number>, k: string, ms: number) => m.set(k, (m.get(k) ?? 0) + ms);
  let w = 0;
  let t = profile.startTime;
  for (let i = 0; i < profile.samples.length; i++) {
    const delta = profile.timeDeltas[i] ?? 0;
    t += delta;
    while (w < windows.length && t > windows[w]![1]) w++;
    if (w >= windows.length) break;
    if (t < windows[w]![0]) continue;
    // A sample stands for the time since the previous one.
    const ms = delta / 1000 / windows.length;
    const leaf = profile.samples[i]!;
    add(parts, PARTS[0]!, ms);
    if (key.get(leaf) === IDLE || key.get(leaf) === GC) {
      add(parts, key.get(leaf) === IDLE ? PARTS[1]! : PARTS[2]!, ms);
      continue;
    }
    const stack = new Set<string>();
    for (let id: number | undefined = leaf; id !== undefined; id = parent.get(id)) stack.add(key.get(id)!);
    stack.delete(ROOT);
    if ([...stack].some((k) => CONNTRACK.has(k))) {
      add(parts, PARTS[3]!, ms);
      continue;
    }
    add(parts, PARTS[4]!, ms);
    add(self, key.get(leaf)!, ms);
    for (const k of stack) add(inclusive, k, ms);
  }
  return { self, inclusive, parts };
}

function average(all: Costs[]): Costs {
  const mean = (kind: keyof Costs) => {
    const out = new Map<string, number>();
    for (const c of all) for (const [k, v] of c[kind]) out.set(k, (out.get(k) ?? 0) + v / all.length);
    return out;
  };
  return { self: mean('self'), inclusive: mean('inclusive'), parts: mean('parts') };
}

/** The printed comparison of the profiles in `dir` (named by the controller's pid). */
export function changePhaseProfile(dir: string, runs: RunResult[], top = 30): string {
  const files = readdirSync(dir).filter((f) => f.endsWith('.cpuprofile'));
  const byBuild = new Map<string, Costs[]>();
  for (const run of runs) {
    if (!run.reactWindowsUs?.length || run.pid === undefined) continue;
    // CPU.<date>.<time>.<pid>.<thread>.<sequence>.cpuprofile
    const file = files.find((f) => f.split('.')[3] === String(run.pid));
    if (!file) continue;
    const profile = JSON.parse(readFileSync(join(dir, file), 'utf8')) as CpuProfile;
    const key = `${run.build}, ${run.node}`;
    byBuild.set(key, [...(byBuild.get(key) ?? []), costs(profile, run.reactWindowsUs)]);
  }
  if (byBuild.size === 0) return 'CPU profiles: none matched a change\n';
  const builds = [...byBuild.keys()];
  const avg = builds.map((b) => average(byBuild.get(b)!));
  const header = (first: string) =>
    `\n| ${first} | ${builds.join(' | ')} |\n| --- |${builds.map(() => ' ---: |').join('')}\n`;
  let out = `\nThe controller's main thread from the PATCH sent to the first datagram through (V8 samples every 100 us; ms per change, mean of the rounds)\n`;
  out += header('part');
  for (const part of PARTS) out += `| ${part} | ${avg.map((c) => (c.parts.get(part) ?? 0).toFixed(2)).join(' | ')} |\n`;
  for (const kind of ['inclusive', 'self'] as const) {
    const names = new Set(avg.flatMap((c) => [...c[kind].keys()]));
    const rows = [...names]
      .map((k) => ({ k, v: avg.map((c) => c[kind].get(k) ?? 0) }))
      .map((r) => ({ ...r, spread: Math.max(...r.v) - Math.min(...r.v), most: Math.max(...r.v) }))
      .filter((r) => r.most >= 0.02)
      .sort((a, b) => (kind === 'inclusive' ? b.most - a.most : b.spread - a.spread) || b.most - a.most)
      .slice(0, top);
    const order = kind === 'inclusive' ? 'largest first' : 'largest differences first';
    out += header(`the change's own work, ${kind}, ${order}`);
    for (const r of rows) out += `| ${r.k.replace(/\|/g, '\\|')} | ${r.v.map((v) => v.toFixed(3)).join(' | ')} |\n`;
  }
  return out;
}
