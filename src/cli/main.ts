#!/usr/bin/env node
// ipvs-node-controller: the command line. Usage errors are one line and exit code 2;
// runtime errors a user can meet (no kernel support, API unreachable at start) one line and exit 1.

import { CommanderError } from 'commander';
import { pino, type Logger } from 'pino';
import { renderDesiredStateText } from '../backends/nft/render.js';
import { renderDesiredStateRestoreText } from '../backends/iptables/render.js';
import { IptablesBackend } from '../backends/iptables/iptables-backend.js';
import { EbpfBackend, defaultCgroupPath } from '../backends/ebpf/ebpf-backend.js';
import { cleanupAll, removeLeftovers, selectBackend, type LeftoverCleanup } from '../backends/select.js';
import type { Backend } from '../backends/backend.js';
import { Controller } from '../controller.js';
import { buildDesiredState } from '../model/desired-state.js';
import type { DesiredState, NodeInfo, ServiceInfo } from '../model/types.js';
import { parseConfig, UsageError, type Config } from '../config/options.js';
import { formatDuration } from '../config/duration.js';
import { readObjectsFile } from './objects-file.js';
import { toNodeInfo, toServiceInfo } from '../kube/objects.js';
import type { Operations } from '../metrics/operations.js';

const PROGRAM = 'ipvs-node-controller';

/** An error with a message meant for the user as it is. */
class FatalError extends Error {}

async function main(argv: string[]): Promise<number> {
  let config: Config;
  try {
    config = parseConfig(argv);
  } catch (err) {
    if (err instanceof CommanderError) return 0; // --help was shown
    if (err instanceof UsageError) {
      process.stderr.write(`${PROGRAM}: ${err.message}\nRun '${PROGRAM} --help' for the flags.\n`);
      return 2;
    }
    throw err;
  }
  const logger = pino({ name: PROGRAM, level: config.logLevel, base: { node: config.nodeName } });
  try {
    if (config.dryRun) return await dryRun(config);
    if (config.cleanup) return await cleanup(config, logger);
    return await run(config, logger);
  } catch (err) {
    if (err instanceof FatalError) {
      process.stderr.write(`${PROGRAM}: ${err.message}\n`);
      return 1;
    }
    throw err;
  }
}

async function loadForDryRun(config: Config): Promise<{ services: ServiceInfo[]; node?: NodeInfo }> {
  if (config.fromFile) {
    let file;
    try {
      file = await readObjectsFile(config.fromFile);
    } catch (err) {
      throw new FatalError(`--from-file: ${(err as Error).message}`);
    }
    // Without --node-name, a file with a single Node describes this node.
    const node =
      file.nodes.find((n) => n.name === config.nodeName) ?? (file.nodes.length === 1 ? file.nodes[0] : undefined);
    return { services: file.services, node };
  }
  const kc = await kubeConfigOrFail(config);
  const { listAllJson } = await import('../kube/cluster.js');
  try {
    const services = await listAllJson(kc, '/api/v1/services', {}, toServiceInfo);
    const nodes = await listAllJson(
      kc,
      '/api/v1/nodes',
      { fieldSelector: `metadata.name=${config.nodeName}` },
      toNodeInfo,
    );
    return { services, node: nodes[0] };
  } catch (err) {
    throw new FatalError(`cannot list Services from the API server: ${(err as Error).message}`);
  }
}

