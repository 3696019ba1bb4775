// Command-line flags (flags.ts), kube-proxy style, validated up front into one Config: each value
// by flag-values.ts, then what the values say together (a mode and what it needs, a period and its
// minimum, two addresses on one port). A bad value is a UsageError: one line, exit code 2.

import { CommanderError, type Command } from 'commander';
import { hostname } from 'node:os';
import type { DetectLocalMode, ModelConfig } from '../model/types.js';
import type { KubeProxyModelSetting, SettingSource } from './setting-sources.js';
import type { BindAddress } from '../http/endpoint.js';
import type { BackendChoice } from '../driver/driver.js';
import type { LogFormat } from '../log.js';
import type { ProbeSettings } from '../probe/prober.js';
import { probeSettings } from './probe-settings.js';
import { buildCommand } from './flags.js';
import {
  bindAddressesOverlap,
  checkDetectLocalValues,
  cidrList,
  clusterCidrs,
  duration,
  INTERFACE_NAME,
  parseBindAddress,
  positiveCount,
  serviceClusterIpRange,
  UsageError,
} from './flag-values.js';

export { parseBindAddress, UsageError };

export type NftExecutorChoice = 'auto' | 'addon' | 'cli';
export type LogLevel = 'debug' | 'info' | 'warn' | 'error';

export interface Config {
  kubeconfig?: string;
  nodeName: string;
  /** False when nodeName is only the hostname (neither --node-name nor NODE_NAME). */
  nodeNameGiven: boolean;
  backend: BackendChoice;
  nftExecutor: NftExecutorChoice;
  /** How nft rules look keys up: 'auto' probes the kernel (nft/render.ts, KeyLookup). */
  nftKeyLookup: 'auto' | 'map' | 'set';
  model: ModelConfig;
  minSyncPeriodMs: number;
  syncPeriodMs: number;
  /** Shortest server-side watch timeout; each watch is randomised in [this, 2x this). */
  minWatchTimeoutMs: number;
  dryRun: boolean;
  fromFile?: string;
  cleanup: boolean;
  logLevel: LogLevel;
  /** json: pino's JSON lines; text: klog's text format. */
  logFormat: LogFormat;
  cgroupPath?: string;
  bpffsPath: string;
  /** Where /metrics is served; undefined when disabled with an empty value. */
  metricsBindAddress?: BindAddress;
  /** Where /healthz and /readyz are served; undefined when disabled with an empty value. */
  healthzBindAddress?: BindAddress;
  /** Record Kubernetes Events on Services whose addresses are skipped or lose a conflict. */
  emitEvents: boolean;
  /** Where each kube-proxy-related model setting came from (explicit flags win over kube-proxy's file). */
  modelSources: Record<KubeProxyModelSetting, SettingSource>;
  /** kube-proxy's KubeProxyConfiguration file (--kube-proxy-config). */
  kubeProxyConfig?: string;
  /** Where kube-proxy serves /proxyMode; undefined when disabled with an empty value. */
  kubeProxyMetricsAddress?: BindAddress;
  /** Whether --kube-proxy-metrics-address was given (else kube-proxy's own metricsBindAddress may replace it). */
  kubeProxyMetricsAddressExplicit: boolean;
  kubeProxyPollIntervalMs: number;
  /** Remove our rules while kube-proxy is positively in iptables or nftables mode. */
  kubeProxyStepAside: boolean;
  /** The iptables backend's rules carry their Service's `namespace/name` as a comment. */
  iptablesComments: boolean;
  /** --max-entries: entries per family this node programs at most; undefined: the backend's default. */
  maxEntries?: number;
  /** The continuous probe (--probe-*). */
  probe: ProbeSettings;
}

/**
 * Parses argv (without node and script) into a Config; throws UsageError on any bad value.
 * `extend` adds a subcommand's own options to the controller's before the parse (`check`).
 */
