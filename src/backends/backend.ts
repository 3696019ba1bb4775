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
}

export interface Backend {
  readonly name: BackendName;
  /** Checks that the kernel and userspace can run this backend, without changing anything. */
  probe(): Promise<ProbeResult>;
  /** Makes the kernel match `desired`. Each family changes in one atomic transaction. */
  sync(desired: DesiredState, options: SyncOptions): Promise<SyncResult>;
  /** Removes every object this backend owns. Idempotent. */
  cleanup(): Promise<void>;
  /** Releases resources (native handles); leaves kernel state in place. */
  close?(): Promise<void>;
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
