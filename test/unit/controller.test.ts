// The Controller without root: caches held in memory, the reconciler over a fake driver, and a
// recording conntrack cleaner (the conntrack command itself is proven by the kernel tests).
// Stepping aside and back, conntrack clean-up after every change, Services over a limit, a failed
// write followed by a whole one, drift found by reading back, entries the driver leaves out
// reaching the metrics, and a bypass the driver tells reaching the conntrack client.

import { expect } from 'chai';
import { Controller, type SyncReport } from '../../src/controller/controller.js';
import type { ConntrackCleanupReport } from '../../src/conntrack/conntrack-cleaner.js';
import type { StaleTuple } from '../../src/conntrack/stale-tuples.js';
import type { ClusterCaches } from '../../src/kube/cluster.js';
import type { ModeVerdict } from '../../src/kubeproxy/mode.js';
import { ControllerMetrics } from '../../src/metrics/controller-metrics.js';
import { pino } from 'pino';
import type { Entry, Family, ModelConfig, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { composeReconciler } from '../../src/cli/compose.js';
import { FakeDriver } from '../doubles/fake-driver.js';
import { CONFIG } from '../support/fixtures.js';

const NODE: NodeInfo = { name: 'node-1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };

const IPVS: ModeVerdict = { mode: 'ipvs', source: 'proxyMode', detail: 'kube-proxy answers /proxyMode: ipvs' };
const IPTABLES: ModeVerdict = {
  mode: 'iptables',
  source: 'proxyMode',
  detail: 'kube-proxy answers /proxyMode: iptables',
};

function service(i: number, over: Partial<ServiceInfo> = {}, protocol = 'UDP', ports = [53]): ServiceInfo {
  return {
    namespace: 'default',
    name: `svc-${i}`,
    type: 'LoadBalancer',
    creationTimestamp: `2024-01-0${Math.min(i, 9)}T00:00:00Z`,
    clusterIP: `10.96.0.${i}`,
    ports: ports.map((port) => ({ port, protocol })),
    ingress: [{ ip: `192.0.2.${i}` }],
    ...over,
  };
}

/** Caches as the informers hold them once synced; `set` changes the Services and tells the controller. */
class Caches {
  services: ServiceInfo[] = [];
  controller: Controller | undefined;
  readonly caches: ClusterCaches;

  constructor() {
    const cache = (items: () => unknown[]) =>
      ({
        start: () => undefined,
        stop: async () => undefined,
        waitForSync: async () => undefined,
        hasSynced: () => true,
        list: () => items(),
        // The model reads a list it is given whole (no change feed): every sync compares it.
        changes: { [Symbol.iterator]: () => items()[Symbol.iterator]() },
      }) as unknown;
    this.caches = {
      services: cache(() => this.services) as ClusterCaches['services'],
      node: cache(() => [NODE]) as ClusterCaches['node'],
      onChange: (listener) => void this.listeners.push(listener),
    };
  }

  private readonly listeners: Array<() => void> = [];

  set(services: ServiceInfo[]): void {
    this.services = services;
    for (const listener of this.listeners) listener();
  }
}

/** A ConntrackCleaner that records what it is asked to delete, and deletes nothing. */
class RecordingConntrack {
  readonly calls: StaleTuple[][] = [];
  /** Per bypass clean-up asked for: the family and its entries as `externalIp/protocol/port`. */
  readonly forgotten: string[] = [];
  /** What the composition's onConntrackCleanup was told. */
  readonly reports: ConntrackCleanupReport[] = [];
  async clean(tuples: readonly StaleTuple[]): Promise<ConntrackCleanupReport> {
    this.calls.push([...tuples]);
    return { tuples: tuples.length, deleted: 0, failures: 0, durationMs: 0 };
  }

  async forgetUntranslated(
    family: Family,
    entries: readonly Pick<Entry, 'externalIp' | 'protocol' | 'port'>[],
    onReport?: (report: ConntrackCleanupReport) => void,
  ): Promise<void> {
    this.forgotten.push(`${family} ${entries.map((e) => `${e.externalIp}/${e.protocol}/${e.port}`).join(' ')}`);
    onReport?.({ tuples: entries.length, deleted: 1, failures: 0, durationMs: 0 });
  }

  /** The tuples of the last call, as `why externalIp/protocol/port`, sorted. */
  last(): string[] {
    return (this.calls.at(-1) ?? []).map((t) => `${t.why} ${t.externalIp}/${t.protocol}/${t.port}`).sort();
  }
}

interface Rig {
  controller: Controller;
  caches: Caches;
  driver: FakeDriver;
  conntrack: RecordingConntrack;
  reports: SyncReport[];
  /** Waits until `n` syncs ended in all. */
  syncs: (n: number) => Promise<SyncReport>;
}

const running: Controller[] = [];

async function rig(
  services: ServiceInfo[],
  options: {
    model?: Partial<ModelConfig>;
    maxEntries?: number;
    mode?: ModeVerdict;
    /** Entries the driver refuses. */
    rejects?: (entry: Entry) => string | undefined;
    metrics?: ControllerMetrics;
  } = {},
): Promise<Rig> {
  const caches = new Caches();
  caches.services = services;
  const driver = new FakeDriver();
  driver.rejects = options.rejects;
  const conntrack = new RecordingConntrack();
  const reports: SyncReport[] = [];
  const logger = pino({ level: 'silent' });
  // As the composition root wires it, with the recording client for the conntrack command.
  const reconciler = composeReconciler(driver, {
    logger,
    conntrack,
    onConntrackCleanup: (report) => conntrack.reports.push(report),
  });
  const controller = new Controller({
    caches: caches.caches,
    reconciler,
    model: { ...CONFIG, ...options.model },
    nodeName: NODE.name,
    minSyncPeriodMs: 0,
    syncPeriodMs: 3_600_000,
    logger,
    observer: {
      onSync: (r) => {
        options.metrics?.onSync(r);
        reports.push(r);
      },
    },
    kubeProxyMode: options.mode ?? IPVS,
    ...(options.maxEntries !== undefined ? { maxEntries: options.maxEntries } : {}),
  });
  caches.controller = controller;
  running.push(controller);
  const syncs = async (n: number) => {
    const deadline = Date.now() + 5_000;
    while (reports.length < n) {
      if (Date.now() > deadline) expect.fail(`${n} syncs within 5 s; ${reports.length} ended`);
      await new Promise((resolve) => setTimeout(resolve, 2));
    }
    return reports[n - 1]!;
  };
  await controller.start();
  await syncs(1);
  return { controller, caches, driver, conntrack, reports, syncs };
}

describe('Controller on a fake driver (no root)', () => {
  afterEach(async () => {
    for (const c of running.splice(0)) await c.stop();
  });

  it('programs the caches at start, and cleans only untranslated flows of what it finds', async () => {
    const { driver, conntrack, reports } = await rig([service(1), service(2, {}, 'TCP', [80])]);
    expect(reports[0]!.result).to.include({ mode: 'full' });
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 UDP 53 -> 10.96.0.1', '192.0.2.2 TCP 80 -> 10.96.0.2']);
    // What the kernel held before the start is not known: a previous run's flows keep their path.
    expect(conntrack.last()).to.deep.equal(['first sync 192.0.2.1/UDP/53']);
    expect(conntrack.calls[0]![0]!.untranslatedOnly).to.equal(true);
  });

  it('cleans conntrack after every change, with the tuples that changed, and not when none did', async () => {
    const { caches, conntrack, syncs } = await rig([service(1), service(2), service(3)]);
    caches.set([service(1, { clusterIP: '10.96.1.1' }), service(2), service(4)]);
    expect((await syncs(2)).result).to.include({ mode: 'partial' });
    expect(conntrack.last()).to.deep.equal([
      'appeared 192.0.2.4/UDP/53',
      'removed 192.0.2.3/UDP/53',
      'retargeted 192.0.2.1/UDP/53',
    ]);
    expect(conntrack.calls.at(-1)!.every((t) => !t.untranslatedOnly)).to.equal(true);
    // A TCP Service changes nothing conntrack keeps.
    const calls = conntrack.calls.length;
    caches.set([service(1, { clusterIP: '10.96.1.1' }), service(2), service(4), service(5, {}, 'TCP', [443])]);
    expect((await syncs(3)).result).to.include({ mode: 'partial' });
    expect(conntrack.calls).to.have.length(calls);
  });

  it('tells each clean-up to the observer the composition gave, the clean-ups after changes and after a bypass', async () => {
    const { caches, driver, conntrack, syncs } = await rig([service(1)]);
    caches.set([service(1), service(2)]);
    await syncs(2);
    expect(conntrack.reports).to.have.length(conntrack.calls.length).and.length.at.least(2);
    // The driver saw the family's translations passed by (iptables: a jump displaced): the
    // reconciler tells its subscribers with the entries its ledger holds there, and the conntrack
    // client forgets the flows pinned meanwhile.
    driver.bypass('ipv4');
    expect(conntrack.forgotten).to.deep.equal(['ipv4 192.0.2.1/UDP/53 192.0.2.2/UDP/53']);
    expect(conntrack.reports.at(-1)).to.include({ tuples: 2, deleted: 1 });
    // A family that holds none of ours: nobody is told.
    driver.bypass('ipv6');
    expect(conntrack.forgotten).to.have.length(1);
  });

  it('steps aside when kube-proxy turns to iptables mode, and back when it is in IPVS mode again', async () => {
    const { controller, driver, conntrack, syncs } = await rig([service(1), service(2)]);
    // The status is read live, as /readyz reads it: taken once, it shows what comes after.
    const status = controller.status;
    controller.onKubeProxyMode(IPTABLES);
    const aside = await syncs(2);
    expect(aside.result).to.deep.equal({ mode: 'noop', entries: { ipv4: 0, ipv6: 0 }, rejected: [] });
    expect(driver.kernel.size, 'nothing of ours in the kernel').to.equal(0);
    expect(driver.applied.at(-1)).to.deep.equal([{ kind: 'removeAll' }]);
    expect(status.kubeProxy).to.include({ steppedAside: true });
    // Flows our translations made go with them.
    expect(conntrack.last()).to.deep.equal(['removed 192.0.2.1/UDP/53', 'removed 192.0.2.2/UDP/53']);
    controller.onKubeProxyMode(IPVS);
    const back = await syncs(3);
    expect(back.requested).to.equal('full');
    expect(back.result).to.include({ mode: 'full' });
    expect(driver.held('ipv4')).to.have.length(2);
    expect(controller.status.kubeProxy).to.include({ steppedAside: false });
    expect(conntrack.last()).to.deep.equal(['appeared 192.0.2.1/UDP/53', 'appeared 192.0.2.2/UDP/53']);
  });

  it('stays aside while kube-proxy is in no known mode after iptables, programming nothing', async () => {
    const { controller, caches, driver, syncs } = await rig([service(1)], { mode: IPTABLES });
    expect(driver.kernel.size).to.equal(0);
    controller.onKubeProxyMode({ mode: 'unknown', source: 'none', detail: 'kube-proxy does not answer' });
    await syncs(2);
    caches.set([service(1), service(2)]);
    await syncs(3);
    expect(driver.kernel.size).to.equal(0);
    expect(driver.applied.filter((ops) => ops.some((op) => op.kind !== 'removeAll'))).to.deep.equal([]);
  });

  it('skips a Service over --max-entries-per-service and one over --max-entries, and programs the others', async () => {
    const many = service(3, {}, 'TCP', [80, 81, 82]);
    const { controller, driver } = await rig([service(1), service(2), many, service(4)], {
      model: { maxEntriesPerService: 2 },
      maxEntries: 2,
    });
    // svc-3 asks for three entries; svc-4, the youngest, finds no room left after svc-1 and svc-2.
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 UDP 53 -> 10.96.0.1', '192.0.2.2 UDP 53 -> 10.96.0.2']);
    expect(controller.status.servicesOverLimits).to.deep.equal({ tooManyEntries: 1, overCapacity: 1 });
    expect(controller.status.limits).to.deep.equal({ maxEntriesPerService: 2, maxEntries: 2 });
  });

  it('a partial write the kernel refuses falls back to a whole write of the family in the same sync', async () => {
    const { caches, driver, syncs } = await rig([service(1)]);
    driver.refuse = (ops) => (ops.some((op) => op.kind === 'elements') ? 'No such file or directory' : undefined);
    caches.set([service(1), service(2)]);
    const report = await syncs(2);
    expect(report.error).to.equal(undefined);
    expect(report.result).to.include({ mode: 'full', fallbackReason: 'partial-failed' });
    expect(driver.applied.at(-1)!.map((op) => op.kind)).to.deep.equal(['writeFamily']);
    expect(driver.held('ipv4')).to.have.length(2);
  });

  it('a failed sync is reported, and the next (full) sync writes what failed whole', async () => {
    const { controller, caches, driver, syncs } = await rig([service(1)]);
    driver.refuse = () => 'Cannot allocate memory';
    caches.set([service(1), service(2)]);
    const failed = await syncs(2);
    expect(failed.error?.message).to.match(/^nft sync failed: ipv4: .*Cannot allocate memory/);
    expect(controller.status.lastError).to.match(/Cannot allocate memory/);
    driver.refuse = undefined;
    const retried = await syncs(3);
    expect(retried.requested).to.equal('full');
    expect(retried.result).to.include({ mode: 'full' });
    expect(driver.held('ipv4')).to.have.length(2);
  });

  it('a full sync reads back, and repairs only what someone else changed', async () => {
    const { controller, driver, syncs } = await rig([service(1), service(2)]);
    const v4 = driver.kernel.get('ipv4')!;
    v4.elements.delete('ipv4|192.0.2.1|UDP|53');
    v4.elements.set('ipv4|203.0.113.9|TCP|80', {
      family: 'ipv4',
      externalIp: '203.0.113.9',
      protocol: 'TCP',
      port: 80,
      clusterIp: '10.1.1.1',
    });
    const reads = driver.reads;
    controller.setModelConfig(CONFIG, []);
    const repaired = await syncs(2);
    expect(repaired.requested).to.equal('full');
    expect(repaired.result).to.include({ mode: 'full', repairedElements: 2 });
    expect(driver.reads - reads, 'both families read back').to.equal(2);
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 UDP 53 -> 10.96.0.1', '192.0.2.2 UDP 53 -> 10.96.0.2']);
    const writes = driver.applied.at(-1)!;
    expect(writes).to.have.length(1);
    expect(writes[0]).to.include({ kind: 'elements' });
  });

  it('shows in the metrics how many entries the driver left out, as it leaves them out', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const rejected = async () => {
      const name = 'ipvs_node_controller_rejected_entries';
      const line = (await metrics.exposition()).text.split('\n').find((l) => l.startsWith(`${name} `));
      return line === undefined ? undefined : Number(line.split(' ')[1]);
    };
    const { caches, driver, syncs } = await rig([service(1), service(2, {}, 'UDP', [5353])], {
      rejects: (e) => (e.port === 5353 ? 'port 5353 is refused' : undefined),
      metrics,
    });
    expect(driver.held('ipv4')).to.deep.equal(['192.0.2.1 UDP 53 -> 10.96.0.1']);
    expect(await rejected()).to.equal(1);
    caches.set([service(1)]);
    await syncs(2);
    expect(await rejected()).to.equal(0);
    caches.set([service(1), service(3, {}, 'UDP', [5353]), service(4, {}, 'UDP', [5353])]);
    expect((await syncs(3)).result).to.include({ mode: 'partial' });
    expect(await rejected()).to.equal(2);
  });
});
