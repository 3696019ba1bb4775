// What the eBPF backend needs from the node, read without changing anything: the cgroup v2
// mount, a bpffs mount, capabilities and the kernel version. Parsers are pure; readers are thin.

import { existsSync, readFileSync, statfsSync } from 'node:fs';
import { release } from 'node:os';
import { dirname } from 'node:path';

export const CGROUP2_SUPER_MAGIC = 0x63677270;
export const BPF_FS_MAGIC = 0xcafe4a11;

/** getpeername hooks (5.8) are the newest feature the programs use; pinned cgroup links are 5.7. */
export const MINIMUM_KERNEL: readonly [number, number] = [5, 8];

/** The mount point of the first cgroup2 filesystem in /proc/mounts text (octal escapes decoded). */
export function cgroup2MountPoint(procMounts: string): string | undefined {
  for (const line of procMounts.split('\n')) {
    const fields = line.split(' ');
    if (fields.length >= 3 && fields[2] === 'cgroup2') return unescapeMountField(fields[1]!);
  }
  return undefined;
}

function unescapeMountField(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_, octal: string) => String.fromCharCode(parseInt(octal, 8)));
}

export const CAPABILITY = { CAP_NET_ADMIN: 12, CAP_SYS_ADMIN: 21, CAP_BPF: 39 } as const;

/** The effective capability set from /proc/self/status text. */
export function effectiveCapabilities(procStatus: string): bigint | undefined {
  const m = /^CapEff:\s*([0-9a-fA-F]+)\s*$/m.exec(procStatus);
  return m ? BigInt(`0x${m[1]}`) : undefined;
}

/**
 * Capabilities missing to load cgroup socket-address programs and create maps: CAP_BPF with
 * CAP_NET_ADMIN, or CAP_SYS_ADMIN, which covers both.
 */
export function missingCapabilities(effective: bigint): string[] {
  const has = (cap: number) => ((effective >> BigInt(cap)) & 1n) === 1n;
  if (has(CAPABILITY.CAP_SYS_ADMIN)) return [];
  const missing: string[] = [];
  if (!has(CAPABILITY.CAP_BPF)) missing.push('CAP_BPF');
  if (!has(CAPABILITY.CAP_NET_ADMIN)) missing.push('CAP_NET_ADMIN');
  return missing;
}

/** [major, minor] of a kernel release string such as `6.1.0-18-amd64`. */
export function kernelVersion(releaseText: string): [number, number] | undefined {
  const m = /^(\d+)\.(\d+)/.exec(releaseText);
  return m ? [Number(m[1]), Number(m[2])] : undefined;
}

export function atLeast(version: readonly [number, number], minimum: readonly [number, number]): boolean {
  return version[0] > minimum[0] || (version[0] === minimum[0] && version[1] >= minimum[1]);
}

/** The node's cgroup v2 root as this process sees it. */
export function readCgroup2MountPoint(): string | undefined {
  try {
    return cgroup2MountPoint(readFileSync('/proc/mounts', 'utf8'));
  } catch {
    return undefined;
  }
}

export function readEffectiveCapabilities(): bigint | undefined {
  try {
    return effectiveCapabilities(readFileSync('/proc/self/status', 'utf8'));
  } catch {
    return undefined;
  }
}

export function runningKernel(): string {
  return release();
}

/** The filesystem type of `path`, or of its nearest existing ancestor (a directory to be created). */
export function filesystemTypeOf(path: string): { type: number; checked: string } | undefined {
  let probe = path;
  while (!existsSync(probe)) {
    const up = dirname(probe);
    if (up === probe) return undefined;
    probe = up;
  }
  try {
    return { type: statfsSync(probe).type, checked: probe };
  } catch {
    return undefined;
  }
}
