// One tenant's large Service (measure 'one-service'): the controller runs as shipped, programming
// one small neighbour Service; then a Service of A external IPs x P ports (A x P entries) is
// written into the API stand-in. Measured per backend and size:
//   - API write -> the 'synced' line whose entries include it (programmed), or -> its skip line
//     (refused: over a limit);
//   - /healthz polled every 100 ms with the DaemonSet probe's 3 s timeout: the slowest answer and
//     how many polls failed, from the write until the next Service is programmed;
//   - API write of one more small Service afterwards -> programmed (it must not wait long);
//   - the resident memory peak (VmHWM, reset before the write) and the resident memory after.
// With --max-entries-per-service raised above the size, and for nft --max-entries too, so that
// the entries are programmed; iptables and ebpf keep the totals they can hold (20,000: every new
// connection walks the rules; 65,536: the maps' size), so larger Services are refused there. A
// bundle that has no such flags (an earlier build, IPVS_NODE_CONTROLLER_BUNDLE) runs without them.

import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { request } from 'node:http';
import { BUNDLE } from '../testbed/shipped-controller.js';
import { Controller, MiB, cleanupRules, type BenchBackend } from './controller.js';
import { NODE_NAME, log, type ServedCluster } from './services.js';

/** The shapes measured: external IPs x ports, for 10,000, 50,000 and 100,000 entries. */
export const ONE_SERVICE_SHAPES: ReadonlyArray<readonly [number, number]> = [
  [100, 100],
  [250, 200],
  [400, 250],
];

const HEALTHZ_PORT = 19478;
const POLL_MS = 100;
const PROBE_TIMEOUT_MS = 3000;

export interface OneServiceRun {
  backend: BenchBackend;
  addresses: number;
  ports: number;
  /** Of the Service object as the API serves it (JSON). */
  objectKiB: number;
  outcome: 'programmed' | 'refused' | 'timed out';
  /** API write -> 'synced' line with its entries, or -> its skip line. */
  answeredMs?: number;
  /** The skip reason, when refused. */
  reason?: string;
  /** The sync that programmed it, its own duration. */
  syncMs?: number;
  healthzPolls: number;
  healthzFailures: number;
  healthzMaxMs: number;
  /** API write of one more small Service after it -> programmed. */
  nextServiceMs?: number;
  peakRssMiB: number;
  rssAfterMiB: number;
  /** After a full garbage collection: resident memory, and the JS heap in use. */
  rssAfterGcMiB: number;
  heapUsedMiB: number;
  error?: string;
}

/** A ClusterIP Service with `addresses` external IPs (198.19.0.0/16) and `ports` TCP ports. */
export function bigService(addresses: number, ports: number): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: 'tenant', name: 'big', creationTimestamp: '2025-01-01T00:00:00Z', uid: 'big-uid' },
    spec: {
      type: 'ClusterIP',
      clusterIP: '10.100.0.10',
      clusterIPs: ['10.100.0.10'],
      externalIPs: Array.from({ length: addresses }, (_, i) => `198.19.${(i >> 8) & 255}.${i & 255}`),
      ports: Array.from({ length: ports }, (_, i) => ({ name: `p${i}`, protocol: 'TCP', port: 1024 + i })),
    },
  };
}

/** Whether the bundle knows the limit flags (an earlier build does not). */
function bundleHasLimits(): boolean {
  const help = spawnSync(process.execPath, [BUNDLE, '--help'], { encoding: 'utf8' });
  return help.stdout.includes('--max-entries-per-service');
}

