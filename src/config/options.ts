// Command-line flags, kube-proxy style, validated up front into one Config.
// A bad value is a UsageError: one line, exit code 2.

import { Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import { isIP } from 'node:net';
import { hostname } from 'node:os';
import { parseCidr, formatCidr } from '../model/ip.js';
import {
  DEFAULT_MAX_ENTRIES_PER_SERVICE,
  DETECT_LOCAL_MODES,
  type DetectLocalMode,
  type ModelConfig,
} from '../model/types.js';
import { parseDuration } from './duration.js';
import type { KubeProxyModelSetting, SettingSource } from './setting-sources.js';
import type { BindAddress } from '../http/endpoint.js';
import type { BackendChoice } from '../backends/registry.js';
import { buildInfo } from '../build-info/version.js';
import { LOG_FORMATS, type LogFormat } from '../log.js';

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
  /** --max-entries: entries per family this node programs at most; undefined: the backend's default. */
  maxEntries?: number;
}

export const DEFAULT_METRICS_BIND_ADDRESS = '0.0.0.0:9477';
/** Not kube-proxy's 10256: both run with hostNetwork on the same node. */
export const DEFAULT_HEALTHZ_BIND_ADDRESS = '0.0.0.0:9478';
/** kube-proxy's default metricsBindAddress, where it answers GET /proxyMode. */
export const DEFAULT_KUBE_PROXY_METRICS_ADDRESS = '127.0.0.1:10249';

export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/** Linux interface names: 1-15 bytes, no '/', whitespace, ':' or NUL. */
const INTERFACE_NAME = /^[A-Za-z0-9_.@+-]{1,15}$/;

/** The values Go's strconv.ParseBool takes, as kube-proxy's boolean flags do. */
const BOOLEAN_VALUES: Record<string, boolean> = Object.fromEntries([
  ...['1', 't', 'T', 'TRUE', 'true', 'True'].map((v) => [v, true] as const),
  ...['0', 'f', 'F', 'FALSE', 'false', 'False'].map((v) => [v, false] as const),
]);

/**
 * A boolean flag as kube-proxy's: `--flag` alone is true, and `--flag=true` / `--flag=false`
 * (any value strconv.ParseBool takes) set it.
 */
function booleanOption(flag: string, description: string, defaultValue: boolean): Option {
  return new Option(`${flag} [bool]`, description).default(defaultValue).argParser((value: string) => {
    const parsed = BOOLEAN_VALUES[value];
    if (parsed === undefined) throw new InvalidArgumentError(`'${value}' is not true or false.`);
    return parsed;
  });
}

