// The command line's flags, kube-proxy style: names, help, defaults and choices (commander).
// parseConfig (options.ts) validates what they give into one Config.

import { Command, InvalidArgumentError, Option } from 'commander';
import { DEFAULT_MAX_ENTRIES_PER_SERVICE, DETECT_LOCAL_MODES } from '../model/types.js';
import { DEFAULT_PROBED_SERVICES, MAX_PROBED_SERVICES } from './probe-settings.js';
import { buildInfo } from '../build-info/version.js';
import { LOG_FORMATS } from '../log.js';

export const DEFAULT_METRICS_BIND_ADDRESS = '0.0.0.0:9477';
/** Not kube-proxy's 10256: both run with hostNetwork on the same node. */
export const DEFAULT_HEALTHZ_BIND_ADDRESS = '0.0.0.0:9478';
/** kube-proxy's default metricsBindAddress, where it answers GET /proxyMode. */
export const DEFAULT_KUBE_PROXY_METRICS_ADDRESS = '127.0.0.1:10249';

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
        "DNATs traffic that starts on this node to the Service ClusterIP (the node's own marked for masquerade).",
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
    .addOption(
      booleanOption(
        '--iptables-comments',
        "iptables backend: each rule commented with its Service's namespace/name, as the original wrote them; " +
          'false leaves them out (a change through iptables-legacy then costs about 40 % less at 10,000 Services)',
        true,
      ),
    )
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
      '--probe-service <namespace/name>',
      'probe this Service from the node every --probe-interval (repeatable); probed before annotated ones',
      (value: string, previous: string[] | undefined) => [...(previous ?? []), value],
    )
    .option(
      '--probe-max-services <n>',
      `Services probed in all: --probe-service ones, then those annotated ipvs-node-controller/probe: "true", the oldest first (0 to ${MAX_PROBED_SERVICES}; 0: no probe)`,
      String(DEFAULT_PROBED_SERVICES),
    )
    .option('--probe-interval <duration>', 'how often the probed Services are tried (at least 5s)', '30s')
    .option('--probe-timeout <duration>', 'how long a probed connection or datagram is waited for (at most 10s)', '2s')
    .addOption(
      booleanOption('--probe-readiness', '/readyz fails while a --probe-service Service does not answer', false),
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
