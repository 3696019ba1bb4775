// Which paths `check` tries (one Service's, or a bounded sample), and what each outcome means:
// answered and translated is working; anything else is broken, with the cause the node shows
// (not translated, no endpoints in IPVS, kube-proxy not masquerading the node's mark).

import type { DesiredState, Entry, Family, ServiceInfo } from '../../model/types.js';
import { MAX_PATHS, type CheckOptions } from './check-options.js';
import { ipvsKey, type IpvsServices } from './ipvs-table.js';
import type { Finding } from './kernel-checks.js';
import {
  PROBE_DATAGRAM,
  trackedConnections,
  tryPath,
  type ConntrackView,
  type PathOutcome,
  type TrackedConnections,
} from '../../probe/path-probe.js';

/** Paths tried at once. */
const CONCURRENCY = 8;

export interface PathReport {
  service: string;
  address: string;
  protocol: string;
  port: number;
  ok: boolean;
  /** Not tried, and why (a skipped address, one the node's own traffic is not translated for). */
  skipped?: string;
  clusterIp?: string;
  outcome?: PathOutcome;
  ms?: number;
  conntrack?: ConntrackView;
  /**
   * What conntrack holds to this address and port now, the try's own entry among them (open
   * connections, closed TCP ones in TIME_WAIT): the Service's own count on this node. Not for a
   * translation at the socket (eBPF), whose entries carry the ClusterIP.
   */
  tracked?: TrackedConnections | { problem: string };
  /** What it shows: where it was translated to, or why it is broken. */
  detail?: string;
}

export interface PathSelection {
  entries: Entry[];
  skipped: PathReport[];
  bounded?: string;
  /** Set when the named Service gives nothing to try: why. */
  nothingToTry?: string;
}

export function pathsToTry(
  desired: DesiredState,
  services: readonly ServiceInfo[],
  options: CheckOptions,
): PathSelection {
  const all = [...desired.ipv4.entries, ...desired.ipv6.entries];
  const skipped: PathReport[] = [];
  let chosen: Entry[];
  let bounded: string | undefined;
  if (options.service !== undefined) {
    const name = options.service;
    chosen = all.filter((e) => e.service === name);
    for (const s of desired.skips.filter((s) => s.service === name)) {
      skipped.push({ service: name, address: s.detail, protocol: '', port: 0, ok: true, skipped: s.reason });
    }
    for (const c of desired.conflicts.filter((c) => c.loser === name)) {
      const why = `conflict: ${c.winner} holds it`;
      skipped.push({
        service: name,
        address: c.externalIp,
        protocol: c.protocol,
        port: c.port,
        ok: true,
        skipped: why,
      });
    }
    if (chosen.length === 0) {
      const known = services.some((s) => `${s.namespace}/${s.name}` === name);
      const nothing = known
        ? `${name} has no address translated on this node${skipped.length > 0 ? ' (see its skips)' : ''}`
        : `no Service ${name} on the API server`;
      return { entries: [], skipped, nothingToTry: nothing };
    }
  } else {
    const names = [...new Set(all.map((e) => e.service))].sort();
    const sample = new Set(names.slice(0, options.sample));
    chosen = all.filter((e) => sample.has(e.service));
    if (names.length > sample.size) {
      bounded = `${sample.size} of ${names.length} translated Services tried (--sample, or --service NS/NAME)`;
    }
  }
  const fromNode: Entry[] = [];
  for (const e of chosen) {
    if (e.sourceRanges && !e.sourcesFromNode) {
      skipped.push({
        ...where(e),
        ok: true,
        skipped: "not translated for the node's own connections: loadBalancerSourceRanges leave the node out",
      });
    } else {
      fromNode.push(e);
    }
  }
  if (fromNode.length > MAX_PATHS) {
    bounded = `${MAX_PATHS} of ${fromNode.length} paths tried (at most ${MAX_PATHS} in one check)`;
    fromNode.length = MAX_PATHS;
  }
  return { entries: fromNode, skipped, ...(bounded ? { bounded } : {}) };
}

function where(e: Entry): Pick<PathReport, 'service' | 'address' | 'protocol' | 'port' | 'clusterIp'> {
  return { service: e.service, address: e.externalIp, protocol: e.protocol, port: e.port, clusterIp: e.clusterIp };
}

