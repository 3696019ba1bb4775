#!/usr/bin/env node
// ipvs-node-controller: the command line (`check` is src/cli/check/). Usage errors (flags, files they
// name, no way to reach the API server) are one line and exit code 2, before anything else; runtime
// errors a user can meet (no kernel support, API unreachable for --dry-run) one line and exit 1.
// Exit 0 only after the job is done or a SIGTERM/SIGINT asked for the stop. The parts of a run are
// built and wired in one place, the composition root (compose.ts).

import { CommanderError } from 'commander';
import { accessSync, constants as fsConstants, existsSync, statSync } from 'node:fs';
import { homedir } from 'node:os';
import { delimiter, join } from 'node:path';
import { PROGRAM, createLogger, logFatal, writeStderr, type Logger } from '../log.js';
import { cleanupAll, dryRunCapacity, renderDryRun } from '../backends/registry.js';
import { entryLimit } from '../driver/driver.js';
import { backendSettings, runController } from './compose.js';
import { FatalError } from './fatal-error.js';
import { buildDesiredState } from '../model/desired-state.js';
import type { NodeInfo, ServiceInfo } from '../model/types.js';
import { parseConfig, UsageError, type Config } from '../config/options.js';
import { dryRunReport } from './dry-run-report.js';
import { toNodeInfo, toServiceInfo } from '../kube/objects.js';
import { buildInfo } from '../build-info/version.js';

/** Set when main() settled: an exit before that is a defect, reported by the last-resort guards. */
let settled = false;
/** The logger of the run, for the last-resort guards. */
let runLogger: Logger | undefined;

async function main(argv: string[]): Promise<number> {
  if (argv[0] === 'check') return (await import('./check/check-command.js')).checkCommand(argv.slice(1));
  let config: Config;
  try {
    config = parseConfig(argv);
    checkStartupInputs(config);
  } catch (err) {
    if (err instanceof CommanderError) return 0; // --help was shown
    if (err instanceof UsageError) return usageFailure(err);
    throw err;
  }
  const logger = createLogger({ level: config.logLevel, node: config.nodeName, format: config.logFormat });
  runLogger = logger;
  try {
    if (config.dryRun) return await dryRun(config);
    if (config.cleanup) return await cleanup(config, logger);
    return await run(config, logger);
  } catch (err) {
    if (err instanceof UsageError) return usageFailure(err);
    if (err instanceof FatalError) {
      // With --dry-run stdout carries the ruleset: no log line there.
      logFatal(config.dryRun ? undefined : logger, err);
      return 1;
    }
    throw err;
  }
}

/** The first log line of a run: which build runs on this node. */
function logVersion(logger: Logger): void {
  const { version, revision, nodeVersion, kernel, kernelVersion } = buildInfo();
  logger.info({ version, revision, nodeVersion, kernel, kernelVersion }, 'Version info');
}

function usageFailure(err: UsageError): number {
  writeStderr(`${PROGRAM}: ${err.message}\nRun '${PROGRAM} --help' for the flags.\n`);
  return 2;
}

/**
 * What must hold before anything is bound or probed: files named by flags are readable, and
 * there is a way to reach the API server when one is needed. Throws UsageError (exit 2).
 */
function checkStartupInputs(config: Config): void {
  const readable = (what: string, path: string) => {
    try {
      accessSync(path, fsConstants.R_OK);
      if (!statSync(path).isFile()) throw new Error('not a file');
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      const why = code === 'ENOENT' ? 'no such file' : code === 'EACCES' ? 'permission denied' : (err as Error).message;
      throw new UsageError(`${what}: cannot read ${path}: ${why}`);
    }
  };
  if (config.kubeconfig !== undefined) readable('--kubeconfig', config.kubeconfig);
  const needsApi = !config.cleanup && !(config.dryRun && config.fromFile !== undefined);
  if (!needsApi || config.kubeconfig !== undefined || process.env.KUBERNETES_SERVICE_HOST) return;
  const fromEnv = (process.env.KUBECONFIG ?? '').split(delimiter).filter((f) => f !== '');
  for (const file of fromEnv) readable('KUBECONFIG', file);
  if (fromEnv.length > 0) return;
  const home = process.env.HOME || homedir();
  // Else client-node falls back to http://localhost:8080 and fails later with a TLS message.
  if (!home || !existsSync(join(home, '.kube', 'config'))) {
    throw new UsageError(
      'no kubeconfig found (no --kubeconfig, KUBECONFIG unset, no ~/.kube/config) and no in-cluster ' +
        'configuration (KUBERNETES_SERVICE_HOST unset): pass --kubeconfig FILE or set KUBECONFIG, or run it in a pod',
    );
  }
}

