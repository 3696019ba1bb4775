// The files of src/ one Service change runs through, counted by V8's own precise coverage: the
// real controller in this process (informers, sync runner, model, reconciler, the nft addon's
// netlink batch) against the API stand-in, the conntrack clean-up subscribed as the CLI
// subscribes it. A UDP Service's ClusterIP changes through the API; between two coverage reads,
// taken just before the write and once the kernel holds the new target and the clean-up ran,
// every file with a function that ran is on the path (the stand-in is outside src/). The test
// prints the files, and holds their number to a bound so that the path does not grow back
// unnoticed (docs/architecture.md, "One Service change").

import { expect } from 'chai';
import { execFileSync } from 'node:child_process';
import { Session } from 'node:inspector/promises';
import { fileURLToPath } from 'node:url';
import { relative } from 'node:path';
import { pino } from 'pino';
import { loadNftAddon } from '../../src/backends/nft/addon-executor.js';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { MAP_NAME, TABLE_NAME } from '../../src/backends/nft/render.js';
import { composeReconciler } from '../../src/cli/compose.js';
import { ControllerOnStandIn } from '../support/controller-on-stand-in.js';
import { wireLbService } from '../support/wire-objects.js';
import { eventually } from '../support/eventually.js';

/** The most files of src/ one change may run through (measured: see the test's output). */
const MAX_FILES = 35;

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));

/** The files of dist/src (as their src/ .ts names) with a function that ran since the last read. */
async function filesRun(session: Session): Promise<string[]> {
  const { result } = await session.post('Profiler.takePreciseCoverage');
  const files = new Set<string>();
  for (const script of result) {
    if (!script.url.startsWith('file://')) continue;
    const path = relative(ROOT, fileURLToPath(script.url));
    if (!path.startsWith('dist/src/')) continue;
    if (script.functions.some((f) => f.ranges.some((r) => r.count > 0))) {
      files.add(path.replace(/^dist\//, '').replace(/\.js$/, '.ts'));
    }
  }
  return [...files].sort();
}

function udpService(clusterIp: string): Record<string, unknown> {
  return wireLbService('dns', clusterIp, '192.0.2.53', { port: 53, protocol: 'UDP' });
}

describe('one Service change, watch event to kernel write and conntrack (V8 coverage)', function () {
  let run: ControllerOnStandIn | undefined;
  const session = new Session();

  after(async () => {
    await run?.stop();
    session.disconnect();
    for (const family of ['ip', 'ip6']) {
      try {
        execFileSync('nft', ['delete', 'table', family, TABLE_NAME], { stdio: 'ignore' });
      } catch {
        // not there
      }
    }
  });

  it(`runs through at most ${MAX_FILES} files of src/, and says which`, async () => {
    execFileSync('ip', ['link', 'set', 'lo', 'up']);
    const load = loadNftAddon();
    if (!load.executor) throw new Error(`the nftables addon must be built for kernel tests: ${load.reason}`);
    const reconciler = composeReconciler(new NftDriver(load.executor), { logger: pino({ enabled: false }) });
    const others = Array.from({ length: 50 }, (_, i) =>
      wireLbService(`web-${i}`, `10.96.1.${i + 1}`, `192.0.2.${100 + i}`),
    );
    // A sync reports once it ended, its subscribers (the conntrack clean-up) awaited.
    let partialSyncs = 0;
    run = await ControllerOnStandIn.start(reconciler, [udpService('10.96.0.53'), ...others], {
      observer: { onSync: (report) => void (report.result?.mode === 'partial' && partialSyncs++) },
    });
    /** Until the kernel holds `clusterIp` and a partial sync ended since this was asked. */
    const changeTold = async (what: string, clusterIp: string) => {
      const before = partialSyncs;
      await eventually(what, () => holds(clusterIp) && partialSyncs > before);
    };
    const holds = (clusterIp: string) =>
      execFileSync('nft', ['list', 'map', 'ip', TABLE_NAME, MAP_NAME], { stdio: 'pipe' })
        .toString()
        .includes(clusterIp);
    await eventually('the first sync', () => holds('10.96.0.53'));
    session.connect();
    await session.post('Profiler.enable');
    await session.post('Profiler.startPreciseCoverage', { callCount: true, detailed: false });
    // Once with a change, to leave out what runs only the first time (lazy imports, warm-up).
    run.api.apply(udpService('10.96.0.54'));
    await changeTold('the warm-up change', '10.96.0.54');
    await filesRun(session);
    run.api.apply(udpService('10.96.0.55'));
    await changeTold('the change', '10.96.0.55');
    const files = await filesRun(session);
    await session.post('Profiler.stopPreciseCoverage');
    console.log(`      ${files.length} files of src/ on the path of one change:\n        ${files.join('\n        ')}`);
    expect(files, 'the watch, the model, the reconciler, the driver and conntrack are on it').to.include.members([
      'src/kube/watch.ts',
      'src/model/desired-state.ts',
      'src/reconciler/reconciler.ts',
      'src/backends/nft/nft-driver.ts',
      'src/conntrack/conntrack-subscriber.ts',
    ]);
    expect(files.length).to.be.at.most(MAX_FILES);
  });
});