export function parseConfig(
  argv: string[],
  env: NodeJS.ProcessEnv = process.env,
  extend?: (command: Command) => void,
): Config {
  const command = buildCommand();
  if (extend) extend(command);
  else {
    command.addHelpText(
      'after',
      "\nCommands:\n  check [flags]  check this node's translation end to end (ipvs-node-controller check --help)",
    );
  }
  command.exitOverride().configureOutput({ writeErr: () => undefined, writeOut: (s) => process.stdout.write(s) });
  try {
    command.parse(argv, { from: 'user' });
  } catch (err) {
    if (err instanceof CommanderError) {
      if (err.code === 'commander.helpDisplayed' || err.code === 'commander.version') throw err;
      throw new UsageError(err.message.replace(/^error: /, ''));
    }
    throw err;
  }
  const o = command.opts<Record<string, string | string[] | boolean | undefined>>();
  const str = (k: string) => (typeof o[k] === 'string' ? (o[k] as string) : undefined);
  const fromCli = (k: string) => command.getOptionValueSource(k) === 'cli';
  /** A flag and its kube-proxy alias: either may be given, both only with the same value. */
  const aliased = (key: string, alias: string, flag: string, aliasFlag: string): string | undefined => {
    const a = str(alias);
    if (a === undefined) return str(key);
    if (fromCli(key) && str(key) !== a) throw new UsageError(`${flag} and ${aliasFlag} (its kube-proxy name) differ`);
    return a;
  };

  const bit = aliased('masqueradeBit', 'iptablesMasqueradeBit', '--masquerade-bit', '--iptables-masquerade-bit')!;
  if (!/^\d+$/.test(bit) || Number(bit) > 31) {
    const flag = str('iptablesMasqueradeBit') !== undefined ? '--iptables-masquerade-bit' : '--masquerade-bit';
    throw new UsageError(`${flag}: '${bit}' must be an integer from 0 to 31`);
  }
  const mode = str('detectLocalMode') as DetectLocalMode;
  const podBridgeInterface = str('podBridgeInterface');
  const podInterfaceNamePrefix = str('podInterfaceNamePrefix');
  if (podBridgeInterface !== undefined && !INTERFACE_NAME.test(podBridgeInterface)) {
    throw new UsageError(`--pod-bridge-interface: '${podBridgeInterface}' is not an interface name`);
  }
  if (podInterfaceNamePrefix !== undefined && !INTERFACE_NAME.test(podInterfaceNamePrefix)) {
    throw new UsageError(`--pod-interface-name-prefix: '${podInterfaceNamePrefix}' is not an interface name prefix`);
  }
  const cidrs = clusterCidrs(str('clusterCidr'), env);
  const kubeProxyConfig = str('kubeProxyConfig');
  if (kubeProxyConfig === '') throw new UsageError('--kube-proxy-config: give a file path');
  const given = (key: string): SettingSource => (fromCli(key) ? 'flag' : 'default');
  const modelSources: Record<KubeProxyModelSetting, SettingSource> = {
    detectLocalMode: given('detectLocalMode'),
    clusterCidrs: str('clusterCidr') !== undefined ? 'flag' : cidrs.length > 0 ? 'env' : 'default',
    podBridgeInterface: given('podBridgeInterface'),
    podInterfaceNamePrefix: given('podInterfaceNamePrefix'),
    masqueradeBit: str('iptablesMasqueradeBit') !== undefined ? 'flag' : given('masqueradeBit'),
    allowServiceExternalIPs: 'default',
  };
  // With kube-proxy's file, a mode's value may come from the file; the model reports it if it does not.
  if (kubeProxyConfig === undefined) checkDetectLocalValues(mode, cidrs, podBridgeInterface, podInterfaceNamePrefix);
  const minSyncPeriodMs = duration('--min-sync-period', str('minSyncPeriod')!, 0);
  const syncPeriodMs = duration('--sync-period', str('syncPeriod')!, 1000);
  if (minSyncPeriodMs > syncPeriodMs) {
    throw new UsageError('--min-sync-period must not be longer than --sync-period');
  }
  const dryRun = o.dryRun === true;
  const cleanup = o.cleanup === true;
  const fromFile = str('fromFile');
  if (fromFile !== undefined && !dryRun) throw new UsageError('--from-file only works with --dry-run');
  if (dryRun && cleanup) throw new UsageError('--dry-run and --cleanup exclude each other');

  const metricsBindAddress = parseBindAddress('--metrics-bind-address', str('metricsBindAddress') ?? '');
  const healthzBindAddress = parseBindAddress('--healthz-bind-address', str('healthzBindAddress') ?? '');
  if (metricsBindAddress && healthzBindAddress && bindAddressesOverlap(metricsBindAddress, healthzBindAddress)) {
    throw new UsageError('--metrics-bind-address and --healthz-bind-address must use different ports');
  }

  const kubeProxyMetricsAddress = parseBindAddress(
    '--kube-proxy-metrics-address',
    str('kubeProxyMetricsAddress') ?? '',
  );
  const kubeProxyPollIntervalMs = duration('--kube-proxy-mode-poll-interval', str('kubeProxyModePollInterval')!, 100);

  const maxEntriesPerService = positiveCount('--max-entries-per-service', str('maxEntriesPerService')!);
  const maxEntriesText = str('maxEntries');
  const maxEntries = maxEntriesText === undefined ? undefined : positiveCount('--max-entries', maxEntriesText);
  const externalIpRanges = cidrList(
    '--service-external-ip-range',
    o.serviceExternalIpRange as string[] | undefined,
    '198.51.100.0/24,2001:db8:1::/64',
  );
  const serviceCidrs = serviceClusterIpRange(str('serviceClusterIpRange'));
  const nodeAddressRanges = cidrList(
    '--node-address-ranges',
    o.nodeAddressRanges as string[] | undefined,
    '192.168.0.0/24,2001:db8:ffff::/64',
  );

  const nodeNameFlag = aliased('nodeName', 'hostnameOverride', '--node-name', '--hostname-override');
  const nodeName = nodeNameFlag ?? env.NODE_NAME ?? hostname();
  return {
    kubeconfig: str('kubeconfig'),
    nodeName,
    nodeNameGiven: nodeNameFlag !== undefined || env.NODE_NAME !== undefined,
    backend: str('backend') as BackendChoice,
    nftExecutor: str('nftExecutor') as NftExecutorChoice,
    nftKeyLookup: str('nftKeyLookup') as Config['nftKeyLookup'],
    model: {
      detectLocalMode: mode,
      clusterCidrs: cidrs,
      podBridgeInterface,
      podInterfaceNamePrefix,
      masqueradeBit: Number(bit),
      localTrafficPolicyOnly: o.localTrafficPolicyOnly === true,
      maxEntriesPerService,
      externalIpRanges,
      allowServiceExternalIPs: true,
      serviceCidrs,
      nodeAddressRanges,
    },
    maxEntries,
    minSyncPeriodMs,
    syncPeriodMs,
    minWatchTimeoutMs: duration('--min-watch-timeout', str('minWatchTimeout')!, 1000),
    dryRun,
    fromFile,
    cleanup,
    logLevel: str('logLevel') as LogLevel,
    logFormat: str('logFormat') as LogFormat,
    cgroupPath: str('cgroupPath'),
    bpffsPath: str('bpffsPath')!,
    metricsBindAddress,
    healthzBindAddress,
    emitEvents: o.emitEvents === true,
    modelSources,
    kubeProxyConfig,
    kubeProxyMetricsAddress,
    kubeProxyMetricsAddressExplicit: command.getOptionValueSource('kubeProxyMetricsAddress') === 'cli',
    kubeProxyPollIntervalMs,
    kubeProxyStepAside: o.kubeProxyStepAside === true,
    iptablesComments: o.iptablesComments === true,
    probe: probeSettings(o),
  };
}
