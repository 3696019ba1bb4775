// Stepping aside for kube-proxy (docs/semantics.md, "kube-proxy's mode"): while kube-proxy is
// positively in iptables or nftables mode our DNAT would preempt its own, so every object of ours
// is removed (once) and nothing is programmed until kube-proxy is in IPVS mode again. Once
// stepped aside, only a positive IPVS brings the translation back: kube-proxy restarting (mode
// unknown) leaves its rules in place. With --kube-proxy-step-aside=false the controller
// translates anyway, and its status says why it should not. The controller asks plan() before
// each sync; a sync that translates goes to the reconciler as any other.

import type { Logger } from '../log.js';
import { isNonIpvsMode, type ModeVerdict } from '../kubeproxy/mode.js';
import type { DesiredState } from '../model/types.js';
import type { Reconciler } from '../reconciler/reconciler.js';
import type { SyncResult } from '../reconciler/sync-result.js';

/** What the controller knows of kube-proxy, for /readyz, metrics and Events. */
export interface KubeProxyStatus {
  mode: ModeVerdict;
  /** True while our rules are removed because kube-proxy is not in IPVS mode. */
  steppedAside: boolean;
  /** Why the controller stepped aside (or, with stepping aside off, why it should have). */
  reason?: string;
  /** Effective kube-proxy-related settings, `name=value (source)`. */
  settings: string[];
}

export interface StepAsideOptions {
  /** Removes our objects when the controller steps aside. */
  reconciler: Pick<Reconciler, 'cleanup'>;
  logger: Logger;
  /** Step aside while kube-proxy is positively in iptables or nftables mode (default true). */
  enabled?: boolean;
  /** kube-proxy's mode at start; unknown when not given. */
  mode?: ModeVerdict;
  /** Effective kube-proxy-related settings at start. */
  settings?: string[];
  /** Told when kube-proxy's mode changed, or the controller stepped aside or back. */
  onChange?: (status: KubeProxyStatus) => void;
}

export class StepAside {
  private current: KubeProxyStatus;
  /** Whether the mode is one our translation breaks: judged when the mode is told, not at every sync. */
  private nonIpvs: boolean;

  constructor(private readonly options: StepAsideOptions) {
    this.current = {
      mode: options.mode ?? { mode: 'unknown', source: 'none', detail: 'not looked at' },
      steppedAside: false,
      settings: options.settings ?? [],
    };
    this.nonIpvs = isNonIpvsMode(this.current.mode.mode);
  }

  get status(): KubeProxyStatus {
    return this.current;
  }

  /** kube-proxy's mode changed (after the monitor's confirmation): the next sync steps aside or back. */
  setMode(verdict: ModeVerdict): void {
    this.current = { ...this.current, mode: verdict };
    this.nonIpvs = isNonIpvsMode(verdict.mode);
    this.options.onChange?.(this.current);
  }

  setSettings(settings: string[]): void {
    this.current = { ...this.current, settings };
  }

  /**
   * What the next sync does: step aside (remove our objects, once) while kube-proxy is not in
   * IPVS mode; else translate, everything (`full`) when back from stepping aside. With stepping
   * aside off, it translates anyway and says why it should not (logged once, in the status).
   */
  plan(): { aside: string } | { aside?: undefined; full: boolean } {
    const reason = this.reason();
    if (reason && this.options.enabled !== false) return { aside: reason };
    if (reason && !this.current.reason) {
      this.options.logger.warn(
        { kubeProxyMode: this.current.mode.mode, reason, kubeProxyStepAside: false },
        'Translating although kube-proxy is not in IPVS mode',
      );
    }
    this.current.reason = reason;
    // Back from stepping aside: the kernel holds nothing of ours, program everything.
    return { full: this.current.steppedAside };
  }

  /** A sync planned to translate ended with `result`: the controller is back, unless a removal came since. */
  translated(result: SyncResult): void {
    // Stepped aside since this sync began: its writes were void, the controller stays aside.
    if (!this.current.steppedAside || result.superseded) return;
    this.current = { ...this.current, steppedAside: false, reason: undefined };
    this.options.logger.info(
      { kubeProxyMode: this.current.mode.mode },
      'Translating again, kube-proxy is in IPVS mode',
    );
    this.options.onChange?.(this.current);
  }

  /**
   * Why our translation must not be in the kernel now, if it must not. kube-proxy positively in
   * iptables or nftables mode: our DNAT would preempt its own. Once stepped aside, only a positive
   * IPVS brings the translation back.
   */
  private reason(): string | undefined {
    const { mode, detail } = this.current.mode;
    if (this.nonIpvs || (this.current.steppedAside && mode === 'unknown')) {
      return `kube-proxy is in ${mode === 'unknown' ? 'no known' : mode} mode (${detail}): our DNAT would preempt kube-proxy's own`;
    }
    return undefined;
  }

  /**
   * Removes every object of ours (once, when kube-proxy turns non-IPVS), then programs nothing
   * until kube-proxy is in IPVS mode again. The controller stays ready and says why.
   */
  async stepAside(reason: string, desired: DesiredState): Promise<SyncResult> {
    if (!this.current.steppedAside) {
      // The kernel then holds none of our translations: flows they made go too (conntrack).
      await this.options.reconciler.cleanup(desired);
      this.current = { ...this.current, steppedAside: true, reason };
      this.options.logger.warn(
        { kubeProxyMode: this.current.mode.mode, reason },
        'Stepped aside, our rules are removed and nothing is programmed',
      );
      this.options.onChange?.(this.current);
    }
    return { mode: 'noop', entries: { ipv4: 0, ipv6: 0 }, rejected: [] };
  }
}
