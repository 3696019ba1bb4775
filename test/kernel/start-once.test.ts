// A start under a fault suite that SIGKILLs the controller around its first sync, on the kernel:
// the shipped controller (the launcher, bin/ipvs-node-controller.mjs, as package.json's bin runs
// it) against the API stand-in, with --backend=nft, the map read by netlink dumps every 30 ms.
//
// A launcher killed once its child's caches synced: on a Node.js without process.execve (20) the
// child outlives it (its lifeline stops it as on SIGTERM, killed 10 s later at the latest). Its
// first sync, under way at the stop, used to write its state anyway, after the stop, and after
// its successor had started: two Services created while no controller seemed to run reached the
// kernel in two steps (N, N+1 by the killed one, N+2 by the next). Now a stop drops a state that
// is not being written yet: the killed controller writes nothing, and the next start takes the map
// from N to N+2 at once. (Where the launcher is the process itself, Node.js 24, it dies whole.)

import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import type { NftExecutor } from '../../src/backends/nft/executor.js';
import { MAP_NAME, TABLE_NAME } from '../../src/backends/nft/render.js';
import { benchNode, benchService, NODE_NAME } from '../../bench/services.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { sh } from '../../testbed/node-network.js';
import { LAUNCHER, shippedArgs } from '../../testbed/shipped-controller.js';
import { waitFor as waitUntil } from '../support/eventually.js';
import { spawnNodeProcess, standInFlags } from '../support/node-process.js';

/** Enough Services that a first sync takes far longer than a stop takes to reach the child. */
const N = 12_000;

/** A process of the controller and what it printed. */
interface Run {
  process: ChildProcess;
  output: string;
}

/** Whether `pid` still runs (a zombie that nobody reaped yet has ended). */
function alive(pid: number): boolean {
  try {
    return !/^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return false;
  }
}

const waitFor = (cond: () => boolean, what: string, ms = 60_000) => waitUntil(cond, what, ms, 5);

describe('a start killed around its first sync (launcher + API stand-in + nft)', function () {
  this.timeout(180_000);
  let api: ApiStandIn;
  let dir: string;
  let kubeconfig: string;
  let executor: NftExecutor;
  const runs: Run[] = [];
  /** Children of killed launchers, ended by the test if they outlive it. */
  const orphans: number[] = [];
  let port = 19470;

  /** The shipped controller: through the launcher, or its bundle run directly. */
  function start(via: 'launcher' | 'bundle'): Run {
    const args = [
      '--backend=nft',
      ...standInFlags(kubeconfig, '60s', NODE_NAME),
      '--log-level',
      'debug',
      `--metrics-bind-address=127.0.0.1:${port++}`,
      `--healthz-bind-address=127.0.0.1:${port++}`,
    ];
    const argv = via === 'launcher' ? [LAUNCHER, ...args] : shippedArgs(args);
    const run: Run = { process: spawnNodeProcess(argv, (text) => (run.output += text)), output: '' };
    runs.push(run);
    return run;
  }

  async function stop(run: Run): Promise<void> {
    if (run.process.exitCode !== null || run.process.signalCode !== null) return;
    run.process.kill('SIGTERM');
    await once(run.process, 'exit');
  }

  const logged = (run: Run, msg: string) => run.output.includes(`"msg":"${msg}"`);

  /** The map's elements, and the ruleset generation they were read at (netlink dumps). */
  async function map(): Promise<{ elements: number; generation: number | undefined }> {
    const read = await executor.readSets('ip', TABLE_NAME, [{ name: MAP_NAME, kind: 'map' }]);
    const lines = read.sets[0] ?? '';
    return { elements: lines.split('\n').filter((l) => l.trim() !== '').length, generation: read.generation };
  }

  before(async () => {
    const load = loadNftAddon();
    if (!load.executor) throw new Error(`the nftables addon must be built for kernel tests: ${load.reason}`);
    executor = load.executor;
    sh('ip', ['link', 'set', 'lo', 'up']);
    api = await ApiStandIn.start({ bookmarkIntervalMs: 500 });
    dir = mkdtempSync(join(tmpdir(), 'start-once-'));
    kubeconfig = join(dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    api.apply(benchNode());
    for (let i = 0; i < N; i++) api.apply(benchService(i));
    // A previous run programmed the N Services, and was stopped.
    const first = start('bundle');
    await waitFor(() => logged(first, 'Synced'), 'the first run to program the Services');
    await stop(first);
    expect((await map()).elements).to.equal(N);
  });

  after(async () => {
    for (const run of runs) await stop(run);
    for (const pid of orphans) if (alive(pid)) process.kill(pid, 'SIGKILL');
    await api?.stop();
    try {
      sh(process.execPath, shippedArgs(['--cleanup']));
    } finally {
      if (dir) rmSync(dir, { recursive: true, force: true });
    }
  });

  afterEach(function () {
    if (this.currentTest?.state !== 'failed') return;
    for (const [i, run] of runs.entries()) console.log(`controller run ${i} output:\n${run.output}`);
  });

  it('writes nothing once its launcher is SIGKILLed after its caches synced, and the next start writes both new Services at once', async () => {
    const before = await map();
    // Created before a start that is killed: this start never programs it.
    api.apply(benchService(N));
    const killed = start('launcher');
    const launcherPid = killed.process.pid!;
    await waitFor(() => logged(killed, 'Caches synced'), 'the caches of the run to be killed');
    // The controller itself: the child of the launcher, or the launcher where it execs itself.
    const children = readFileSync(`/proc/${launcherPid}/task/${launcherPid}/children`, 'utf8').trim();
    const controllerPid = children === '' ? launcherPid : Number(children.split(/\s+/)[0]);
    if (controllerPid !== launcherPid) orphans.push(controllerPid);
    killed.process.kill('SIGKILL');
    // Created while no controller runs, as far as anyone can tell.
    api.apply(benchService(N + 1));
    await waitFor(() => !alive(controllerPid), 'the killed controller to end', 20_000);
    const afterKill = await map();
    expect(afterKill.elements, 'elements: the killed controller wrote nothing').to.equal(before.elements);
    expect(afterKill.generation, 'ruleset generation: nothing committed').to.equal(before.generation);

    // The next start, sampled as the fault suite did: the map goes from N to N+2 at once.
    const samples = new Set<number>();
    let sampling = true;
    const sampler = (async () => {
      while (sampling) {
        samples.add((await map()).elements);
        await sleep(30);
      }
    })();
    const next = start('launcher');
    try {
      await waitFor(() => logged(next, 'Synced'), 'the next start to sync');
      await sleep(300);
    } finally {
      sampling = false;
      await sampler;
    }
    expect((await map()).elements).to.equal(before.elements + 2);
    expect(
      [...samples].sort((a, b) => a - b),
      'element counts seen',
    ).to.deep.equal([before.elements, before.elements + 2]);
    await stop(next);
  });
});