export function buildCommand(): Command {
  return new Command('ipvs-node-controller')
    .description(
      'Makes in-cluster traffic to LoadBalancer and external IPs of Services work in kube-proxy IPVS mode:\n' +
        'DNATs traffic that starts on this node to the Service ClusterIP and marks it for masquerade.',
    )
    .option('--kubeconfig <path>', 'kubeconfig file; in-cluster configuration when absent')
    .option('--node-name <name>', 'name of this node (env NODE_NAME; default: hostname)')
    .option('--hostname-override <name>', "kube-proxy's name for --node-name")
    .addOption(
      new Option('--backend <name>', 'kernel backend').choices(['auto', 'nft', 'iptables', 'ebpf']).default('auto'),
    )
    .addOption(
      new Option('--nft-executor <kind>', 'how nft transactions run: in-process addon or the nft CLI')
        .choices(['auto', 'addon', 'cli'])
        .default('auto'),
    )
    .addOption(
      new Option(
        '--nft-key-lookup <how>',
        'how nft rules find an entry: in the map itself (Linux 6.12 takes it; 6.1 and 5.10 refuse it), in a set of its keys ' +
          '(any kernel), or auto: as this kernel allows',
      )
        .choices(['auto', 'map', 'set'])
        .default('auto'),
    )
    .addOption(
      new Option('--detect-local-mode <mode>', 'how traffic from local pods is recognised')
        .choices([...DETECT_LOCAL_MODES])
        .default('NodeCIDR'),
    )
    .option(
      '--cluster-cidr <cidrs>',
      'pod CIDRs of the cluster, comma-separated (ClusterCIDR mode; env POD_CIDR_IPV4, POD_CIDR_IPV6)',
    )
    .option('--pod-bridge-interface <name>', 'pod bridge interface, e.g. cni0 (BridgeInterface mode)')
    .option('--pod-interface-name-prefix <prefix>', 'pod interface prefix, e.g. veth (InterfaceNamePrefix mode)')
    .option('--masquerade-bit <bit>', 'bit of the packet mark kube-proxy masquerades on (0-31)', '14')
    .option('--iptables-masquerade-bit <bit>', "kube-proxy's name for --masquerade-bit")
    .option('--min-sync-period <duration>', 'minimum interval between syncs; bursts of changes are coalesced', '1s')
    .option('--sync-period <duration>', 'interval of full resyncs that repair drift', '30s')
    .option(
      '--min-watch-timeout <duration>',
      'shortest server-side watch timeout (each is randomised up to twice this); a watch silent past its timeout is replaced',
      '5m',
    )
    .addOption(
      booleanOption('--local-traffic-policy-only', 'only translate Services with externalTrafficPolicy: Local', false),
    )
    .option(
      '--max-entries-per-service <n>',
      'a Service asking for more entries (external addresses x ports) is not translated at all',
      String(DEFAULT_MAX_ENTRIES_PER_SERVICE),
    )
    .option(
      '--max-entries <n>',
      'entries per family this node programs at most; the youngest Services that do not fit are not translated ' +
        '(default: nft 65536, iptables 20000, ebpf 65536, the size of its maps and the most it takes)',
    )
    .option(
      '--service-external-ip-range <cidrs>',
      'only translate spec.externalIPs inside these CIDRs (comma-separated, repeatable; default: any)',
      (value: string, previous: string[] | undefined) => [...(previous ?? []), value],
    )
    .option(
      '--service-cluster-ip-range <cidrs>',
      "the cluster's Service CIDRs, comma-separated, one per family (kube-apiserver's flag): external " +
        'addresses inside are never translated (the ClusterIPs of the Services never are)',
    )
    .option(
      '--node-address-ranges <cidrs>',
      "CIDRs the cluster's Nodes have their addresses in (comma-separated, repeatable): external addresses " +
        'inside are never translated; leave out ranges load balancers take addresses from',
      (value: string, previous: string[] | undefined) => [...(previous ?? []), value],
    )
    .addOption(
      booleanOption(
        '--dry-run',
        'print the ruleset that would be programmed and exit (nft text; iptables-restore input with --backend=iptables)',
        false,
      ),
    )
    .option(
      '--from-file <path>',
      "with --dry-run: read Service and Node objects from a file (JSON or YAML, '-' for stdin)",
    )
    .addOption(booleanOption('--cleanup', 'remove every object of ours from every backend and exit', false))
    .option('--cgroup-path <path>', 'ebpf backend: cgroup v2 directory to attach to (default: the cgroup v2 root)')
    .option(
      '--bpffs-path <path>',
      'ebpf backend: bpffs directory for pinned programs and maps',
      '/sys/fs/bpf/ipvs-node-controller',
    )
    .option('--metrics-bind-address <ip:port>', "where /metrics is served ('' disables)", DEFAULT_METRICS_BIND_ADDRESS)
    .option(
      '--healthz-bind-address <ip:port>',
      "where /healthz and /readyz are served ('' disables)",
      DEFAULT_HEALTHZ_BIND_ADDRESS,
    )
    .addOption(
      booleanOption(
        '--emit-events',
        'record Kubernetes Events on Services whose addresses are skipped or lose a conflict',
        false,
      ),
    )
    .option(
      '--kube-proxy-config <path>',
      "kube-proxy's KubeProxyConfiguration file: masquerade bit, cluster CIDR, detect-local mode and mode " +
        'are taken from it unless given as flags; followed on change',
    )
    .option(
      '--kube-proxy-metrics-address <ip:port>',
      "where kube-proxy answers GET /proxyMode ('' disables asking)",
      DEFAULT_KUBE_PROXY_METRICS_ADDRESS,
    )
    .option('--kube-proxy-mode-poll-interval <duration>', "how often kube-proxy's mode is looked at", '2s')
    .addOption(
      booleanOption(
        '--kube-proxy-step-aside',
        'remove our rules and program nothing while kube-proxy is in iptables or nftables mode',
        true,
      ),
    )
    .addOption(
      new Option('--log-level <level>', 'log level').choices(['debug', 'info', 'warn', 'error']).default('info'),
    )
    .addOption(
      new Option('--log-format <format>', "log lines: JSON, or klog's text format as kube-proxy writes it")
        .choices(LOG_FORMATS)
        .default('json'),
    )
    .helpOption('-h, --help', 'show this help')
    .version(buildInfo().version, '-V, --version', 'print the version and exit')
    .showSuggestionAfterError(true)
    .allowExcessArguments(false);
}

function duration(flag: string, text: string, minMs: number): number {
  const ms = parseDuration(text);
  if (ms === undefined) throw new UsageError(`${flag}: '${text}' is not a duration (write it as 30s, 500ms, 1m)`);
  if (ms < minMs) throw new UsageError(`${flag}: ${text} is too short (at least ${minMs}ms)`);
  return ms;
}