async function dryRun(config: Config): Promise<number> {
  const { services, node } = await loadForDryRun(config);
  const desired = buildDesiredState(services, node, config.model);
  // Wait for the write: stdout on a pipe is asynchronous and process.exit would cut it short.
  // iptables-restore input for --backend=iptables; nft text otherwise (the eBPF maps hold the same entries).
  const ruleset =
    config.backend === 'iptables'
      ? renderDesiredStateRestoreText(desired, { useKubeMarkMasq: true })
      : renderDesiredStateText(desired);
  const text = describeDesiredState(desired, services.length) + ruleset;
  await new Promise<void>((resolve, reject) => process.stdout.write(text, (err) => (err ? reject(err) : resolve())));
  return 0;
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

// The Kubernetes client is loaded only when needed: it dominates start-up time (--help, --dry-run from a file).
async function kubeConfigOrFail(config: Config) {
  const { loadKubeConfig } = await import('../kube/cluster.js');
  try {
    return loadKubeConfig(config.kubeconfig);
  } catch (err) {
    throw new FatalError((err as Error).message);
  }
}

function ebpfOptions(config: Config) {
  return { cgroupPath: config.cgroupPath ?? defaultCgroupPath() ?? '/sys/fs/cgroup', bpffsPath: config.bpffsPath };
}

/** The eBPF backend's cleanup, for leftovers at start and for --cleanup. */
function ebpfCleanup(config: Config): LeftoverCleanup {
  return {
    backend: 'ebpf',
    description: `eBPF programs and maps pinned under ${config.bpffsPath}`,
    cleanup: () => new EbpfBackend(ebpfOptions(config)).cleanup(),
  };
}

async function createBackend(config: Config, logger: Logger): Promise<Backend> {
  let selected;
  try {
    selected = await selectBackend(config.backend, {
      nftExecutor: config.nftExecutor,
      ebpf: () => {
        if (!config.cgroupPath && !defaultCgroupPath()) {
          throw new FatalError('no cgroup v2 mount in /proc/mounts: mount cgroup2 or pass --cgroup-path');
        }
        return new EbpfBackend(ebpfOptions(config));
      },
    });
  } catch (err) {
    throw new FatalError((err as Error).message);
  }
  logger.info({ backend: selected.backend.name }, selected.reason);
  const probe = await selected.backend.probe();
  if (!probe.ok) throw new FatalError(probe.detail);
  return selected.backend;
}

async function cleanup(config: Config, logger: Logger): Promise<number> {
  try {
    const removed = await cleanupAll([ebpfCleanup(config)]);
    logger.info({ checked: removed }, 'removed every object of ours');
  } catch (err) {
    throw new FatalError((err as Error).message);
  }
  return 0;
}

/** After the first successful sync: remove what other backends left, so a node never carries two. */
async function removeOtherBackends(config: Config, backend: Backend, logger: Logger): Promise<void> {
  try {
    const checked = await removeLeftovers(backend.name, {
      iptablesVariant: backend instanceof IptablesBackend ? backend.variant : undefined,
      extraCleanups: [ebpfCleanup(config)],
    });
    logger.debug({ checked }, 'no leftovers of other backends remain');
  } catch (err) {
    logger.warn(`could not remove leftovers of other backends: ${(err as Error).message}`);
  }
}

async function run(config: Config, logger: Logger): Promise<number> {
  // Metrics, health endpoints and Events (src/metrics/operations.ts).
  const { Operations } = await import('../metrics/operations.js');
  const operations = await Operations.start(config, logger).catch((err: Error) => {
    throw new FatalError(err.message);
  });
  try {
    return await runController(config, logger, operations);
  } finally {
    await operations.close();
  }
}

async function runController(config: Config, logger: Logger, operations: Operations): Promise<number> {
  const backend = await createBackend(config, logger);
  operations.describeBackend(backend);
  const kc = await kubeConfigOrFail(config);
  const { createClusterCaches } = await import('../kube/cluster.js');
  let controller: Controller | undefined;
  const caches = createClusterCaches(
    kc,
    config.nodeName,
    () => controller?.onCacheChange(),
    operations.informerObserver({
      onError: (resource, err, retryInMs) =>
        logger.warn({ resource, retryInMs }, `cannot list/watch ${resource}, keeping the last rules: ${err.message}`),
      onDecodeError: (resource, problem, firstOnStream) => {
        // Once per watch stream: a broken proxy can send many; the metric counts them all.
        if (firstOnStream) logger.warn({ resource, problem }, 'skipped a watch line that is not a watch event');
      },
    }),
    { minWatchTimeoutMs: config.minWatchTimeoutMs },
  );
  controller = new Controller({
    observer: operations.controllerObserver(kc, caches.services),
    caches,
    backend,
    model: config.model,
    nodeName: config.nodeName,
    minSyncPeriodMs: config.minSyncPeriodMs,
    syncPeriodMs: config.syncPeriodMs,
    logger,
    afterFirstSync: () => removeOtherBackends(config, backend, logger),
  });
  operations.attach(controller);
  logger.info(
    {
      backend: backend.name,
      detectLocalMode: config.model.detectLocalMode,
      minSyncPeriod: formatDuration(config.minSyncPeriodMs),
      syncPeriod: formatDuration(config.syncPeriodMs),
    },
    'starting',
  );
  const stopped = new Promise<void>((resolve) => {
    const onSignal = (signal: string) => {
      logger.info({ signal }, 'stopping; the programmed rules stay in place');
      resolve();
    };
    process.once('SIGTERM', onSignal);
    process.once('SIGINT', onSignal);
  });
  await Promise.race([controller.start(), stopped]);
  await stopped;
  await controller.stop();
  await backend.close?.();
  return 0;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`${PROGRAM}: unexpected error: ${(err as Error)?.stack ?? String(err)}\n`);
    process.exit(1);
  },
);
