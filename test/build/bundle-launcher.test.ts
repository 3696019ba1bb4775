// The launcher (bin/ipvs-node-controller.mjs, package.json's bin and the image's ENTRYPOINT) in
// the layout the package and the image have (package.json, bin/, dist/bundle/), with a stand-in
// bundle that reports what it was started with and which signals reached it: the command line
// it runs, exit codes and signals passed through, and a controller that never outlives its
// launcher, a SIGKILL of the launcher included. With this Node.js (20: a child process) and, when
// IPVS_NODE_CONTROLLER_TEST_NODE names another node binary (the image's Node 24: process.execve),
// with that one too.

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { cpSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { expect } from 'chai';
import { LAUNCHER, NODE_FLAGS } from '../../testbed/shipped-controller.js';

const REPO_PACKAGE = new URL('../../../package.json', import.meta.url);

/**
 * The stand-in bundle: prints one JSON line with its pid, Node flags and arguments, then, with
 * --hold, stays until a signal: SIGTERM and SIGINT print `signal <name>` and exit with
 * --exit-code (default 0); other signals keep their default action.
 */
const FAKE_BUNDLE = `
const args = process.argv.slice(2);
const exitCode = Number(args.find((a) => a.startsWith('--exit-code='))?.slice(12) ?? 0);
if (args.includes('--hold')) {
  // Before the first line: the test signals as soon as it reads it.
  setInterval(() => undefined, 1000);
  for (const signal of ['SIGTERM', 'SIGINT']) {
    process.on(signal, () => {
      process.stdout.write('signal ' + signal + '\\n');
      process.exit(exitCode);
    });
  }
} else {
  process.exitCode = exitCode;
}
process.stdout.write(JSON.stringify({ pid: process.pid, execArgv: process.execArgv, args }) + '\\n');
`;

interface Run {
  launcher: ChildProcess;
  output: () => string;
  /** The stand-in bundle's first line. */
  started: Promise<{ pid: number; execArgv: string[]; args: string[] }>;
  exited: Promise<[number | null, NodeJS.Signals | null]>;
}

/** A process that is gone: no such pid, or a zombie nobody reaped yet. */
function gone(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch {
    return true;
  }
  try {
    return /^\d+ \(.*\) Z/.test(readFileSync(`/proc/${pid}/stat`, 'utf8'));
  } catch {
    return true;
  }
}

const nodes = [process.execPath, ...(process.env.IPVS_NODE_CONTROLLER_TEST_NODE ? [process.env.IPVS_NODE_CONTROLLER_TEST_NODE] : [])];

for (const node of nodes) {
  describe(`launcher bin/ipvs-node-controller.mjs under ${node}`, function () {
    let dir: string;
    let execve: boolean;
    const running: ChildProcess[] = [];
    const pids: number[] = [];

    before(async () => {
      dir = mkdtempSync(join(tmpdir(), 'launcher-'));
      mkdirSync(join(dir, 'bin'));
      mkdirSync(join(dir, 'dist', 'bundle'), { recursive: true });
      cpSync(REPO_PACKAGE, join(dir, 'package.json'));
      cpSync(LAUNCHER, join(dir, 'bin', 'ipvs-node-controller.mjs'));
      writeFileSync(join(dir, 'dist', 'bundle', 'ipvs-node-controller.mjs'), FAKE_BUNDLE);
      const probe = spawn(node, ['-p', 'typeof process.execve'], { stdio: ['ignore', 'pipe', 'inherit'] });
      let out = '';
      probe.stdout!.on('data', (d: Buffer) => (out += d.toString()));
      await once(probe, 'exit');
      execve = out.trim() === 'function';
    });
    afterEach(() => {
      for (const child of running.splice(0)) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      for (const pid of pids.splice(0)) if (!gone(pid)) process.kill(pid, 'SIGKILL');
    });
    after(() => rmSync(dir, { recursive: true, force: true }));

    function start(args: string[], nodeArgs: string[] = []): Run {
      const launcher = spawn(node, [...nodeArgs, join(dir, 'bin', 'ipvs-node-controller.mjs'), ...args], {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      running.push(launcher);
      let output = '';
      const started = new Promise<{ pid: number; execArgv: string[]; args: string[] }>((resolve, reject) => {
        launcher.stdout!.on('data', (d: Buffer) => {
          output += d.toString();
          const first = output.split('\n')[0]!;
          if (output.includes('\n')) {
            const line = JSON.parse(first) as { pid: number; execArgv: string[]; args: string[] };
            pids.push(line.pid);
            resolve(line);
          }
        });
        launcher.on('exit', () => reject(new Error(`the launcher ended before the bundle started: ${output}`)));
      });
      started.catch(() => undefined);
      launcher.stderr!.on('data', (d: Buffer) => (output += d.toString()));
      const exited = once(launcher, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
      return { launcher, output: () => output, started, exited };
    }

    /** Its Node flags without the launcher's own lifeline module (Node.js without execve). */
    const ownFlags = (execArgv: string[]) => execArgv.filter((f) => !f.startsWith('--import=data:'));

    it("runs the bundle with package.json's Node flags, then its own, then the arguments; its exit code is the launcher's", async () => {
      const run = start(['--one', 'two', '--exit-code=3'], ['--max-old-space-size=200']);
      const bundle = await run.started;
      expect(ownFlags(bundle.execArgv)).to.deep.equal([...NODE_FLAGS, '--max-old-space-size=200']);
      expect(bundle.args).to.deep.equal(['--one', 'two', '--exit-code=3']);
      expect(await run.exited).to.deep.equal([3, null]);
      if (execve) expect(bundle.pid, 'the same process (execve)').to.equal(run.launcher.pid);
      else expect(bundle.execArgv.length - ownFlags(bundle.execArgv).length, 'the lifeline').to.equal(1);
    });

    for (const signal of ['SIGTERM', 'SIGINT'] as const) {
      it(`passes ${signal} to the controller once, and ends with its exit code`, async () => {
        const run = start(['--hold', '--exit-code=7']);
        await run.started;
        run.launcher.kill(signal);
        expect(await run.exited).to.deep.equal([7, null]);
        expect(run.output().split('\n').filter((l) => l.startsWith('signal '))).to.deep.equal([`signal ${signal}`]);
      });
    }

    it('ends killed by the signal that killed the controller', async () => {
      const run = start(['--hold']);
      await run.started;
      run.launcher.kill('SIGHUP');
      expect(await run.exited).to.deep.equal([null, 'SIGHUP']);
    });

    it('leaves no controller running when the launcher is killed with SIGKILL', async () => {
      const run = start(['--hold']);
      const bundle = await run.started;
      expect(gone(bundle.pid)).to.equal(false);
      run.launcher.kill('SIGKILL');
      expect(await run.exited).to.deep.equal([null, 'SIGKILL']);
      const deadline = Date.now() + 10_000;
      while (!gone(bundle.pid)) {
        expect(Date.now(), `the controller (pid ${bundle.pid}) outlived its launcher`).to.be.below(deadline);
        await sleep(20);
      }
      // Stopped as on SIGTERM (its rules stay in place), unless it was the launcher's own process.
      if (!execve) {
        const deadline = Date.now() + 5_000;
        while (!run.output().includes('signal SIGTERM') && Date.now() < deadline) await sleep(20);
        expect(run.output()).to.include('signal SIGTERM');
      }
    });
  });
}