/**
 * `IP:port` into a BindAddress; '' means disabled. Throws UsageError. IPv6 is written in brackets;
 * an IPv4 address may be too, as Go's net.SplitHostPort allows: `[$(HOST_IP)]:9477` in a manifest
 * then works for a node of either family.
 */
export function parseBindAddress(flag: string, text: string): BindAddress | undefined {
  if (text === '') return undefined;
  const m = /^(?:\[([^\]]+)\]|([^:[\]]+)):(\d{1,5})$/.exec(text);
  const host = m ? (m[1] ?? m[2])! : '';
  const family = isIP(host);
  const port = m ? Number(m[3]) : NaN;
  if (!m || family === 0 || (family === 6 && m[1] === undefined) || port > 65535) {
    throw new UsageError(
      `${flag}: '${text}' is not IP:port (e.g. 0.0.0.0:9477, 127.0.0.1:9477, [::]:9477; '' disables)`,
    );
  }
  return { host, port };
}

function bindAddressesOverlap(a: BindAddress, b: BindAddress): boolean {
  const wildcard = (h: string) => h === '0.0.0.0' || h === '::';
  return a.port === b.port && a.port !== 0 && (a.host === b.host || wildcard(a.host) || wildcard(b.host));
}

function clusterCidrs(flag: string | undefined, env: NodeJS.ProcessEnv): string[] {
  const texts = flag
    ? flag.split(',')
    : [env.POD_CIDR_IPV4, env.POD_CIDR_IPV6].filter((t): t is string => typeof t === 'string' && t !== '');
  const out: string[] = [];
  for (const raw of texts) {
    const text = raw.trim();
    const cidr = parseCidr(text);
    if (!cidr) throw new UsageError(`--cluster-cidr: '${text}' is not a CIDR (e.g. 10.244.0.0/16,fd00:10:244::/56)`);
    out.push(formatCidr(cidr));
  }
  return out;
}

/** Parses argv (without node and script) into a Config; throws UsageError on any bad value. */
export function parseConfig(argv: string[], env: NodeJS.ProcessEnv = process.env): Config {
  const command = buildCommand()
    .exitOverride()
    .configureOutput({ writeErr: () => undefined, writeOut: (s) => process.stdout.write(s) });
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
  };
}

/** An integer from 1 to 10,000,000. */
function positiveCount(flag: string, text: string): number {
  if (!/^\d{1,8}$/.test(text) || Number(text) < 1 || Number(text) > 10_000_000) {
    throw new UsageError(`${flag}: '${text}' must be an integer from 1 to 10000000`);
  }
  return Number(text);
}

/** A repeatable CIDR flag, every value comma-separated; undefined when not given. */
function cidrList(flag: string, values: string[] | undefined, example: string): string[] | undefined {
  if (values === undefined) return undefined;
  const out: string[] = [];
  for (const raw of values.flatMap((v) => v.split(','))) {
    const text = raw.trim();
    const cidr = parseCidr(text);
    if (!cidr) throw new UsageError(`${flag}: '${text}' is not a CIDR (e.g. ${example})`);
    out.push(formatCidr(cidr));
  }
  return out;
}

/** --service-cluster-ip-range as kube-apiserver takes it: one CIDR, or one of each family. */
function serviceClusterIpRange(text: string | undefined): string[] | undefined {
  const cidrs = cidrList(
    '--service-cluster-ip-range',
    text === undefined ? undefined : [text],
    '10.96.0.0/12,fd00:10:96::/108',
  );
  if (!cidrs) return undefined;
  const families = cidrs.map((c) => parseCidr(c)!.family);
  if (cidrs.length > 2 || new Set(families).size !== families.length) {
    throw new UsageError(
      `--service-cluster-ip-range: '${text}' must be one CIDR, or one IPv4 and one IPv6 (e.g. 10.96.0.0/12,fd00:10:96::/108)`,
    );
  }
  return cidrs;
}

function checkDetectLocalValues(
  mode: DetectLocalMode,
  cidrs: string[],
  podBridgeInterface: string | undefined,
  podInterfaceNamePrefix: string | undefined,
): void {
  if (mode === 'ClusterCIDR' && cidrs.length === 0) {
    throw new UsageError('--detect-local-mode=ClusterCIDR needs --cluster-cidr (or POD_CIDR_IPV4 / POD_CIDR_IPV6)');
  }
  if (mode === 'BridgeInterface' && !podBridgeInterface) {
    throw new UsageError('--detect-local-mode=BridgeInterface needs --pod-bridge-interface');
  }
  if (mode === 'InterfaceNamePrefix' && !podInterfaceNamePrefix) {
    throw new UsageError('--detect-local-mode=InterfaceNamePrefix needs --pod-interface-name-prefix');
  }
}
