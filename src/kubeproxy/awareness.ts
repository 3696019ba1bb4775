// Everything the controller knows of kube-proxy on this node, in one piece started by the CLI:
// its settings (the configuration file, followed) and its live mode (polled).

import type { Logger } from 'pino';
import { parseBindAddress, type Config } from '../config/options.js';
import { formatBindAddress, type BindAddress } from '../http/endpoint.js';
import {
  KubeProxyConfigFollower,
  describeSettings,
  mergeSettings,
  readKubeProxyConfigFile,
  type EffectiveSettings,
  type KubeProxySettings,
} from './config.js';
import { ModeMonitor, type ModeVerdict } from './mode.js';

/** Modes must be seen this many polls in a row before the controller steps aside or back. */
export const MODE_CONFIRMATIONS = 2;
/** A /proxyMode (or /metrics, for the version) request that takes longer counts as no answer. */
export const PROXY_MODE_TIMEOUT_MS = 1000;

/**
 * kube-proxy's metricsBindAddress as a place to ask: a wildcard listens on loopback too. Values
 * that are no IP:port (kube-proxy also takes a CIDR form) are not used.
 */
export function proxyModeAddressFromFile(text: string | undefined): BindAddress | undefined {
  if (!text) return undefined;
  try {
    const a = parseBindAddress('metricsBindAddress', text);
    if (!a) return undefined;
    if (a.host === '0.0.0.0') return { host: '127.0.0.1', port: a.port };
    if (a.host === '::') return { host: '::1', port: a.port };
    return a;
  } catch {
    return undefined;
  }
}

export interface KubeProxyAwarenessHandlers {
  onSettings(settings: EffectiveSettings): void;
  onMode(verdict: ModeVerdict): void;
}

export class KubeProxyAwareness {
  private follower: KubeProxyConfigFollower | undefined;
  private monitor: ModeMonitor | undefined;
  private file: KubeProxySettings | undefined;
  settings: EffectiveSettings;

  private constructor(
    private readonly config: Config,
    private readonly logger: Logger,
  ) {
    this.settings = mergeSettings({ model: config.model, sources: config.modelSources }, undefined);
  }

  get mode(): ModeVerdict {
    return this.monitor?.current ?? { mode: 'unknown', source: 'none', detail: 'not looked at' };
  }

  /** Reads the file and looks at the mode once (both bounded in time); then follows both. */
  static async start(
    config: Config,
    logger: Logger,
    handlers: KubeProxyAwarenessHandlers,
  ): Promise<KubeProxyAwareness> {
    const a = new KubeProxyAwareness(config, logger);
    if (config.kubeProxyConfig) {
      a.follower = new KubeProxyConfigFollower(
        config.kubeProxyConfig,
        config.kubeProxyPollIntervalMs,
        logger,
        (file) => {
          a.file = file;
          a.settings = a.merge();
          a.logSettings();
          handlers.onSettings(a.settings);
        },
      );
      a.file = await a.follower.start();
    }
    a.settings = a.merge();
    a.logSettings();
    a.monitor = new ModeMonitor({
      metricsAddress: () => a.metricsAddress(),
      intervalMs: config.kubeProxyPollIntervalMs,
      confirmations: MODE_CONFIRMATIONS,
      timeoutMs: PROXY_MODE_TIMEOUT_MS,
      configuredMode: () => a.file?.mode,
      logger,
      onChange: (verdict) => handlers.onMode(verdict),
    });
    await a.monitor.start();
    return a;
  }

  /** One look for --dry-run: the file once, the mode once. */
  static async lookOnce(
    config: Config,
  ): Promise<{ settings: EffectiveSettings; mode: ModeVerdict; fileProblem?: string }> {
    let file: KubeProxySettings | undefined;
    let fileProblem: string | undefined;
    if (config.kubeProxyConfig) {
      const state = await readKubeProxyConfigFile(config.kubeProxyConfig);
      if (state.kind === 'read') file = state.settings;
      else fileProblem = state.kind === 'missing' ? `${config.kubeProxyConfig} does not exist` : state.error;
    }
    const settings = mergeSettings({ model: config.model, sources: config.modelSources }, file);
    const metricsAddress = config.kubeProxyMetricsAddressExplicit
      ? config.kubeProxyMetricsAddress
      : (proxyModeAddressFromFile(file?.metricsBindAddress) ?? config.kubeProxyMetricsAddress);
    const mode = await ModeMonitor.look({
      metricsAddress,
      timeoutMs: PROXY_MODE_TIMEOUT_MS,
      configured: file?.mode,
      version: true,
    });
    return { settings, mode, fileProblem };
  }

  async stop(): Promise<void> {
    this.follower?.stop();
    await this.monitor?.stop();
  }

  describe(): string[] {
    return describeSettings(this.settings);
  }

  private merge(): EffectiveSettings {
    return mergeSettings({ model: this.config.model, sources: this.config.modelSources }, this.file);
  }

  private metricsAddress(): BindAddress | undefined {
    if (this.config.kubeProxyMetricsAddressExplicit) return this.config.kubeProxyMetricsAddress;
    return proxyModeAddressFromFile(this.file?.metricsBindAddress) ?? this.config.kubeProxyMetricsAddress;
  }

  private logSettings(): void {
    const where = this.metricsAddress();
    this.logger.info(
      {
        settings: describeSettings(this.settings),
        configuredMode: this.settings.configuredMode ?? null,
        proxyModeAddress: where ? formatBindAddress(where) : null,
      },
      'Effective kube-proxy-related settings',
    );
  }
}