async function loadForDryRun(config: Config): Promise<{ services: ServiceInfo[]; node?: NodeInfo }> {
  if (config.fromFile) {
    // Loaded here: the YAML parser is for --from-file alone, not for the running controller.
    const { readObjectsFile } = await import('./objects-file.js');
    let file;
    try {
      file = await readObjectsFile(config.fromFile);
    } catch (err) {
      throw new FatalError(`--from-file: ${(err as Error).message}`);
    }
    return { services: file.services, node: nodeFromFile(config, file.nodes) };
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

/**
 * The Node of this node in a --from-file input. Its pod CIDRs decide which sources are local
 * pods, so another node's must never stand in: a name that is not in the file is an error
 * (exit 1, as for any other problem of the file's content). Without --node-name (nor NODE_NAME),
 * a file with a single Node describes this node, and a file without Nodes gives none.
 */
function nodeFromFile(config: Config, nodes: NodeInfo[]): NodeInfo | undefined {
  const named = nodes.find((n) => n.name === config.nodeName);
  if (named) return named;
  if (!config.nodeNameGiven && nodes.length <= 1) return nodes[0];
  const has = nodes.length > 0 ? `it has ${nodes.map((n) => n.name).join(', ')}` : 'it has no Node objects';
  throw new FatalError(
    config.nodeNameGiven
      ? `--node-name ${config.nodeName}: no such Node in --from-file (${has})`
      : `--from-file: no Node named after this host (${config.nodeName}) and ${has}: pass --node-name`,
  );
}

async function dryRun(config: Config): Promise<number> {
  const { services, node } = await loadForDryRun(config);
  const { KubeProxyAwareness } = await import('../kubeproxy/awareness.js');
  const kubeProxy = await KubeProxyAwareness.lookOnce(config);
  const model = {
    ...kubeProxy.settings.model,
    maxEntries: entryLimit(dryRunCapacity(config.backend), config.maxEntries),
    // The eBPF backend cannot filter sources (its driver's filtersSources).
    sourceRangesSupported: config.backend !== 'ebpf',
  };
  const desired = buildDesiredState(services, node, model);
  // The report, then what the chosen backend would program: iptables-restore input, or nft text.
  const text =
    dryRunReport(config, { services, desired, kubeProxy }) +
    renderDryRun(config.backend, desired, backendSettings(config));
  // Wait for the write: stdout on a pipe is asynchronous and process.exit would cut it short.
  await new Promise<void>((resolve, reject) => process.stdout.write(text, (err) => (err ? reject(err) : resolve())));
  return 0;
}

// The Kubernetes client is loaded only when needed: it dominates start-up time (--help, --dry-run from a file).
async function kubeConfigOrFail(config: Config) {
  const { loadKubeConfig } = await import('../kube/cluster.js');
  try {
    return loadKubeConfig(config.kubeconfig);
  } catch (err) {
    // A kubeconfig named on the command line that does not work is a usage error, found before
    // any port is bound (run() loads it first).
    if (config.kubeconfig !== undefined) throw new UsageError(`--kubeconfig: ${(err as Error).message}`);
    throw new FatalError((err as Error).message);
  }
}

async function cleanup(config: Config, logger: Logger): Promise<number> {
  logVersion(logger);
  try {
    const removed = await cleanupAll(backendSettings(config));
    logger.info({ checked: removed }, 'Removed every object of ours');
  } catch (err) {
    throw new FatalError((err as Error).message);
  }
  return 0;
}

async function run(config: Config, logger: Logger): Promise<number> {
  const kc = await kubeConfigOrFail(config);
  logVersion(logger);
  // From here on a stop request is logged and honoured wherever the start has got to.
  // The listeners stay for the whole run. execa listens to these signals too while a child
  // runs (iptables-save, conntrack), to end its children with the process, and re-raises the
  // signal when it finds itself the only listener: with a listener that removed itself, a stop
  // that arrived during an iptables command killed the process instead of ending it with 0.
  const stopped = new Promise<void>((resolve) => {
    let stopping = false;
    const onSignal = (signal: NodeJS.Signals) => {
      if (stopping) {
        // Only a person sends a second one (the kubelet follows SIGTERM with SIGKILL): stop now.
        logger.warn({ signal }, 'Second stop request, exiting at once, the programmed rules stay in place');
        process.exit(1);
      }
      stopping = true;
      logger.info({ signal }, 'Stopping, the programmed rules stay in place');
      resolve();
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
  });
  // The informers wait for their retries on unref'd timers: without a handle of our own the
  // event loop could empty while the API server is unreachable and the process end with 0.
  const keepAlive = setInterval(() => undefined, 2 ** 31 - 1);
  try {
    // Metrics, health endpoints and Events (src/operations/).
    const { Operations } = await import('../operations/operations.js');
    const operations = await Operations.start(config, logger).catch((err: Error) => {
      throw new FatalError(err.message);
    });
    try {
      return await runController(config, logger, operations, kc, stopped);
    } finally {
      await operations.close();
    }
  } finally {
    clearInterval(keepAlive);
  }
}

// A closed stdout or stderr (a log reader gone) must not crash the run: the logs are lost, the
// job goes on.
process.stdout.on('error', () => undefined);
process.stderr.on('error', () => undefined);
// Last resorts: a run must never end without saying why, nor with 0 unless asked to stop.
process.on('beforeExit', () => {
  if (settled) return;
  logFatal(runLogger, new Error('the run ended without a stop request (nothing left to wait for)'), true);
  process.exit(1);
});
process.on('uncaughtException', (err) => {
  logFatal(runLogger, err, true);
  process.exit(1);
});

main(process.argv.slice(2)).then(
  (code) => {
    settled = true;
    process.exit(code);
  },
  (err: unknown) => {
    settled = true;
    logFatal(runLogger, err, true);
    process.exit(1);
  },
);
