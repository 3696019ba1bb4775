// The composition root, in one file: the parts of a run built and wired once, at start. The
// registry (src/backends/registry.ts) chooses and probes the driver; the reconciler is put over
// it with its subscribers (the conntrack clean-up where the driver's translations are NAT
// decisions conntrack keeps); the informers, kube-proxy's awareness and the controller that runs
// syncs through them. The backends and the reconciler know nothing of each other (both import
// only the contract, src/driver/): here they are put together. main.ts parses the command line
// and decides the exit; tests and benches build the reconciler through composeReconciler.

import type { KubeConfig } from '@kubernetes/client-node';
import { ConntrackCleaner, type ConntrackCleanupReport } from '../conntrack/conntrack-cleaner.js';
import { loadConntrackNetlink } from '../conntrack/conntrack-netlink.js';
import { ConntrackSubscriber, type ConntrackClient } from '../conntrack/conntrack-subscriber.js';
import type { Driver, BackendDescription } from '../driver/driver.js';
import { Reconciler } from '../reconciler/reconciler.js';
import { removeLeftovers, selectBackend, type BackendSettings, type SelectedBackend } from '../backends/registry.js';
import { Controller } from '../controller/controller.js';
import type { Config } from '../config/options.js';
import { formatDuration } from '../config/duration.js';
import type { Operations } from '../operations/operations.js';
import { describeSettings } from '../kubeproxy/config.js';
import { buildInfo } from '../build-info/version.js';
import { InterfaceAddressWatch } from '../node/interface-addresses.js';
import type { Logger } from '../log.js';
import { FatalError } from './fatal-error.js';
import { collectEverything, leaveOptimisingCompilersOut } from './v8-settings.js';
import { releaseFilePages } from './file-pages.js';

export interface ReconcilerWiring {
  logger: Logger;
  /** Told of every conntrack clean-up (the metrics). */
  onConntrackCleanup?: (report: ConntrackCleanupReport) => void;
  /**
   * The conntrack client. Default: ctnetlink in the process (the conntrack addon), else the
   * conntrack command, where the driver's translations are conntrack's
   * (capabilities.translates 'packets': not eBPF's, which translates sockets); null: none.
   */
  conntrack?: ConntrackClient | null;
}

/** The reconciler that programs through `driver`, its subscribers given. */
export function composeReconciler(driver: Driver, wiring: ReconcilerWiring): Reconciler {
  const conntrack =
    wiring.conntrack === undefined
      ? driver.capabilities.translates === 'packets'
        ? new ConntrackCleaner({ logger: wiring.logger, netlink: loadConntrackNetlink().netlink })
        : undefined
      : (wiring.conntrack ?? undefined);
  return new Reconciler(driver, conntrack ? [new ConntrackSubscriber(conntrack, wiring.onConntrackCleanup)] : []);
}

/** What the backends take from the configuration. */
export function backendSettings(config: Config, logger?: Logger): BackendSettings {
  return {
    nftExecutor: config.nftExecutor,
    nftKeyLookup: config.nftKeyLookup,
    iptablesComments: config.iptablesComments,
    cgroupPath: config.cgroupPath,
    bpffsPath: config.bpffsPath,
    logger,
  };
}

async function createBackend(config: Config, logger: Logger): Promise<SelectedBackend> {
  let selected;
  try {
    selected = await selectBackend(config.backend, backendSettings(config, logger));
  } catch (err) {
    throw new FatalError((err as Error).message);
  }
  logger.info({ backend: selected.driver.name, reason: selected.reason, probe: selected.probe }, 'Backend selected');
  return selected;
}

/**
 * After the first successful sync: remove what other backends left, so a node never carries two.
 * A failure is the controller's to retry and report.
 */
async function removeOtherBackends(config: Config, backend: BackendDescription, logger: Logger): Promise<void> {
  const checked = await removeLeftovers(backend, backendSettings(config));
  logger.debug({ checked }, 'Removed leftovers of other backends');
}

/**
 * A run of the controller: the backend chosen, the parts built and wired, the controller run
 * until `stopped`, then stopped in order (no write begins once it is told). 0 once stopped.
 */
