// `ipvs-node-controller check`: what this node's translation is, gathered in one report. The
// controller's view comes from its /status when one runs here (its backend and the settings it
// derives with, so that the check derives the very state it programs), else from the flags, as a
// controller started with them would see it. The Services and this Node come from the API server.

import type { KubeConfig } from '@kubernetes/client-node';
import { BACKENDS, selectBackend, type BackendSettings } from '../../backends/registry.js';
import type { Config } from '../../config/options.js';
import { entryLimit, type Driver, type TranslatedConnections } from '../../driver/driver.js';
import { isNonIpvsMode } from '../../kubeproxy/mode.js';
import { DesiredStateModel } from '../../model/desired-state.js';
import type { DesiredState, Entry, ModelConfig, NodeInfo, ServiceInfo, Skip } from '../../model/types.js';
import { interfaceAddresses } from '../../node/interface-addresses.js';
import { buildInfo } from '../../build-info/version.js';
import type { CheckOptions } from './check-options.js';
import { readControllerStatus, type ControllerView, type RunningController } from './controller-status.js';
import { checkHooks, checkMasquerade, checkObjects, familiesInUse, type Finding } from './kernel-checks.js';
import { readIpvsServices } from './ipvs-table.js';
import { judgePaths, pathsToTry, type PathReport } from './paths.js';

/** Why the check could not be made (exit 3): no API server, no privileges, no backend. */
export class CannotCheck extends Error {
  override name = 'CannotCheck';
}

export interface CheckReport {
  node: string;
  version: string;
  kernel: string;
  controller: ControllerView;
  kubeProxy: { mode: string; source: string; version?: string; steppedAside: boolean };
  backend: { name: string; reason: string };
  detectLocal: { mode: string; pods: string[]; problems: string[] };
  services: number;
  entries: { ipv4: number; ipv6: number };
  skips: Record<string, number>;
  findings: Finding[];
  paths: PathReport[];
  /** Services or paths left out by the bounds, said once. */
  bounded?: string;
  translated?: TranslatedConnections[];
  /** Why IPVS's table could not be read (no endpoints can then be told). */
  ipvs?: string;
  ok: boolean;
}

export async function runChecks(config: Config, options: CheckOptions, kc: KubeConfig): Promise<CheckReport> {
  const controller = await readControllerStatus(options.controller);
  const running = controller.kind === 'running' ? controller : undefined;
  const { services, node } = await readCluster(config, kc);
  const { KubeProxyAwareness } = await import('../../kubeproxy/awareness.js');
  const looked = running ? undefined : await KubeProxyAwareness.lookOnce(config);
  const model: ModelConfig = running?.model ?? looked!.settings.model;
  const mode = running?.kubeProxy?.mode ?? looked!.mode.mode;
  const stepAside = running?.backend?.kubeProxyStepAside ?? config.kubeProxyStepAside;
  const { driver, reason, probeProblem } = await backendFor(config, running);
  try {
    const maxEntries = entryLimit(driver.capacity, running?.backend?.maxEntries ?? config.maxEntries);
    const desired = new DesiredStateModel({
      ...model,
      maxEntries,
      sourceRangesSupported: driver.capabilities.filtersSources,
    }).update(services, node, interfaceAddresses());
    const steppedAside = stepAside && isNonIpvsMode(mode);
    const selection = pathsToTry(desired, services, options);
    if (selection.nothingToTry) throw new CannotCheck(selection.nothingToTry);
    const findings = steppedAside ? [] : await kernelFindings(driver, desired);
    if (probeProblem) findings.unshift({ check: 'backend', family: 'ipv4', ok: false, detail: probeProblem });
    const ipvs = selection.entries.length > 0 ? await readIpvsServices() : undefined;
    const paths = await judgePaths(selection.entries, findings, ipvs, options.timeoutMs);
    const translated = await driver.translatedConnections().catch(() => undefined);
    const report: CheckReport = {
      node: config.nodeName,
      version: buildInfo().version,
      kernel: buildInfo().kernel,
      controller,
      kubeProxy: {
        mode,
        source: running?.kubeProxy?.modeSource ?? looked!.mode.source,
        ...(version(running, looked) !== undefined ? { version: version(running, looked)! } : {}),
        steppedAside,
      },
      backend: { name: driver.label, reason },
      detectLocal: detectLocal(desired, model),
      services: services.length,
      entries: { ipv4: desired.ipv4.entries.length, ipv6: desired.ipv6.entries.length },
      skips: skipCounts(desired.skips),
      findings,
      paths: [...selection.skipped, ...paths],
      ...(selection.bounded ? { bounded: selection.bounded } : {}),
      ...(translated ? { translated } : {}),
      ...(ipvs && !(ipvs instanceof Map) ? { ipvs: ipvs.problem } : {}),
      ok: findings.every((f) => f.ok) && paths.every((p) => p.ok),
    };
    return report;
  } finally {
    await driver.close();
  }
}