/** Tries every path, CONCURRENCY at a time, and judges each. */
export async function judgePaths(
  entries: readonly Entry[],
  findings: readonly Finding[],
  ipvs: IpvsServices | { problem: string } | undefined,
  timeoutMs: number,
  /** How one path is tried: a real connection unless a test gives another. */
  tryOne: typeof tryPath = tryPath,
): Promise<PathReport[]> {
  const out: PathReport[] = new Array<PathReport>(entries.length);
  let next = 0;
  const worker = async () => {
    while (next < entries.length) {
      const i = next++;
      out[i] = await judgePath(entries[i]!, findings, ipvs, timeoutMs, tryOne);
    }
  };
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, entries.length) }, worker));
  return out;
}

async function judgePath(
  e: Entry,
  findings: readonly Finding[],
  ipvs: IpvsServices | { problem: string } | undefined,
  timeoutMs: number,
  tryOne: typeof tryPath,
): Promise<PathReport> {
  const translatedTo = { address: e.clusterIp, port: e.port };
  let tried = await tryOne(e.protocol, e.externalIp, e.port, timeoutMs, translatedTo);
  let secondTry = false;
  if (tried.outcome === 'answered' && !tried.conntrack) {
    // An answered connection's entry can be gone when it is read (seen with IPVS on 6.1: a TCP
    // connect answered, no entry by either tuple). A second connection has an entry of its own;
    // one more try per such path is all it costs.
    const again = await tryOne(e.protocol, e.externalIp, e.port, timeoutMs, translatedTo);
    if (again.conntrack) [tried, secondTry] = [again, true];
  }
  const report: PathReport = { ...where(e), ok: false, outcome: tried.outcome, ms: Math.round(tried.ms * 10) / 10 };
  const ct = tried.conntrack;
  if (ct) report.conntrack = ct;
  if (!ct?.atSocket) report.tracked = await trackedConnections(e.protocol, e.externalIp, e.port);
  const to = ct ? `${ct.reply.src}:${ct.reply.sport}` : undefined;
  if (!ct) {
    // A refusal by a local socket takes the entry with it (the RST closes it at once).
    const cause = tried.outcome === 'answered' ? undefined : brokenAfterTranslation(e, findings, ipvs);
    report.detail = `${tried.outcome}${cause ? `: ${cause}` : ''}; whether it was translated is not known: ${tried.conntrackProblem}`;
    return report;
  }
  if (!ct.translated) {
    report.detail = `${tried.outcome}, NOT translated: conntrack shows the reply from ${to} itself${kernelHint(findings, e.family)}`;
    return report;
  }
  const cause = brokenAfterTranslation(e, findings, ipvs);
  if (tried.outcome === 'answered') {
    report.ok = true;
    const retried = secondTry ? '; on a second try: the first entry was gone when read' : '';
    report.detail = `answered, translated${ct.atSocket ? ' at the socket' : ''} (conntrack: reply from ${to})${retried}`;
    return report;
  }
  if (e.protocol === 'UDP' && tried.outcome === 'timed out' && cause === undefined) {
    report.ok = true;
    report.detail =
      `translated (conntrack: to ${to}); no datagram back within ${timeoutMs} ms ` +
      `(a UDP service need not answer ${JSON.stringify(PROBE_DATAGRAM)})`;
    return report;
  }
  report.detail = `${tried.outcome}${tried.error ? ` (${tried.error})` : ''} after translation to ${to}: ${cause ?? 'the endpoints did not answer'}`;
  return report;
}

/** What the node shows that breaks a translated connection: no endpoints, or no masquerade. */
function brokenAfterTranslation(
  e: Entry,
  findings: readonly Finding[],
  ipvs: IpvsServices | { problem: string } | undefined,
): string | undefined {
  if (ipvs instanceof Map) {
    const servers = ipvs.get(ipvsKey(e.protocol, e.clusterIp, e.port));
    if (servers === 0)
      return `no endpoints: IPVS's virtual service ${e.clusterIp}:${e.port}/${e.protocol} has no real server`;
  }
  const masq = findings.find((f) => f.check === 'masquerade' && f.family === e.family && !f.ok);
  if (masq) return `kube-proxy does not masquerade the node's marked connections (${masq.detail.split(':')[0]})`;
  return undefined;
}

function kernelHint(findings: readonly Finding[], family: Family): string {
  const broken = findings.filter((f) => f.family === family && !f.ok && f.check !== 'masquerade');
  return broken.length > 0 ? `; the kernel shows why: ${broken.map((f) => f.detail).join('; ')}` : '';
}
