// `npm run demo` as a user meets it: kube-proxy 1.24+'s IPVS mode before the controller (pods
// answered by the endpoint on the other node with their own address, the node's own connection
// timing out), both answered after, the endpoint seeing the pod's address for pods and the node's
// for the node; kubectl get / apply / delete against the demo's API stand-in with the rules
// following; Ctrl-C (SIGINT) tears it all down, also when the reader of its output is gone, and at
// once during the first step. The test's own mount namespace (a tmpfs on /run/netns, test/run.mjs)
// plays the host: the demo's `ip netns` names must never show there.

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { expect } from 'chai';
import { assertIsolatedNetns, requireTools } from '../../testbed/node-network.js';
import { httpGet, scrapeMetrics } from '../support/scrape.js';
import { rejectionOf } from '../support/assertions.js';
import { codeBlockAfter, inOrder } from '../support/readme.js';

const run = promisify(execFile);
const here = dirname(fileURLToPath(import.meta.url));
const DEMO = join(here, '..', '..', 'demo', 'run.js');
const EXTRA = join(here, '..', '..', '..', 'demo', 'extra-service.yaml');
const README = join(here, '..', '..', '..', 'README.md');

function cmdlineOf(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replace(/\0/g, ' ').trim();
  } catch {
    return undefined;
  }
}

/** Every live descendant of `root`, with its command line (to tell a reused pid apart). */
function descendants(root: number): Map<number, string> {
  const children = new Map<number, number[]>();
  for (const name of readdirSync('/proc')) {
    const pid = Number(name);
    if (!Number.isInteger(pid)) continue;
    try {
      const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
      children.set(ppid, [...(children.get(ppid) ?? []), pid]);
    } catch {
      // gone meanwhile
    }
  }
  const out = new Map<number, string>();
  const visit = (pid: number) => {
    for (const child of children.get(pid) ?? []) {
      const cmd = cmdlineOf(child);
      if (cmd !== undefined) out.set(child, cmd);
      visit(child);
    }
  };
  visit(root);
  return out;
}

/** Those of `processes` still running with the same command line. */
function stillRunning(processes: Map<number, string>): string[] {
  return [...processes].filter(([pid, cmd]) => cmdlineOf(pid) === cmd).map(([pid, cmd]) => `${pid} ${cmd}`);
}

/** The names in this mount namespace's /run/netns, the demo's "host". */
function hostNetns(): string[] {
  return existsSync('/run/netns')
    ? readdirSync('/run/netns')
        .filter((n) => n.startsWith('demo-'))
        .sort()
    : [];
}

/** /run/netns must be this namespace's own tmpfs: the test writes a fake leftover there. */
function requirePrivateRunNetns(): void {
  const mounts = readFileSync('/proc/self/mountinfo', 'utf8').split('\n');
  if (!mounts.some((l) => l.split(' ')[4] === '/run/netns' && / - tmpfs /.test(l))) {
    throw new Error('/run/netns is not a tmpfs of this test: run the kernel tests through `npm test`');
  }
}

