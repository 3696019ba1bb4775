// Bugs of kube-proxy itself that break traffic the controller is about, by mode and version, so
// that an operator hears of them where they look (log, /readyz, metrics, a Node Event). The
// controller cannot work around them: it steps aside in the modes they live in.

import { compareVersions, parseKubeProxyVersion, type KubeProxyVersion } from './version.js';

export interface KnownIssue {
  /** Where it is tracked: the metric's `issue` label. */
  id: string;
  /** What it does to traffic, one clause. */
  effect: string;
  /** Which versions have it and which fix it, one clause. */
  versions: string;
}

interface Rule extends KnownIssue {
  applies(mode: string, version: KubeProxyVersion): boolean;
}

const v = (text: string) => parseKubeProxyVersion(text)!;
// kubernetes#132456 (in v1.34.0-beta.0, so in every 1.34 release) and its cherry-pick to
// release-1.33, kubernetes#133969 (in v1.33.6). No backport to 1.32 or older is known.
const FIXED_ON_1_33 = v('v1.33.6');
const FIXED_FROM = v('v1.34.0-beta.0');

const RULES: readonly Rule[] = [
  {
    id: 'kubernetes#131765',
    effect:
      'in nftables mode kube-proxy drops traffic from pods on this node to the external and LoadBalancer IPs of ' +
      'externalTrafficPolicy: Local Services that have no endpoint on this node (its no-endpoint filter runs before its DNAT)',
    versions:
      'kube-proxy 1.33.0 to 1.33.5 and every older release with nftables mode have it; v1.33.6 and v1.34.0 fix it (kubernetes#132456)',
    applies: (mode, version) =>
      mode === 'nftables' &&
      compareVersions(version, FIXED_FROM) < 0 &&
      !(version.major === 1 && version.minor === 33 && compareVersions(version, FIXED_ON_1_33) >= 0),
  },
];

/** Every issue the controller knows, whether it applies or not: the metric's label values. */
export const KNOWN_ISSUE_IDS: readonly string[] = RULES.map((r) => r.id);

/** The known bugs of kube-proxy in `mode` at `version` (none when the version is unknown or malformed). */
export function knownIssues(mode: string, version: string | undefined): KnownIssue[] {
  const parsed = version === undefined ? undefined : parseKubeProxyVersion(version);
  if (!parsed) return [];
  return RULES.filter((r) => r.applies(mode, parsed)).map(({ id, effect, versions }) => ({ id, effect, versions }));
}

/** One line per issue, for /readyz warnings, the log and the Event. */
export function describeKnownIssue(issue: KnownIssue, version: string): string {
  return `kube-proxy ${version} has a known bug (${issue.id}): ${issue.effect}; ${issue.versions}; the controller cannot work around it: upgrade kube-proxy`;
}
