// kube-proxy's own settings, read from its KubeProxyConfiguration file (--kube-proxy-config), so
// that the masquerade bit, the cluster CIDR and the detect-local mode never drift from kube-proxy's.
// Flags given explicitly win over the file; the file wins over our defaults.

import { readFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import YAML from 'yaml';
import { parseCidr, formatCidr } from '../model/ip.js';
import { DETECT_LOCAL_MODES, type DetectLocalMode, type ModelConfig } from '../model/types.js';
import {
  KUBE_PROXY_MODEL_SETTINGS,
  type KubeProxyModelSetting,
  type SettingSource,
} from '../config/setting-sources.js';

export const KUBE_PROXY_API_VERSIONS = ['kubeproxy.config.k8s.io/v1alpha1'];

/**
 * The fields of a KubeProxyConfiguration we use; a field the file leaves empty is undefined,
 * except detectLocalMode, which is kube-proxy's default then (ClusterCIDR).
 */
export interface KubeProxySettings {
  /** `mode`: ipvs, iptables, nftables, kernelspace ('' in the file: undefined). */
  mode?: string;
  clusterCidrs?: string[];
  masqueradeBit?: number;
  detectLocalMode?: DetectLocalMode;
  podBridgeInterface?: string;
  podInterfaceNamePrefix?: string;
  /** `metricsBindAddress`, where /proxyMode is served (IP:port). */
  metricsBindAddress?: string;
  /** `featureGates.AllowServiceExternalIPs` (KEP-5707): false, kube-proxy ignores spec.externalIPs. */
  allowServiceExternalIPs?: boolean;
}

export class KubeProxyConfigError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'KubeProxyConfigError';
  }
}

const INTERFACE_NAME = /^[A-Za-z0-9_.@+-]{1,15}$/;
/** What kube-proxy runs with when its configuration leaves detectLocalMode empty. */
export const KUBE_PROXY_DEFAULT_DETECT_LOCAL_MODE: DetectLocalMode = 'ClusterCIDR';
const MODES = ['ipvs', 'iptables', 'nftables', 'kernelspace'];

type Loose = Record<string, unknown>;

function section(doc: Loose, key: string): Loose {
  const v = doc[key];
  if (v === undefined || v === null) return {};
  if (typeof v !== 'object' || Array.isArray(v)) throw new KubeProxyConfigError(`${key}: expected a mapping`);
  return v as Loose;
}

function optionalString(o: Loose, key: string, path: string): string | undefined {
  const v = o[key];
  if (v === undefined || v === null || v === '') return undefined;
  if (typeof v !== 'string') throw new KubeProxyConfigError(`${path}: expected a string, got ${JSON.stringify(v)}`);
  return v;
}

/**
 * Reads the fields we use from a KubeProxyConfiguration (YAML or JSON). Unknown fields are
 * ignored, as kube-proxy's lenient decoding does; a value we use that is malformed throws a
 * KubeProxyConfigError with one line that names the field.
 */