function version(
  running: RunningController | undefined,
  looked: { mode: { version?: string } } | undefined,
): string | undefined {
  return running?.kubeProxy?.version ?? looked?.mode.version ?? undefined;
}

async function readCluster(config: Config, kc: KubeConfig): Promise<{ services: ServiceInfo[]; node?: NodeInfo }> {
  const { listAllJson } = await import('../../kube/cluster.js');
  const { toNodeInfo, toServiceInfo } = await import('../../kube/objects.js');
  try {
    const services = await listAllJson(kc, '/api/v1/services', {}, toServiceInfo);
    const query = { fieldSelector: `metadata.name=${config.nodeName}` };
    const nodes = await listAllJson(kc, '/api/v1/nodes', query, toNodeInfo);
    return { services, node: nodes[0] };
  } catch (err) {
    throw new CannotCheck(`cannot list Services and this Node from the API server: ${(err as Error).message}`);
  }
}

/**
 * The running controller's backend, made as it made it; else the one --backend picks here. A
 * named backend whose probe fails is still used to read what it can (the probe's failure is a
 * finding: a table in a state the kernel refuses to write over, say); with --backend=auto and no
 * backend that probes, nothing is known to read.
 */
async function backendFor(
  config: Config,
  running: RunningController | undefined,
): Promise<{ driver: Driver; reason: string; probeProblem?: string }> {
  const b = running?.backend;
  const settings: BackendSettings = {
    nftExecutor: config.nftExecutor,
    nftKeyLookup: b?.nftKeyLookup ?? config.nftKeyLookup,
    cgroupPath: b?.cgroupPath ?? config.cgroupPath,
    bpffsPath: b?.bpffsPath ?? config.bpffsPath,
  };
  const choice = b?.backend ?? config.backend;
  try {
    const selected = await selectBackend(choice, settings);
    return { driver: selected.driver, reason: b ? "the running controller's" : selected.reason };
  } catch (err) {
    if (choice === 'auto') throw new CannotCheck(`no backend can read this node: ${(err as Error).message}`);
    const { driver } = await BACKENDS[choice].create(settings);
    return { driver, reason: b ? "the running controller's" : 'as configured', probeProblem: (err as Error).message };
  }
}

async function kernelFindings(driver: Driver, desired: DesiredState): Promise<Finding[]> {
  const findings: Finding[] = [];
  const node = (f: 'ipv4' | 'ipv6') => desired[f].entries.some((e: Entry) => !e.sourceRanges || e.sourcesFromNode);
  for (const family of familiesInUse(desired)) {
    findings.push(await checkObjects(driver, desired, family));
    findings.push(await checkHooks(driver, family));
    // The node's own connections need kube-proxy's masquerade; a pod's keep their source.
    if (node(family)) findings.push(await checkMasquerade(family, desired.masqueradeMark));
  }
  return findings;
}

function detectLocal(desired: DesiredState, model: ModelConfig): CheckReport['detectLocal'] {
  const pods: string[] = [];
  const problems: string[] = [];
  for (const family of ['ipv4', 'ipv6'] as const) {
    const m = desired[family].localPodMatch;
    if (m.kind === 'cidrs') pods.push(...m.cidrs);
    else if (m.kind === 'interface') pods.push(`interface ${m.name}`);
    else if (m.kind === 'interfacePrefix') pods.push(`interfaces ${m.prefix}*`);
    else problems.push(`${family}: ${m.reason}`);
  }
  return { mode: model.detectLocalMode, pods: [...new Set(pods)], problems };
}

function skipCounts(skips: readonly Skip[]): Record<string, number> {
  const out: Record<string, number> = {};
  for (const s of skips) out[s.reason] = (out[s.reason] ?? 0) + (s.count ?? 1);
  return out;
}
