// The controller's loop in this process (src/controller/controller.ts, given one reconciler) against the API
// stand-in: the set-up of the kernel tests that change Services through the API and watch what a
// backend does between syncs. The sync period is 60 s, so only changes and the backend's own
// checks reach the kernel while a test runs; the log is off.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pino } from 'pino';
import { Controller, type ControllerOptions } from '../../src/controller/controller.js';
import { createClusterCaches, loadKubeConfig } from '../../src/kube/cluster.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { CONFIG } from './fixtures.js';
import { wireNode } from './wire-objects.js';

const NODE_NAME = 'node-1';
const POD_CIDR = '10.244.1.0/24';

export class ControllerOnStandIn {
  private constructor(
    readonly api: ApiStandIn,
    readonly controller: Controller,
    private readonly dir: string,
  ) {}

  /**
   * Starts the API stand-in with node-1 (pod CIDR 10.244.1.0/24) and `services`, then the
   * controller on `reconciler` against it; `options` adds to or replaces the controller's options.
   * Resolves once the controller started (its first sync done). Stopping the reconciler is the caller's.
   */
  static async start(
    reconciler: ControllerOptions['reconciler'],
    services: object[],
    options: Partial<ControllerOptions> = {},
  ): Promise<ControllerOnStandIn> {
    const dir = mkdtempSync(join(tmpdir(), 'controller-on-stand-in-'));
    const api = await ApiStandIn.start({ bookmarkIntervalMs: 500 });
    let controller: Controller | undefined;
    try {
      await api.writeKubeconfig(join(dir, 'kubeconfig'));
      api.apply(wireNode([POD_CIDR], { name: NODE_NAME }));
      for (const service of services) api.apply(service);
      controller = new Controller({
        caches: createClusterCaches(loadKubeConfig(join(dir, 'kubeconfig')), NODE_NAME),
        reconciler,
        model: CONFIG,
        nodeName: NODE_NAME,
        minSyncPeriodMs: 0,
        syncPeriodMs: 60_000,
        logger: pino({ enabled: false }),
        ...options,
      });
      await controller.start();
      return new ControllerOnStandIn(api, controller, dir);
    } catch (err) {
      await controller?.stop();
      await api.stop();
      rmSync(dir, { recursive: true, force: true });
      throw err;
    }
  }

  /** Stops the controller and the stand-in; the backend is left as it is. */
  async stop(): Promise<void> {
    try {
      await this.controller.stop();
    } finally {
      await this.api.stop();
      rmSync(this.dir, { recursive: true, force: true });
    }
  }
}
