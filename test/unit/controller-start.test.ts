// What a start writes (docs/semantics.md, "What a start writes"), with the controller's loop on the
// API stand-in (real wire protocol, real client library) and the reconciler over a fake driver:
// - the first write holds the state of the whole list (or WatchList stream), both families in one
//   write, however many Services were created while no controller ran, on every read path;
// - what it cannot hold: Services newer than the list, as a lagging watch cache serves it at
//   resourceVersion=0, come by the watch, in a later write;
// - a stop asked for before the first write has begun leaves the kernel as it was: the state being
//   derived is dropped (a controller told to stop, or whose launcher was killed, wrote it after
//   the stop, perhaps after its successor's first write).

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { pino } from 'pino';
import { Controller, type ControllerOptions, type SyncReport } from '../../src/controller/controller.js';
import type { DriverOperation } from '../../src/driver/driver.js';
import { createClusterCaches, loadKubeConfig } from '../../src/kube/cluster.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { ApiStandIn, type ApiStandInOptions } from '../../testbed/api-server.js';
import { FakeDriver } from '../doubles/fake-driver.js';
import { wireLbService, wireNode } from '../support/wire-objects.js';
import { CONFIG } from '../support/fixtures.js';
import { waitFor as waitUntil } from '../support/eventually.js';

const NODE_NAME = 'node-1';
const NODE = wireNode(['10.244.1.0/24'], { name: NODE_NAME });
/** More than a list page (PAGE_SIZE, 500), within the fake driver's capacity (1,000 entries). */
const N = 600;

function lbService(i: number): Record<string, unknown> {
  return wireLbService(`svc-${i}`, `10.96.${i >> 8}.${i & 255}`, `198.18.${i >> 8}.${i & 255}`);
}

/** The entries a write asked the kernel to hold, per family, as `externalIp` (whole writes only). */
function written(operations: readonly DriverOperation[]): Record<string, string[]> {
  const out: Record<string, string[]> = {};
  for (const op of operations) {
    if (op.kind === 'writeFamily' || op.kind === 'replaceFamily') {
      out[op.family] = op.state.entries.map((e) => e.externalIp).sort();
    }
  }
  return out;
}

const waitFor = (cond: () => boolean, what: string, ms = 20_000) => waitUntil(cond, what, ms, 5);

describe('what a start writes (controller on the API stand-in, fake driver)', function () {
  this.timeout(60_000);
  let api: ApiStandIn | undefined;
  let controller: Controller | undefined;
  let dir: string | undefined;

  afterEach(async () => {
    await controller?.stop();
    await api?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
    controller = api = dir = undefined;
  });

  /** The stand-in with the node and `services`; the controller built, not started. */
  async function rig(
    services: Array<Record<string, unknown>>,
    apiOptions: ApiStandInOptions = {},
    options: Partial<ControllerOptions> = {},
  ): Promise<{ api: ApiStandIn; controller: Controller; driver: FakeDriver; reports: SyncReport[] }> {
    api = await ApiStandIn.start({ bookmarkIntervalMs: 200, ...apiOptions });
    dir = mkdtempSync(join(tmpdir(), 'controller-start-'));
    await api.writeKubeconfig(join(dir, 'kubeconfig'));
    api.apply(NODE);
    for (const service of services) api.apply(service);
    const driver = new FakeDriver();
    const reports: SyncReport[] = [];
    controller = new Controller({
      caches: createClusterCaches(loadKubeConfig(join(dir, 'kubeconfig')), NODE_NAME),
      reconciler: new Reconciler(driver),
      model: CONFIG,
      nodeName: NODE_NAME,
      minSyncPeriodMs: 0,
      syncPeriodMs: 3_600_000,
      logger: pino({ enabled: false }),
      observer: { onSync: (report) => reports.push(report) },
      ...options,
    });
    return { api, controller, driver, reports };
  }

  const paths: Array<[string, ApiStandInOptions]> = [
    ['a WatchList stream (1.34)', {}],
    ['a list at resourceVersion=0 (1.26: no WatchList)', { serverVersion: '1.26' }],
  ];
  for (const [path, apiOptions] of paths) {
    it(`writes the whole state at once, both families in one write, from ${path}`, async () => {
      // The Services of a previous run, and two created while no controller ran.
      const services = Array.from({ length: N + 2 }, (_, i) => lbService(i));
      const r = await rig(services, apiOptions);
      await r.controller.start();
      await waitFor(() => r.reports.length >= 1, 'the first sync');
      await sleep(300);
      expect(r.reports.map((report) => report.result?.mode)).to.deep.equal(['full']);
      expect(r.driver.applied, 'one write').to.have.length(1);
      const first = written(r.driver.applied[0]!);
      expect(Object.keys(first).sort(), 'both families in it').to.deep.equal(['ipv4', 'ipv6']);
      expect(first.ipv4, 'every Service of the list').to.have.length(N + 2);
      expect(r.driver.held('ipv4')).to.have.length(N + 2);
    });
  }

  it('cannot hold Services newer than a list a lagging watch cache serves: they come by the watch, a later write', async () => {
    const r = await rig(
      Array.from({ length: N }, (_, i) => lbService(i)),
      { serverVersion: '1.26' },
    );
    // The cache the start's list (resourceVersion=0) reaches is behind etcd by one Service.
    r.api.lagWatchCache();
    r.api.apply(lbService(N));
    await r.controller.start();
    await waitFor(() => r.reports.length >= 1, 'the first sync');
    expect(
      written(r.driver.applied[0]!).ipv4,
      "the first write: the whole list, at the cache's version",
    ).to.have.length(N);
    r.api.catchUpWatchCache();
    await waitFor(() => r.reports.length >= 2, 'the sync of the Service the watch brought');
    expect(r.driver.applied, 'two writes').to.have.length(2);
    const [second] = r.driver.applied[1]!;
    expect(second?.kind).to.equal('elements');
    expect(second?.kind === 'elements' && second.add.map((e) => e.externalIp)).to.deep.equal([
      `198.18.${N >> 8}.${N & 255}`,
    ]);
    expect(r.driver.held('ipv4')).to.have.length(N + 1);
  });

  it('writes nothing when stopped while its first sync derives the state (the state is dropped)', async () => {
    let stopped: Promise<void> | undefined;
    const r = await rig(
      Array.from({ length: N }, (_, i) => lbService(i)),
      {},
      {
        // Asked at the start of every sync, before the state is derived: the stop comes there.
        interfaceAddresses: () => {
          stopped ??= controller!.stop();
          return [];
        },
      },
    );
    await r.controller.start();
    await waitFor(() => stopped !== undefined, 'the first sync');
    await stopped;
    expect(r.driver.applied.length, 'writes after the stop').to.equal(0);
    expect(r.reports.length, 'syncs reported').to.equal(0);
    expect(r.controller.status.lastSuccessfulSyncAt).to.equal(undefined);
  });

  it('writes nothing when stopped before its caches synced, even once the state could arrive', async () => {
    const r = await rig(Array.from({ length: 10 }, (_, i) => lbService(i)));
    r.api.setUnavailable(true);
    const started = r.controller.start();
    await sleep(100);
    await r.controller.stop();
    r.api.setUnavailable(false);
    await Promise.race([started, sleep(1500)]);
    expect(r.driver.applied.length, 'writes').to.equal(0);
    expect(r.controller.status.cachesSynced).to.equal(false);
  });
});