/** GET /healthz; resolves with the time it took, or rejects after the probe timeout. */
function pollHealthz(): Promise<number> {
  const started = performance.now();
  return new Promise((resolve, reject) => {
    const req = request(
      { host: '127.0.0.1', port: HEALTHZ_PORT, path: '/healthz', timeout: PROBE_TIMEOUT_MS },
      (res) => {
        res.resume();
        res.on('end', () =>
          res.statusCode === 200 ? resolve(performance.now() - started) : reject(new Error(`status ${res.statusCode}`)),
        );
      },
    );
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

class HealthzPoller {
  polls = 0;
  failures = 0;
  maxMs = 0;
  private timer: NodeJS.Timeout | undefined;
  private readonly inFlight = new Set<Promise<void>>();

  start(): void {
    this.timer = setInterval(() => {
      const p = pollHealthz().then(
        (ms) => {
          this.polls++;
          this.maxMs = Math.max(this.maxMs, ms);
        },
        () => {
          this.polls++;
          this.failures++;
          this.maxMs = Math.max(this.maxMs, PROBE_TIMEOUT_MS);
        },
      );
      this.inFlight.add(p);
      void p.finally(() => this.inFlight.delete(p));
    }, POLL_MS);
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    await Promise.all(this.inFlight);
  }
}

/** Runs every shape on `backend`. Never throws for the controller's failure: the run says it. */
export async function measureOneService(
  cluster: ServedCluster,
  backend: BenchBackend,
  extraArgs: string[],
  cleanupArgs: string[],
): Promise<OneServiceRun[]> {
  const limits = bundleHasLimits()
    ? ['--max-entries-per-service=200000', ...(backend === 'nft' ? ['--max-entries=300000'] : [])]
    : [];
  const runs: OneServiceRun[] = [];
  for (const [addresses, ports] of ONE_SERVICE_SHAPES) {
    log(`one Service of ${addresses} x ${ports} entries, ${backend}`);
    const object = bigService(addresses, ports);
    const run: OneServiceRun = {
      backend,
      addresses,
      ports,
      objectKiB: Buffer.byteLength(JSON.stringify(object)) / 1024,
      outcome: 'timed out',
      healthzPolls: 0,
      healthzFailures: 0,
      healthzMaxMs: 0,
      peakRssMiB: NaN,
      rssAfterMiB: NaN,
      rssAfterGcMiB: NaN,
      heapUsedMiB: NaN,
    };
    const flags = { kubeconfig: cluster.kubeconfig, nodeName: NODE_NAME, backend, syncPeriod: '30s' };
    try {
      cleanupRules({ ...flags, extraArgs: cleanupArgs });
    } catch (err) {
      run.error = `before: ${(err as Error).message}`;
      runs.push(run);
      continue;
    }
    cluster.serve(1);
    const c = Controller.start({
      ...flags,
      extraArgs: [...extraArgs, ...limits, `--healthz-bind-address=127.0.0.1:${HEALTHZ_PORT}`],
    });
    const poller = new HealthzPoller();
    try {
      await c.waitForSyncs('full', 1, 60_000);
      const entriesBefore = c.syncs.at(-1)!.entries;
      writeFileSync(`/proc/${c.pid}/clear_refs`, '5'); // resets VmHWM
      poller.start();
      const written = performance.now();
      cluster.standIn.apply(object);
      const size = addresses * ports;
      await c.waitFor(
        'the big Service programmed or refused',
        () => c.syncs.some((s) => s.seenAt > written && s.entries >= entriesBefore + size) || c.skipLines.length > 0,
        300_000,
      );
      const synced = c.syncs.find((s) => s.seenAt > written && s.entries >= entriesBefore + size);
      if (synced) {
        run.outcome = 'programmed';
        run.answeredMs = synced.seenAt - written;
        run.syncMs = synced.ms;
      } else {
        const skip = c.skipLines[0]!;
        run.outcome = 'refused';
        run.reason = String(skip.reason);
        run.answeredMs = skip.seenAt - written;
      }
      const programmed = synced?.entries ?? entriesBefore;
      const next = performance.now();
      cluster.serve(2);
      await c.waitFor(
        'the next Service programmed',
        () => c.syncs.some((s) => s.seenAt > next && s.entries >= programmed + 1),
        300_000,
      );
      run.nextServiceMs = c.syncs.find((s) => s.seenAt > next && s.entries >= programmed + 1)!.seenAt - next;
      await poller.stop();
      const resident = c.residentMemory();
      run.peakRssMiB = resident.peakRssBytes / MiB;
      run.rssAfterMiB = resident.rssBytes / MiB;
      const collected = await c.collectGarbage();
      run.heapUsedMiB = collected.heapUsedBytes / MiB;
      run.rssAfterGcMiB = collected.rssBytes / MiB;
    } catch (err) {
      run.error = (err as Error).message;
    } finally {
      await poller.stop();
      run.healthzPolls = poller.polls;
      run.healthzFailures = poller.failures;
      run.healthzMaxMs = poller.maxMs;
      await c.stop();
      cluster.standIn.remove('Service', 'tenant', 'big');
      try {
        cleanupRules({ ...flags, extraArgs: cleanupArgs });
      } catch (err) {
        run.error = `${run.error ? `${run.error}; ` : ''}cleanup: ${(err as Error).message}`;
      }
    }
    runs.push(run);
  }
  return runs;
}
