// The values of the command line's flags, read and checked one by one: durations, IP:port,
// CIDRs, counts, interface names. A bad value is a UsageError: one line, exit code 2.

import { isIP } from 'node:net';
import { parseCidr, formatCidr } from '../model/ip.js';
import type { DetectLocalMode } from '../model/types.js';
import { parseDuration } from './duration.js';
import type { BindAddress } from '../http/endpoint.js';

export class UsageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

/** A Service's `namespace/name`, each a DNS label (RFC 1123) as the API server allows them. */
export function serviceName(flag: string, text: string): string {
  if (!/^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?\/[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/.test(text)) {
    throw new UsageError(`${flag}: '${text}' is not namespace/name`);
  }
  return text;
}

/** Linux interface names: 1-15 bytes, no '/', whitespace, ':' or NUL. */
export const INTERFACE_NAME = /^[A-Za-z0-9_.@+-]{1,15}$/;

/** A duration flag's value in milliseconds, at least `minMs`. */
export function duration(flag: string, text: string, minMs: number): number {
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

export function bindAddressesOverlap(a: BindAddress, b: BindAddress): boolean {
  const wildcard = (h: string) => h === '0.0.0.0' || h === '::';
  return a.port === b.port && a.port !== 0 && (a.host === b.host || wildcard(a.host) || wildcard(b.host));
}

export function clusterCidrs(flag: string | undefined, env: NodeJS.ProcessEnv): string[] {
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

/** An integer from 1 to 10,000,000. */
export function positiveCount(flag: string, text: string): number {
  if (!/^\d{1,8}$/.test(text) || Number(text) < 1 || Number(text) > 10_000_000) {
    throw new UsageError(`${flag}: '${text}' must be an integer from 1 to 10000000`);
  }
  return Number(text);
}

/** A repeatable CIDR flag, every value comma-separated; undefined when not given. */
export function cidrList(flag: string, values: string[] | undefined, example: string): string[] | undefined {
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
export function serviceClusterIpRange(text: string | undefined): string[] | undefined {
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

export function checkDetectLocalValues(
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
