// `ipvs-node-controller check`'s flags: the controller's own (so that a check run alone derives
// what a controller with those flags would), and the check's.

import { Option, type Command } from 'commander';
import { isIP } from 'node:net';
import { parseConfig, type Config } from '../../config/options.js';
import { duration, parseBindAddress, positiveCount, serviceName, UsageError } from '../../config/flag-values.js';
import type { BindAddress } from '../../http/endpoint.js';

/** Services tried when none is named, at most: a sample, never the whole cluster. */
export const MAX_SAMPLE = 50;
/** Services tried when none is named and --sample is not given. */
export const DEFAULT_SAMPLE = 5;
/** Paths tried in one check, at most (a Service with many ports and addresses is cut there). */
export const MAX_PATHS = 64;
/** The longest a path may be waited for. */
export const MAX_TIMEOUT_MS = 30_000;

export interface CheckOptions {
  /** `namespace/name`: every path of this Service; else a sample. */
  service?: string;
  sample: number;
  timeoutMs: number;
  output: 'text' | 'json';
  /** Where the running controller serves /status; undefined: checked alone. */
  controller?: BindAddress;
}

function addCheckOptions(command: Command): void {
  command
    .name('ipvs-node-controller check')
    .description(
      "Checks this node's translation: the controller's view, the kernel's objects and hooks, kube-proxy's " +
        'masquerade, and a connection from this node to the addresses of a Service (or of a sample of them). ' +
        'Exit code 0 when every checked path works, 1 when something is broken, 2 for a usage error, ' +
        '3 when it could not check (no privileges, no API server, nothing to try).',
    )
    .option('--service <namespace/name>', 'try every translated address and port of this Service')
    .option('--sample <n>', `without --service: Services tried (at most ${MAX_SAMPLE})`, String(DEFAULT_SAMPLE))
    .option('--timeout <duration>', 'how long a connection or a datagram is waited for', '2s')
    .addOption(new Option('--output <format>', 'text, or one JSON object').choices(['text', 'json']).default('text'))
    .option(
      '--controller-address <ip:port>',
      "where the running controller serves /status (default: --healthz-bind-address, at $HOST_IP or loopback for a wildcard; '' checks alone)",
    );
}

/** The controller's Config and the check's options; UsageError on a bad value. */
export function parseCheckArgs(
  argv: string[],
  env: NodeJS.ProcessEnv = process.env,
): { config: Config; check: CheckOptions } {
  let command: Command | undefined;
  const config = parseConfig(argv, env, (c) => {
    addCheckOptions(c);
    command = c;
  });
  const o = command!.opts<Record<string, string | undefined>>();
  const service = o.service === undefined ? undefined : serviceName('--service', o.service);
  const sample = positiveCount('--sample', o.sample!);
  if (sample > MAX_SAMPLE) throw new UsageError(`--sample: at most ${MAX_SAMPLE}`);
  const timeoutMs = duration('--timeout', o.timeout!, 10);
  if (timeoutMs > MAX_TIMEOUT_MS) throw new UsageError(`--timeout: at most ${MAX_TIMEOUT_MS / 1000}s`);
  let controller: BindAddress | undefined;
  if (o.controllerAddress !== undefined) {
    controller = parseBindAddress('--controller-address', o.controllerAddress);
  } else if (config.healthzBindAddress) {
    const { host, port } = config.healthzBindAddress;
    // The DaemonSet binds it to the node's address, which its pods have as HOST_IP (`kubectl exec`
    // runs with the container's environment).
    const hostIp = env.HOST_IP !== undefined && isIP(env.HOST_IP) !== 0 ? env.HOST_IP : undefined;
    const wildcard = host === '0.0.0.0' || host === '::';
    controller = { host: wildcard ? (hostIp ?? (host === '::' ? '::1' : '127.0.0.1')) : host, port };
  }
  return {
    config,
    check: {
      ...(service !== undefined ? { service } : {}),
      sample,
      timeoutMs,
      output: o.output as 'text' | 'json',
      ...(controller ? { controller } : {}),
    },
  };
}