export function parseKubeProxyConfiguration(text: string): KubeProxySettings {
  let doc: unknown;
  try {
    doc = YAML.parse(text);
  } catch (err) {
    throw new KubeProxyConfigError(`not YAML: ${(err as Error).message.split('\n')[0]}`);
  }
  if (doc === null || doc === undefined) throw new KubeProxyConfigError('the file is empty');
  if (typeof doc !== 'object' || Array.isArray(doc)) throw new KubeProxyConfigError('expected a mapping at the top');
  const o = doc as Loose;
  if (o.kind !== undefined && o.kind !== 'KubeProxyConfiguration') {
    throw new KubeProxyConfigError(`kind is ${JSON.stringify(o.kind)}, not KubeProxyConfiguration`);
  }
  if (o.apiVersion !== undefined && !KUBE_PROXY_API_VERSIONS.includes(String(o.apiVersion))) {
    throw new KubeProxyConfigError(
      `apiVersion ${JSON.stringify(o.apiVersion)} is not supported (supported: ${KUBE_PROXY_API_VERSIONS.join(', ')})`,
    );
  }
  const out: KubeProxySettings = {};

  const mode = optionalString(o, 'mode', 'mode');
  if (mode !== undefined) {
    if (!MODES.includes(mode)) throw new KubeProxyConfigError(`mode: '${mode}' is not one of ${MODES.join(', ')}`);
    out.mode = mode;
  }

  const clusterCidr = optionalString(o, 'clusterCIDR', 'clusterCIDR');
  if (clusterCidr !== undefined) {
    out.clusterCidrs = clusterCidr.split(',').map((raw) => {
      const cidr = parseCidr(raw.trim());
      if (!cidr) throw new KubeProxyConfigError(`clusterCIDR: '${raw.trim()}' is not a CIDR`);
      return formatCidr(cidr);
    });
  }

  const bit = section(o, 'iptables').masqueradeBit;
  if (bit !== undefined && bit !== null) {
    if (typeof bit !== 'number' || !Number.isInteger(bit) || bit < 0 || bit > 31) {
      throw new KubeProxyConfigError(`iptables.masqueradeBit: ${JSON.stringify(bit)} must be an integer from 0 to 31`);
    }
    out.masqueradeBit = bit;
  }

  // Empty or absent, kube-proxy takes ClusterCIDR (its platformApplyDefaults), and so do we: the
  // file describes a kube-proxy that runs, and its pods are told apart by the cluster CIDR.
  const detectLocalMode =
    optionalString(o, 'detectLocalMode', 'detectLocalMode') ?? KUBE_PROXY_DEFAULT_DETECT_LOCAL_MODE;
  if (!(DETECT_LOCAL_MODES as readonly string[]).includes(detectLocalMode)) {
    throw new KubeProxyConfigError(
      `detectLocalMode: '${detectLocalMode}' is not one of ${DETECT_LOCAL_MODES.join(', ')}`,
    );
  }
  out.detectLocalMode = detectLocalMode as DetectLocalMode;
  const detectLocal = section(o, 'detectLocal');
  const bridge = optionalString(detectLocal, 'bridgeInterface', 'detectLocal.bridgeInterface');
  if (bridge !== undefined) {
    if (!INTERFACE_NAME.test(bridge)) {
      throw new KubeProxyConfigError(`detectLocal.bridgeInterface: '${bridge}' is not an interface name`);
    }
    out.podBridgeInterface = bridge;
  }
  const prefix = optionalString(detectLocal, 'interfaceNamePrefix', 'detectLocal.interfaceNamePrefix');
  if (prefix !== undefined) {
    if (!INTERFACE_NAME.test(prefix)) {
      throw new KubeProxyConfigError(`detectLocal.interfaceNamePrefix: '${prefix}' is not an interface name prefix`);
    }
    out.podInterfaceNamePrefix = prefix;
  }

  const metrics = optionalString(o, 'metricsBindAddress', 'metricsBindAddress');
  if (metrics !== undefined) out.metricsBindAddress = metrics;

  const gate = section(o, 'featureGates').AllowServiceExternalIPs;
  if (gate !== undefined && gate !== null) {
    if (typeof gate !== 'boolean') {
      throw new KubeProxyConfigError(
        `featureGates.AllowServiceExternalIPs: ${JSON.stringify(gate)} must be true or false`,
      );
    }
    out.allowServiceExternalIPs = gate;
  }
  return out;
}

/** What the flags said, and which of them were given (flag or environment) rather than defaulted. */
export interface FlagSettings {
  model: ModelConfig;
  sources: Record<KubeProxyModelSetting, SettingSource>;
}

export interface EffectiveSettings {
  model: ModelConfig;
  sources: Record<KubeProxyModelSetting, SettingSource>;
  /** kube-proxy's configured mode, when the file says. */
  configuredMode?: string;
}

/** Flags given explicitly win; then the file; then our defaults. */
export function mergeSettings(flags: FlagSettings, file: KubeProxySettings | undefined): EffectiveSettings {
  const model: ModelConfig = { ...flags.model };
  const sources = { ...flags.sources };
  const take = <K extends KubeProxyModelSetting>(key: K, value: ModelConfig[K] | undefined) => {
    if (value === undefined || sources[key] !== 'default') return;
    model[key] = value;
    sources[key] = 'kube-proxy-config';
  };
  if (file) {
    take('detectLocalMode', file.detectLocalMode);
    take('clusterCidrs', file.clusterCidrs);
    take('podBridgeInterface', file.podBridgeInterface);
    take('podInterfaceNamePrefix', file.podInterfaceNamePrefix);
    take('masqueradeBit', file.masqueradeBit);
    take('allowServiceExternalIPs', file.allowServiceExternalIPs);
  }
  return { model, sources, configuredMode: file?.mode };
}

