// How the command line ends, as root on a real kernel: a run ends only when asked to (SIGTERM,
// exit 0, with a log line), never because nothing is left to wait for; and the documented
// no-root preview works for a normal user after a root build (`sudo npm start`).

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import {
  chmodSync,
  cpSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  symlinkSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import { execa, execaSync } from 'execa';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { writeUnreachableKubeconfig } from '../support/fixtures.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';

const REPO = fileURLToPath(new URL('../../../', import.meta.url));
const NOBODY = ['--reuid=65534', '--regid=65534', '--clear-groups'];

describe('command line exits', function () {
  this.timeout(90_000);
  let dir: string;
  before(() => {
    assertIsolatedNetns();
    dir = mkdtempSync(join(tmpdir(), 'cli-exit-'));
    chmodSync(dir, 0o755);
  });
  after(() => rmSync(dir, { recursive: true, force: true }));

  /** The controller against an unreachable API server, its output kept, its exit awaited. */
  function startUnreachable(args: readonly string[], env: NodeJS.ProcessEnv = process.env) {
    const kubeconfig = join(dir, 'kubeconfig');
    writeUnreachableKubeconfig(kubeconfig);
    const child = spawn(
      process.execPath,
      shippedArgs([
        `--kubeconfig=${kubeconfig}`,
        '--node-name=n',
        '--metrics-bind-address=',
        '--healthz-bind-address=',
        ...args,
      ]),
      { stdio: ['ignore', 'pipe', 'pipe'], env },
    );
    const run = { child, stdout: '', stderr: '' };
    child.stdout!.on('data', (d: Buffer) => (run.stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (run.stderr += d.toString()));
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    const lines = () =>
      run.stdout
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as Record<string, any>);
    /** SIGTERM: exit 0, after the stop's log line, with nothing on stderr. */
    async function stopsCleanly(): Promise<void> {
      child.kill('SIGTERM');
      const [code, signal] = await exited;
      expect({ code, signal }, `${run.stdout}\n${run.stderr}`).to.deep.equal({ code: 0, signal: null });
      expect(
        lines().some((l) => l.msg === 'Stopping, the programmed rules stay in place' && l.signal === 'SIGTERM'),
      ).to.equal(true);
      expect(run.stderr).to.equal('');
    }
    return { run, lines, stopsCleanly };
  }

  it('keeps retrying an unreachable API server with both HTTP endpoints off; SIGTERM ends it with 0', async () => {
    const { run, lines, stopsCleanly } = startUnreachable(['--backend=nft']);
    try {
      // Four failed lists of Services: past the point where the event loop used to empty.
      const deadline = Date.now() + 60_000;
      while (
        lines().filter((l) => l.msg === 'Failed to list and watch, keeping the last rules' && l.resource === 'services')
          .length < 4
      ) {
        expect(run.child.exitCode, `exited while retrying:\n${run.stdout}\n${run.stderr}`).to.equal(null);
        expect(Date.now(), `too few retries:\n${run.stdout}`).to.be.below(deadline);
        await new Promise((r) => setTimeout(r, 100));
      }
      const retry = lines().find(
        (l) => l.msg === 'Failed to list and watch, keeping the last rules' && l.resource === 'services',
      )!;
      expect(retry).to.include({ level: 'warn', resource: 'services' });
      expect(retry.err.message).to.match(/ECONNREFUSED/);
      expect(run.child.exitCode).to.equal(null);
      await stopsCleanly();
      expect(lines().at(-1)).to.include({ level: 'info', signal: 'SIGTERM' });
    } finally {
      if (run.child.exitCode === null) run.child.kill('SIGKILL');
    }
  });

  /** PATH entries whose iptables commands mark that one started, then wait a second before running. */
  function slowIptables(): { env: NodeJS.ProcessEnv; started: string } {
    const shims = join(dir, 'shims');
    const started = join(dir, 'iptables-started');
    rmSync(started, { force: true });
    mkdirSync(shims, { recursive: true });
    for (const variant of ['nft', 'legacy'])
      for (const tool of ['', '-save', '-restore'])
        for (const base of ['iptables', 'ip6tables']) {
          const name = `${base}-${variant}${tool}`;
          const real = execaSync('sh', ['-c', `command -v ${name}`]).stdout.trim();
          writeFileSync(join(shims, name), `#!/bin/sh\ntouch '${started}'\nsleep 1\nexec '${real}' "$@"\n`, {
            mode: 0o755,
          });
        }
    return { env: { ...process.env, PATH: `${shims}:${process.env.PATH}` }, started };
  }

  async function untilExists(path: string, child: ChildProcess): Promise<void> {
    const deadline = Date.now() + 30_000;
    while (!existsSync(path)) {
      expect(child.exitCode, 'exited before an iptables command ran').to.equal(null);
      expect(Date.now(), 'no iptables command ran').to.be.below(deadline);
      await new Promise((r) => setTimeout(r, 20));
    }
  }

  // The iptables backend runs iptables-save/-restore as child processes. While one runs, the
  // library that runs them listens to SIGTERM too (to end its children with the process), and
  // re-raised the signal when it found itself the only listener: the controller died of its
  // SIGTERM instead of stopping with 0. Each iptables command here waits a second after it
  // started, and the signal is sent in that second.
  it('a SIGTERM that arrives while an iptables command runs still ends it with 0', async () => {
    const { env, started } = slowIptables();
    const { run, stopsCleanly } = startUnreachable(['--backend=iptables'], env);
    try {
      await untilExists(started, run.child);
      await stopsCleanly();
    } finally {
      if (run.child.exitCode === null) run.child.kill('SIGKILL');
    }
  });

  it('a second SIGTERM during the stop ends it at once with 1, and says so', async () => {
    const { env, started } = slowIptables();
    const { run, lines } = startUnreachable(['--backend=iptables'], env);
    try {
      await untilExists(started, run.child);
      const exited = once(run.child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
      run.child.kill('SIGTERM');
      await new Promise((r) => setTimeout(r, 100));
      run.child.kill('SIGTERM');
      const [code, signal] = await exited;
      expect({ code, signal }, run.stdout).to.deep.equal({ code: 1, signal: null });
      expect(lines().at(-1)).to.include({
        level: 'warn',
        signal: 'SIGTERM',
        msg: 'Second stop request, exiting at once, the programmed rules stay in place',
      });
    } finally {
      if (run.child.exitCode === null) run.child.kill('SIGKILL');
    }
  });

  describe('npm run preview as a normal user after a root build', () => {
    let clone: string;
    before(() => {
      // A clone as `sudo npm start` leaves it: everything, dist/ included, belongs to root.
      clone = join(dir, 'clone');
      for (const part of ['package.json', 'scripts', 'src', 'examples', 'bin', 'dist/bundle', 'build/Release']) {
        cpSync(join(REPO, part), join(clone, part), { recursive: true });
      }
      symlinkSync(join(REPO, 'node_modules'), join(clone, 'node_modules'));
      chmodSync(clone, 0o755);
    });

    const preview = (home: string) =>
      execa('setpriv', [...NOBODY, 'npm', 'run', 'preview'], {
        cwd: clone,
        reject: false,
        timeout: 60_000,
        // Only what a login would give: none of the npm_config_* of a surrounding `npm test` as root.
        extendEnv: false,
        env: { PATH: process.env.PATH, HOME: home, npm_config_update_notifier: 'false' },
      });

    function nobodysHome(name: string): string {
      const home = join(dir, name);
      execaSync('install', ['-d', '-o', '65534', '-g', '65534', home]);
      return home;
    }

    it('prints the example ruleset without rebuilding', async () => {
      const r = await preview(nobodysHome('home-fresh'));
      expect(r.exitCode, r.all ?? r.stderr).to.equal(0);
      expect(r.stdout).to.match(/# 4 Services read; 5 IPv4 and 2 IPv6 entries/);
      expect(r.stderr).not.to.match(/EACCES|TS5033|error/i);
    });

    it('shows the existing build with a warning when src/ is newer and dist/ is not writable', async () => {
      const later = new Date(Date.now() + 60_000);
      utimesSync(join(clone, 'src', 'controller', 'controller.ts'), later, later);
      const r = await preview(nobodysHome('home-stale'));
      expect(r.exitCode, r.stderr).to.equal(0);
      expect(r.stdout).to.match(/# 4 Services read; 5 IPv4 and 2 IPv6 entries/);
      expect(r.stderr).to.include('preview: dist/ is older than src/ but belongs to another user');
      expect(r.stderr).not.to.match(/EACCES|TS5033/);
    });
  });
});
