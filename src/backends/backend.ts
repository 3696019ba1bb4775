// The one interface every backend implements. The sync runner knows nothing else.

import type { DesiredState } from '../model/types.js';

export type BackendName = 'nft' | 'iptables' | 'ebpf';
export const BACKEND_NAMES: readonly BackendName[] = ['nft', 'iptables', 'ebpf'];

export interface ProbeResult {
  ok: boolean;
  /** One line a user can act on when !ok; a short description of what was found when ok. */
  detail: string;
}

export interface SyncOptions {
  /** Rebuild everything we own, repairing drift. Otherwise a backend may apply only what changed. */
  full: boolean;
}

export interface SyncResult {
  /** What was actually done: a partial request can turn into a full sync (state lost, first run). */
  mode: 'full' | 'partial' | 'noop';
  /** Programmed entries per family after the sync. */
  entries: { ipv4: number; ipv6: number };
  /** Why a partial request became a full sync, when it did (a metric label and a debug log). */
  fallbackReason?: string;
  /** Elements and chains a full sync found changed by someone else and wrote back. */
  repairedElements?: number;
}

/** How many entries per family a backend is given: a default, and what it can hold at all. */
export interface EntryCapacity {
  /** Without --max-entries. */
  defaultEntries: number;
  /** The most it can hold (a map's fixed size); --max-entries above it is lowered to it. */
  maxEntries?: number;
  /** Why, in a few words, for logs and docs. */
  why: string;
}

/** Entries per family a backend is given: --max-entries, or its default, never above what it holds. */
export function entryLimit(capacity: EntryCapacity, maxEntriesFlag: number | undefined): number {
  return Math.min(maxEntriesFlag ?? capacity.defaultEntries, capacity.maxEntries ?? Number.POSITIVE_INFINITY);
}

export interface Backend {
  readonly name: BackendName;
  readonly capacity: EntryCapacity;
  /** Checks that the kernel and userspace can run this backend, without changing anything. */
  probe(): Promise<ProbeResult>;
  /**
   * Makes the kernel match `desired`. How atomic a change is depends on the backend: nft and
   * iptables apply each write as one transaction (a full nft sync may take several: a rewrite,
   * then repairs of what it verified); eBPF map elements change one by one.
   */
  sync(desired: DesiredState, options: SyncOptions): Promise<SyncResult>;
  /**
   * True when a partial sync may run while a full sync is under way (the backend orders its own
   * writes): a long resync then never holds back a change.
   */
  readonly partialSyncsDuringFull?: boolean;
  /** Removes every object this backend owns. Idempotent. */
  cleanup(): Promise<void>;
  /** Releases resources (native handles); leaves kernel state in place. */
  close?(): Promise<void>;
  /** Hands memory its native work freed back to the kernel, where the backend can (malloc_trim). */
  releaseMemory?(): Promise<void>;
}

/** An error a user can meet, carrying one line that says what to do. */
export class BackendError extends Error {
  constructor(
    message: string,
    readonly backend: BackendName,
  ) {
    super(message);
    this.name = 'BackendError';
  }
}