/** One line per setting: `name=value (source)`, for logs and --dry-run. */
export function describeSettings(settings: EffectiveSettings): string[] {
  return KUBE_PROXY_MODEL_SETTINGS.map((key) => {
    const v = settings.model[key];
    const text = Array.isArray(v) ? v.join(',') || '(none)' : v === undefined ? '(none)' : String(v);
    return `${key}=${text} (${settings.sources[key]})`;
  });
}

/** What the file gives now: settings, or why it gives none. */
export type ConfigFileState =
  { kind: 'read'; settings: KubeProxySettings } | { kind: 'missing' } | { kind: 'invalid'; error: string };

/** Reads the file once. A missing file (the optional ConfigMap does not exist) is not an error. */
export async function readKubeProxyConfigFile(path: string): Promise<ConfigFileState> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') return { kind: 'missing' };
    return { kind: 'invalid', error: `cannot read ${path}: ${(err as Error).message}` };
  }
  try {
    return { kind: 'read', settings: parseKubeProxyConfiguration(text) };
  } catch (err) {
    return { kind: 'invalid', error: `${path}: ${(err as Error).message}` };
  }
}

/**
 * Follows the file by reading it again every interval: a ConfigMap volume is updated by swapping
 * a symlink, which file watches miss, and the file is small. A file that turns invalid keeps the
 * settings read before it (one error line per change); a file that disappears keeps them too.
 */
export class KubeProxyConfigFollower {
  private timer: NodeJS.Timeout | undefined;
  private lastText: string | undefined;
  private lastError: string | undefined;
  private settings: KubeProxySettings | undefined;

  constructor(
    private readonly path: string,
    private readonly intervalMs: number,
    private readonly logger: Logger,
    private readonly onChange: (settings: KubeProxySettings | undefined) => void,
  ) {}

  get current(): KubeProxySettings | undefined {
    return this.settings;
  }

  /** Reads the file once now; later reads happen every interval. */
  async start(): Promise<KubeProxySettings | undefined> {
    await this.poll(true);
    this.timer = setInterval(() => void this.poll(false), this.intervalMs);
    this.timer.unref();
    return this.settings;
  }

  stop(): void {
    clearInterval(this.timer);
  }

  private async poll(first: boolean): Promise<void> {
    let text: string | undefined;
    try {
      text = await readFile(this.path, 'utf8');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      const key = code === 'ENOENT' ? 'missing' : (err as Error).message;
      if (key !== this.lastText) {
        this.lastText = key;
        if (code === 'ENOENT') {
          // The ConfigMap may not exist: `keeping` says what applies.
          this.logger.info({ path: this.path, keeping: this.keeping() }, 'No kube-proxy configuration file');
        } else {
          this.logger.error(
            { path: this.path, err, keeping: this.keeping() },
            'Failed to read the kube-proxy configuration',
          );
        }
      }
      return;
    }
    if (text === this.lastText) return;
    this.lastText = text;
    let settings: KubeProxySettings;
    try {
      settings = parseKubeProxyConfiguration(text);
    } catch (err) {
      const message = (err as Error).message;
      if (message !== this.lastError) {
        this.lastError = message;
        // The error in `err`, as every log line of the controller carries it.
        this.logger.error({ path: this.path, err, keeping: this.keeping() }, 'Invalid kube-proxy configuration');
      }
      return;
    }
    this.lastError = undefined;
    const changed = JSON.stringify(settings) !== JSON.stringify(this.settings);
    this.settings = settings;
    if (changed || first) {
      this.logger.info({ path: this.path, settings }, 'Read the kube-proxy configuration');
      if (!first) this.onChange(settings);
    }
  }

  /** What applies while the file is missing or invalid: the settings read before, or flags and defaults. */
  private keeping(): 'previousSettings' | 'flagsAndDefaults' {
    return this.settings ? 'previousSettings' : 'flagsAndDefaults';
  }
}