describe('the demo (npm run demo)', function () {
  this.timeout(120_000);
  let demo: ChildProcess | undefined;
  let output = '';

  async function outputMatching(re: RegExp, what: string): Promise<RegExpMatchArray> {
    const deadline = Date.now() + 60_000;
    for (;;) {
      const m = re.exec(output);
      if (m) return m;
      if (demo?.exitCode !== null) throw new Error(`the demo exited while waiting for ${what}:\n${output}`);
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}:\n${output}`);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  before(() => {
    assertIsolatedNetns(); // the demo's loopback relays stay in the test's namespace
    requireTools('unshare', 'ip', 'nft', 'kubectl');
  });
  after(async () => {
    if (demo && demo.exitCode === null) {
      demo.kill('SIGINT');
      await once(demo, 'exit');
    }
  });

  it("shows kube-proxy 1.24+'s picture, then the translation (pods keep their address), then follows kubectl apply and delete; SIGINT tears down", async () => {
    demo = spawn(process.execPath, [DEMO], { stdio: ['ignore', 'pipe', 'pipe'] });
    demo.stdout!.on('data', (d: Buffer) => (output += d.toString()));
    demo.stderr!.on('data', (d: Buffer) => (output += d.toString()));

    const [, kubeconfig] = await outputMatching(/export KUBECONFIG=(\S+)/, 'the kubeconfig');
    const [, metricsPort] = await outputMatching(/curl -s http:\/\/127\.0\.0\.1:(\d+)\/metrics/, 'the metrics address');
    const before = output.slice(output.indexOf('1. Without the controller'), output.indexOf('2. Starting'));
    const after = output.slice(output.indexOf('2. Starting'), output.indexOf('3. Your turn'));
    const pods = { 'pod-a (10.244.1.2)': '10.244.1.2', 'pod-b (10.244.1.3)': '10.244.1.3' };
    for (const target of ['203.0.113.10:80/tcp', '203.0.113.10:8443/tcp']) {
      const service = target.endsWith(':80/tcp') ? 'shop/web' : 'shop/api';
      const line = (text: string, client: string) =>
        text.split('\n').find((l) => l.includes(client) && l.includes(target)) ?? '';
      const node = 'host network (node)';
      // The node connects from the LoadBalancer IP, which the endpoint's node holds too.
      expect(line(before, node), `${node} -> ${target} before:\n${before}`).to.match(
        /x {2}timed out \(no answer within 2 s\)$/,
      );
      expect(line(after, node), `${node} -> ${target} after, masqueraded:\n${after}`).to.match(
        new RegExp(`ok ${service}'s endpoint saw 172\\.30\\.0\\.1 \\(the node's address: masqueraded\\)$`),
      );
      for (const [client, ip] of Object.entries(pods)) {
        // Without the mark: the endpoint sees the pod, before (IPVS) and after (the ClusterIP) alike.
        const own = new RegExp(`ok ${service}'s endpoint saw ${ip.replace(/\./g, '\\.')} \\(the pod's own address\\)$`);
        expect(line(before, client), `${client} -> ${target} before:\n${before}`).to.match(own);
        expect(line(after, client), `${client} -> ${target} after, the pod's source kept:\n${after}`).to.match(own);
      }
    }

    // The README's transcript of these two steps is what the demo printed, line for line.
    const transcript = codeBlockAfter(readFileSync(README, 'utf8'), 'Before and after, as `npm start` prints them');
    expect(transcript.length).to.be.greaterThan(15);
    expect(inOrder(transcript, (before + after).split('\n')), 'the README transcript').to.deep.equal({
      missing: undefined,
    });

    const kubectl = async (...args: string[]) => (await run('kubectl', ['--kubeconfig', kubeconfig!, ...args])).stdout;
    const rows = (await kubectl('get', 'services', '-A'))
      .trim()
      .split('\n')
      .map((l) => l.trim().split(/\s+/));
    expect(rows.slice(1).map((r) => [r[0], r[1], r[2], r[4]])).to.deep.equal([
      ['shop', 'api', 'LoadBalancer', '203.0.113.10'],
      ['shop', 'web', 'LoadBalancer', '203.0.113.10'],
    ]);

    expect(await kubectl('apply', '--validate=false', '-f', EXTRA)).to.match(/service\/cart created/);
    await outputMatching(/\+ 203\.0\.113\.11 tcp 8080 -> (\S+)\s+\(shop\/cart\)/, 'the new rule');
    await outputMatching(
      /pod-a \(10\.244\.1\.2\)\s+-> 203\.0\.113\.11:8080\/tcp\s+ok shop\/cart's endpoint saw 10\.244\.1\.2 /,
      'the probe',
    );
    const cart = (await kubectl('get', 'service', '-n', 'shop', 'cart', '--no-headers')).trim().split(/\s+/);
    expect(cart[3], 'the demo load balancer assigned the next address').to.equal('203.0.113.11');
    const metrics = await scrapeMetrics(`http://127.0.0.1:${metricsPort}`);
    expect(metrics.value('ipvs_node_controller_programmed_entries', { backend: 'nft', family: 'ipv4' })).to.equal(3);

    // The controller's log, for a person: klog's text lines.
    const controllerLog = readFileSync(join(dirname(kubeconfig!), 'controller.log'), 'utf8');
    expect(controllerLog).to.match(
      /^I\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ ipvs-node-controller\] "Caches synced" node="demo-node" services=2$/m,
    );

    expect(await kubectl('delete', '-f', EXTRA)).to.match(/service "cart" deleted/);
    await outputMatching(/- 203\.0\.113\.11 tcp 8080 -> \S+\s+\(shop\/cart\)/, 'the rule removal');

    demo.kill('SIGINT');
    const [code] = (await once(demo, 'exit')) as [number | null];
    expect(code, output).to.equal(0);
    expect(output).to.match(/Torn down/);
    expect(existsSync(dirname(kubeconfig!)), 'the temporary directory is removed').to.equal(false);
    expect((await rejectionOf(httpGet(`http://127.0.0.1:${metricsPort}/metrics`))).message).to.match(/ECONNREFUSED/);
  });

  /** A demo in a process group of its own, so that a test can send Ctrl-C as a terminal does. */
  class DemoRun {
    readonly child: ChildProcess;
    stdout = '';
    stderr = '';
    readonly startedAt = Date.now();
    readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;

    constructor() {
      this.child = spawn(process.execPath, [DEMO], { stdio: ['ignore', 'pipe', 'pipe'], detached: true });
      this.child.stdout!.on('data', (d: Buffer) => (this.stdout += d.toString()));
      this.child.stderr!.on('data', (d: Buffer) => (this.stderr += d.toString()));
      this.exited = once(this.child, 'exit').then(([code, signal]) => ({ code, signal }));
      running.add(this);
    }

    async waitFor(re: RegExp, what: string): Promise<RegExpMatchArray> {
      const deadline = Date.now() + 60_000;
      for (;;) {
        const m = re.exec(this.stdout);
        if (m) return m;
        if (this.child.exitCode !== null) throw new Error(`the demo exited while waiting for ${what}:\n${this.all}`);
        if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}:\n${this.all}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }

    /** Ctrl-C: SIGINT to every process of the group (the demo, its node, the controller, probes). */
    ctrlC(): void {
      process.kill(-this.child.pid!, 'SIGINT');
    }

    get all(): string {
      return `${this.stdout}\n--- stderr ---\n${this.stderr}`;
    }
  }
  const running = new Set<DemoRun>();
  afterEach(async () => {
    for (const run of running) {
      if (run.child.exitCode === null && run.child.signalCode === null) {
        process.kill(-run.child.pid!, 'SIGKILL');
        await run.exited;
      }
    }
    running.clear();
  });

  it('tears down on Ctrl-C after the reader of its output went away; never on the host; a second start works', async function () {
    this.timeout(240_000); // two starts of the demo
    requirePrivateRunNetns();
    // What an older demo left on the host: it must get a hint, and must not stop a new start.
    writeFileSync('/run/netns/demo-pod-a', '');
    try {
      const first = new DemoRun();
      const [, kubeconfig] = await first.waitFor(/export KUBECONFIG=(\S+)/, 'the kubeconfig');
      await first.waitFor(/Ctrl-C tears it all down/, 'step 3');
      const workdir = dirname(kubeconfig!);
      expect(first.stderr).to.match(
        /\/run\/netns\/demo-pod-a is left over from an earlier run of the demo.*sudo ip netns delete demo-pod-a/,
      );

      // While it runs: its pods' names are in its own mount namespace, not on the host.
      const processes = descendants(first.child.pid!);
      const [nodePid] = [...processes].find(([, cmd]) => cmd.includes(`--workdir=${workdir}`)) ?? [];
      expect(nodePid, 'the demo node process').to.be.a('number');
      expect(readdirSync(`/proc/${nodePid}/root/run/netns`).sort()).to.deep.equal([
        'demo-endpoint',
        'demo-node-2',
        'demo-pod-a',
        'demo-pod-b',
      ]);
      expect(hostNetns()).to.deep.equal(['demo-pod-a'], 'only the fake leftover is on the host');
      expect([...processes.values()].some((cmd) => cmd.includes('--node-name=demo-node'))).to.equal(
        true,
        'the controller runs',
      );

      // The reader goes away (tee ended by the same Ctrl-C), then Ctrl-C.
      first.child.stdout!.destroy();
      first.ctrlC();
      const { code } = await first.exited;
      expect(code, first.all).to.equal(0);
      expect(first.stderr).not.to.match(/EPIPE|could not|Error/);

      expect(hostNetns()).to.deep.equal(['demo-pod-a'], 'nothing new on the host');
      expect(stillRunning(processes), 'processes of the demo still running').to.deep.equal([]);
      expect(existsSync(workdir), 'the temporary directory is removed').to.equal(false);

      const second = new DemoRun();
      await second.waitFor(/Ctrl-C tears it all down/, 'step 3 of the second start');
      expect(second.stdout).to.match(/ok shop\/web's endpoint saw 10\.244\.1\.2 /);
      second.ctrlC();
      expect((await second.exited).code, second.all).to.equal(0);
      expect(second.stdout).to.match(/Torn down/);
      expect(hostNetns()).to.deep.equal(['demo-pod-a']);
    } finally {
      rmSync('/run/netns/demo-pod-a', { force: true });
    }
  });

  it('stops at once on Ctrl-C during the first step, and reports no success it did not see', async () => {
    requirePrivateRunNetns();
    const run = new DemoRun();
    // Ctrl-C as the first step's header arrives, while its probes run (the pods' answers come back
    // at once, the node's wait for their timeout), not at a poll.
    const { processes, interruptedAt } = await new Promise<{ processes: Map<number, string>; interruptedAt: number }>(
      (resolve, reject) => {
        const onData = () => {
          if (!/1\. Without the controller/.test(run.stdout)) return;
          run.child.stdout!.off('data', onData);
          const processes = descendants(run.child.pid!);
          const interruptedAt = Date.now();
          run.ctrlC();
          resolve({ processes, interruptedAt });
        };
        run.child.stdout!.on('data', onData);
        run.exited.then(() => reject(new Error(`the demo exited before the first step:\n${run.all}`)), reject);
      },
    );
    const { code } = await run.exited;
    console.log(`      exited ${Date.now() - interruptedAt} ms after Ctrl-C in the first step`);
    expect(code, run.all).to.equal(0);
    expect(run.stdout).to.match(/Stopping: tearing the demo down/);
    expect(run.stdout, 'the controller never started').not.to.match(/2\. Starting the controller/);
    expect(run.stdout, 'an interrupted probe is no result: no probe line at all').not.to.match(/-> 203\.0\.113\./);
    expect(run.stdout).to.match(/Torn down/);
    expect(hostNetns()).to.deep.equal([]);
    expect(stillRunning(processes), 'processes of the demo still running').to.deep.equal([]);
  });
});
