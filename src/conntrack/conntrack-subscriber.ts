// The conntrack clean-up as a subscriber of the reconciler (src/driver/kernel-change.ts): after
// each change of what the kernel holds, the conntrack entries that would keep a translation the
// kernel no longer has (stale-tuples.ts); after a window in which a driver saw our translations
// bypassed, the flows it pinned to the untranslated path. The one conntrack client is
// ConntrackCleaner; the composition root (src/cli/compose.ts) subscribes this where the driver's
// translations are conntrack's.

import type { KernelChange, KernelSubscriber, TranslationsBypassed } from '../driver/kernel-change.js';
import type { ConntrackCleaner, ConntrackCleanupReport } from './conntrack-cleaner.js';
import { staleTuples } from './stale-tuples.js';

/** What the subscriber asks of the conntrack client: stale tuples, and (optionally) the flows a bypass pinned. */
export type ConntrackClient = Pick<ConntrackCleaner, 'clean'> & Partial<Pick<ConntrackCleaner, 'forgetUntranslated'>>;

export class ConntrackSubscriber implements KernelSubscriber {
  constructor(
    private readonly client: ConntrackClient,
    /** Told of every clean-up (metrics). */
    private readonly onReport: (report: ConntrackCleanupReport) => void = () => undefined,
  ) {}

  /** Deletes the conntrack entries that would keep translations the kernel no longer has. Never throws. */
  async kernelChanged(change: KernelChange): Promise<void> {
    const tuples = staleTuples(change);
    if (tuples.length === 0) return;
    this.onReport(await this.client.clean(tuples));
  }

  /** Forgets the flows the window pinned; runs on its own, a change never waits for it. */
  translationsBypassed({ family, entries }: TranslationsBypassed): void {
    void this.client.forgetUntranslated?.(family, entries, this.onReport);
  }
}