export async function runController(
  config: Config,
  logger: Logger,
  operations: Operations,
  kc: KubeConfig,
  stopped: Promise<void>,
): Promise<number> {
  const { driver, description } = await createBackend(config, logger);
  operations.describeBackend(description, driver.translatedConnections.bind(driver));
  const { createClusterCaches } = await import('../kube/cluster.js');
  let controller: Controller | undefined;
  const caches = createClusterCaches(
    kc,
    config.nodeName,
    operations.informerObserver({
      onError: (resource, err, retryInMs) =>
        logger.warn({ resource, retryInMs, err }, 'Failed to list and watch, keeping the last rules'),
      onWatchListUnavailable: (resource, why) =>
        logger.info(
          { resource, why },
          'The API server offers no WatchList stream, starting from lists served by its watch cache',
        ),
      onDecodeError: (resource, problem, firstOnStream) => {
        // Once per watch stream: a broken proxy can send many; the metric counts them all.
        if (firstOnStream) logger.warn({ resource, problem }, 'Skipped a watch line that is not a watch event');
      },
    }),
    { minWatchTimeoutMs: config.minWatchTimeoutMs },
  );
  // kube-proxy's settings and mode, read before the first sync so that it never programs against them.
  const { KubeProxyAwareness } = await import('../kubeproxy/awareness.js');
  const kubeProxy = await KubeProxyAwareness.start(config, logger, {
    onSettings: (settings) => controller?.setModelConfig(settings.model, describeSettings(settings)),
    onMode: (verdict) => controller?.onKubeProxyMode(verdict),
  });
  const observer = operations.controllerObserver(kc, caches.services);
  // The composition: the reconciler over the chosen driver, the conntrack clean-up among its subscribers.
  const reconciler = composeReconciler(driver, {
    logger,
    onConntrackCleanup: (report) => observer.onConntrackCleanup?.(report),
  });
  const interfaces = new InterfaceAddressWatch();
  controller = new Controller({
    observer,
    caches,
    reconciler,
    model: kubeProxy.settings.model,
    kubeProxyStepAside: config.kubeProxyStepAside,
    kubeProxyMode: kubeProxy.mode,
    kubeProxySettings: kubeProxy.describe(),
    nodeName: config.nodeName,
    maxEntries: config.maxEntries,
    interfaceAddresses: () => interfaces.current(),
    compactMemory: async () => {
      collectEverything();
      await releaseFilePages(logger);
    },
    minSyncPeriodMs: config.minSyncPeriodMs,
    syncPeriodMs: config.syncPeriodMs,
    logger,
    removeLeftovers: () => removeOtherBackends(config, description, logger),
  });
  operations.attach(controller);
  logger.info(
    {
      backend: driver.name,
      kernel: buildInfo().kernel,
      detectLocalMode: kubeProxy.settings.model.detectLocalMode,
      kubeProxyMode: kubeProxy.mode.mode,
      kubeProxyVersion: kubeProxy.mode.version ?? 'unknown',
      minSyncPeriod: formatDuration(config.minSyncPeriodMs),
      syncPeriod: formatDuration(config.syncPeriodMs),
      ...controller.status.limits,
      serviceExternalIpRange: kubeProxy.settings.model.externalIpRanges?.join(',') ?? 'any',
      serviceClusterIpRange: kubeProxy.settings.model.serviceCidrs?.join(',') ?? 'none',
      nodeAddressRanges: kubeProxy.settings.model.nodeAddressRanges?.join(',') ?? 'none',
    },
    'Starting',
  );
  interfaces.start(() => controller?.nodeAddressesChanged());
  // Every module of the run is loaded by now, and the first list is read next (v8-settings.ts).
  leaveOptimisingCompilersOut();
  await Promise.race([controller.start(), stopped]);
  await stopped;
  // The controller first: once it is told, no write begins (a sync deriving its state drops it).
  interfaces.stop();
  await controller.stop();
  await kubeProxy.stop();
  await reconciler.close();
  return 0;
}
