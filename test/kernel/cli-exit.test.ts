// How the command line ends, as root on a real kernel: a run ends only when asked to (SIGTERM,
// exit 0, with a log line), never because nothing is left to wait for; and the documented
// no-root preview works for a normal user after a root build (`sudo npm start`).

import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { chmodSync, cpSync, mkdtempSync, rmSync, symlinkSync, utimesSync } from 'node:fs';
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

  it('keeps retrying an unreachable API server with both HTTP endpoints off; SIGTERM ends it with 0', async () => {
    const kubeconfig = join(dir, 'kubeconfig');
    writeUnreachableKubeconfig(kubeconfig);
    const child = spawn(
      process.execPath,
      shippedArgs([
        `--kubeconfig=${kubeconfig}`,
        '--node-name=n',
        '--backend=nft',
        '--metrics-bind-address=',
        '--healthz-bind-address=',
      ]),
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (d: Buffer) => (stdout += d.toString()));
    child.stderr!.on('data', (d: Buffer) => (stderr += d.toString()));
    const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
    const lines = () =>
      stdout
        .split('\n')
        .filter((l) => l !== '')
        .map((l) => JSON.parse(l) as Record<string, any>);
    try {
      // Four failed lists of Services: past the point where the event loop used to empty.
      const deadline = Date.now() + 60_000;
      while (lines().filter((l) => l.msg === 'cannot list/watch services, keeping the last rules').length < 4) {
        expect(child.exitCode, `exited while retrying:\n${stdout}\n${stderr}`).to.equal(null);
        expect(Date.now(), `too few retries:\n${stdout}`).to.be.below(deadline);
        await new Promise((r) => setTimeout(r, 100));
      }
      const retry = lines().find((l) => l.msg === 'cannot list/watch services, keeping the last rules')!;
      expect(retry).to.include({ level: 'warn', resource: 'services' });
      expect(retry.err.message).to.match(/ECONNREFUSED/);
      expect(child.exitCode).to.equal(null);
      child.kill('SIGTERM');
      const [code] = await exited;
      expect(code, `${stdout}\n${stderr}`).to.equal(0);
      expect(lines().at(-1)).to.include({
        level: 'info',
        signal: 'SIGTERM',
        msg: 'stopping; the programmed rules stay in place',
      });
      expect(stderr).to.equal('');
    } finally {
      if (child.exitCode === null) child.kill('SIGKILL');
    }
  });

  describe('npm run preview as a normal user after a root build', () => {
    let clone: string;
    before(() => {
      // A clone as `sudo npm start` leaves it: everything, dist/ included, belongs to root.
      clone = join(dir, 'clone');
      for (const part of ['package.json', 'scripts', 'src', 'examples', 'dist/src', 'build/Release']) {
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
      utimesSync(join(clone, 'src', 'controller.ts'), later, later);
      const r = await preview(nobodysHome('home-stale'));
      expect(r.exitCode, r.stderr).to.equal(0);
      expect(r.stdout).to.match(/# 4 Services read; 5 IPv4 and 2 IPv6 entries/);
      expect(r.stderr).to.include('preview: dist/ is older than src/ but belongs to another user');
      expect(r.stderr).not.to.match(/EACCES|TS5033/);
    });
  });
});
