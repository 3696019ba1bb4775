// The text --dry-run prints before the ruleset, as nft comments: what was read and skipped, kube-proxy
// as this node sees it, and which Services depend on the controller (the migration off IPVS).

import type { Config } from '../config/options.js';
import { describeSettings, type EffectiveSettings } from '../kubeproxy/config.js';
import { describeKnownIssue, knownIssues } from '../kubeproxy/known-issues.js';
import { isNonIpvsMode, type ModeVerdict } from '../kubeproxy/mode.js';
import type { DesiredState, ServiceInfo } from '../model/types.js';

/** What --dry-run read and derived. */
export interface DryRunInputs {
  services: ServiceInfo[];
  desired: DesiredState;
  kubeProxy: { settings: EffectiveSettings; mode: ModeVerdict; fileProblem?: string };
}

/** The comment header of --dry-run; each part ends with a blank line, so the ruleset follows. */
export function dryRunReport(
  config: Pick<Config, 'kubeProxyConfig' | 'kubeProxyStepAside'>,
  { services, desired, kubeProxy }: DryRunInputs,
): string {
  return (
    describeDesiredState(desired, services.length) +
    describeKubeProxy(config, kubeProxy) +
    migrationReport(desired, services, kubeProxy.mode, config.kubeProxyStepAside)
  );
}

/** A header of nft comments: what was read, what was skipped and why. */
function describeDesiredState(desired: DesiredState, services: number): string {
  const lines = [
    `# ${services} Services read; ${desired.ipv4.entries.length} IPv4 and ${desired.ipv6.entries.length} IPv6 entries`,
  ];
  for (const s of desired.skips) lines.push(`# skipped ${s.service}: ${s.reason} (${s.detail})`);
  for (const c of desired.conflicts) {
    lines.push(`# conflict ${c.externalIp} ${c.protocol}/${c.port}: ${c.winner} wins over ${c.loser}`);
  }
  return lines.join('\n') + '\n\n';
}

/**
 * kube-proxy as this node sees it: the mode and its signal, the version and its known bugs, each
 * effective setting and its source.
 */
function describeKubeProxy(
  config: Pick<Config, 'kubeProxyConfig' | 'kubeProxyStepAside'>,
  k: DryRunInputs['kubeProxy'],
): string {
  const lines = [
    `# kube-proxy mode: ${k.mode.mode} (${k.mode.source}: ${k.mode.detail})`,
    `# kube-proxy version: ${k.mode.version ?? `unknown (${k.mode.versionProblem ?? 'not read'})`}`,
  ];
  for (const issue of knownIssues(k.mode.mode, k.mode.version)) {
    lines.push(`# known bug: ${describeKnownIssue(issue, k.mode.version!)}`);
  }
  if (config.kubeProxyConfig) {
    lines.push(
      `# kube-proxy configuration: ${config.kubeProxyConfig}${k.fileProblem ? ` not used: ${k.fileProblem}` : ''}`,
    );
  }
  for (const line of describeSettings(k.settings)) lines.push(`# setting ${line}`);
  if (isNonIpvsMode(k.mode.mode)) {
    lines.push(
      config.kubeProxyStepAside
        ? `# kube-proxy is in ${k.mode.mode} mode: the controller steps aside and programs nothing; below is what it programs in IPVS mode`
        : `# kube-proxy is in ${k.mode.mode} mode and --kube-proxy-step-aside=false: the ruleset below would preempt kube-proxy's DNAT`,
    );
  }
  return lines.join('\n') + '\n\n';
}

/**
 * Per Service: whether this node's path to its external addresses depends on the controller, and
 * what kube-proxy's mode means for it (the migration off IPVS: docs/operations.md).
 */
function migrationReport(
  desired: DesiredState,
  services: ServiceInfo[],
  mode: ModeVerdict,
  stepAside: boolean,
): string {
  const byService = new Map<string, string[]>();
  for (const e of [...desired.ipv4.entries, ...desired.ipv6.entries]) {
    const list = byService.get(e.service) ?? [];
    const node = e.sourcesFromNode ? '' : `, not from ${e.externalIp} itself`;
    const from = e.sourceRanges ? ` (from ${e.sourceRanges.join(' ')} only${node}: loadBalancerSourceRanges)` : '';
    list.push(`${e.externalIp} ${e.protocol}/${e.port}${from}`);
    byService.set(e.service, list);
  }
  const policy = new Map(services.map((s) => [`${s.namespace}/${s.name}`, s.externalTrafficPolicy]));
  // kube-proxy's bug in nftables mode (known-issues.ts) hits exactly the externalTrafficPolicy Local
  // addresses: said in nftables mode, and in IPVS mode for a move to nftables mode.
  const nftablesBug = knownIssues('nftables', mode.version)[0];
  const lines = ['# migration report (this node):'];
  for (const [service, addresses] of [...byService].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))) {
    const local = policy.get(service) === 'Local';
    let verdict: string;
    if (isNonIpvsMode(mode.mode)) {
      verdict = stepAside
        ? `kube-proxy (${mode.mode}) serves it: no dependency on the controller, which steps aside`
        : `kube-proxy (${mode.mode}) serves it, but our translation would break it: drop --kube-proxy-step-aside=false`;
      if (local && mode.mode === 'nftables' && nftablesBug) {
        verdict += `; but kube-proxy ${mode.version} drops traffic from this node's pods to it while it has no endpoint here (${nftablesBug.id}): upgrade kube-proxy`;
      }
    } else if (local) {
      verdict =
        'depends on the controller: in IPVS mode the address has only local endpoints (externalTrafficPolicy Local); ' +
        'a move to nftables mode makes kube-proxy serve it';
      if (nftablesBug) {
        verdict += `, but kube-proxy ${mode.version} in nftables mode drops traffic from this node's pods to it while it has no endpoint here (${nftablesBug.id}): upgrade kube-proxy first`;
      }
    } else {
      verdict = 'translated, but IPVS serves it without the controller too (externalTrafficPolicy Cluster)';
    }
    if (mode.mode === 'unknown') verdict += "; kube-proxy's mode is unknown here";
    lines.push(`#   ${service} ${addresses.join(', ')}: ${verdict}`);
  }
  for (const s of desired.skips.filter((s) => s.reason === 'optedOut')) {
    lines.push(`#   ${s.service}: opted out (${s.detail}): never translated, kube-proxy alone serves it`);
  }
  if (lines.length === 1) lines.push('#   no Service is translated on this node');
  return lines.join('\n') + '\n\n';
}
