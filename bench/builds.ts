// The builds and Node.js binaries a benchmark compares (react, probe-cost), made
// ready before it measures:
//   - the Node.js binaries: the image's (the Dockerfile's NODE_VERSION, from the npm package
//     node-linux-<arch>, as scripts/release.mjs and scripts/local-base-images.sh take it), kept in
//     ~/.cache/ipvs-node-controller/node/<version>/; another major the same way; `current` is the
//     Node running the bench; a path is taken as it is;
//   - the build to compare with: REF checked out in a temporary git worktree, node_modules linked
//     to this tree's, the native addons and the BPF object copied when their sources are this
//     tree's and built otherwise, then `npm run build` there. removeRefBuilds() removes it.

import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import {
  chmodSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmSync,
  symlinkSync,
} from 'node:fs';
import { homedir } from 'node:os';
import { join } from 'node:path';
import type { Build } from './controller.js';

export interface NodeBinary {
  /** What a table calls it, e.g. 'Node 24.21.0'. */
  label: string;
  path: string;
}

const log = (message: string) => process.stderr.write(`[builds] ${message}\n`);

function nodeFlagsOf(packageRoot: string): string[] {
  const pkg = JSON.parse(readFileSync(join(packageRoot, 'package.json'), 'utf8')) as {
    ipvsNodeController?: { nodeFlags?: string[] };
  };
  return pkg.ipvsNodeController?.nodeFlags ?? [];
}

/** This tree's build (npm run bench built it). */
export function thisTree(root: string): Build {
  const revision = spawnSync('git', ['describe', '--always', '--dirty'], { cwd: root, encoding: 'utf8' });
  const bundle = join(root, 'dist', 'bundle', 'ipvs-node-controller.mjs');
  if (!existsSync(bundle)) throw new Error(`no bundle at ${bundle}: npm run build`);
  return {
    label: `this tree (${revision.status === 0 ? revision.stdout.trim() : 'unknown'})`,
    bundle,
    nodeFlags: nodeFlagsOf(root),
  };
}

/** The latest tag reachable from HEAD, or undefined when there is none. */
export function latestTag(root: string): string | undefined {
  const r = spawnSync('git', ['describe', '--tags', '--abbrev=0'], { cwd: root, encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : undefined;
}

/** The steps running now (a build, a download): stopBuilds() ends them. */
const running = new Set<ChildProcess>();

/** Runs a step in a process group of its own (stopBuilds() ends it): its stdout, or its output's tail in the error. */
function run(command: string, args: string[], cwd: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'], detached: true });
    running.add(child);
    let output = '';
    let stdout = '';
    child.stdout!.on('data', (d: Buffer) => {
      stdout += d.toString();
      output += d.toString();
    });
    child.stderr!.on('data', (d: Buffer) => (output += d.toString()));
    child.once('error', (err) => {
      running.delete(child);
      reject(new Error(`${command}: ${err.message}`));
    });
    child.once('close', (code, signal) => {
      running.delete(child);
      if (code === 0) resolve(stdout.trim());
      else {
        const tail = output.trim().split('\n').slice(-15).join('\n');
        reject(new Error(`${command} ${args.join(' ')} exited with ${code ?? signal}:\n${tail}`));
      }
    });
  });
}

/** Ends the steps still running, with their children (SIGINT of the bench). */
export function stopBuilds(): void {
  for (const child of running) {
    try {
      process.kill(-child.pid!, 'SIGKILL');
    } catch {
      // already gone
    }
  }
}

/** True when `paths` are the same at `commit` as in this working tree. */
function sameSources(root: string, commit: string, paths: string[]): boolean {
  return spawnSync('git', ['diff', '--quiet', commit, '--', ...paths], { cwd: root }).status === 0;
}

function copyFiles(from: string, to: string, suffix: string): number {
  if (!existsSync(from)) return 0;
  mkdirSync(to, { recursive: true });
  const files = readdirSync(from).filter((f) => f.endsWith(suffix));
  for (const f of files) copyFileSync(join(from, f), join(to, f));
  return files.length;
}

/** Checks out and builds `ref` in a worktree under `workDir` (removeRefBuilds removes it). */
export async function makeRefBuild(root: string, ref: string, workDir: string): Promise<Build> {
  const commit = await run('git', ['rev-parse', '--verify', `${ref}^{commit}`], root);
  const short = commit.slice(0, 7);
  const dir = join(workDir, `build-${short}`);
  log(`building ${ref} (${short}) in a worktree: ${dir}`);
  await run('git', ['worktree', 'add', '--detach', dir, commit], root);
  try {
    symlinkSync(realpathSync(join(root, 'node_modules')), join(dir, 'node_modules'));
    const native = ['native', 'binding.gyp', 'scripts/build-native.mjs'];
    if (
      sameSources(root, commit, native) &&
      copyFiles(join(root, 'build', 'Release'), join(dir, 'build', 'Release'), '.node') > 0
    ) {
      log(`  native addons: this tree's (same sources)`);
    } else {
      log(`  native addons: building (their sources differ from this tree's)`);
      await run(process.execPath, ['scripts/build-native.mjs'], dir);
    }
    if (
      sameSources(root, commit, ['bpf', 'scripts/build-bpf.mjs']) &&
      copyFiles(join(root, 'bpf'), join(dir, 'bpf'), '.o') > 0
    ) {
      log(`  BPF object: this tree's (same sources)`);
    } else {
      log(`  BPF object: building`);
      await run(process.execPath, ['scripts/build-bpf.mjs'], dir);
    }
    log(`  npm run build`);
    await run('npm', ['run', 'build'], dir);
    const bundle = join(dir, 'dist', 'bundle', 'ipvs-node-controller.mjs');
    if (!existsSync(bundle)) throw new Error(`${ref}: npm run build made no ${bundle}`);
    return {
      label: ref === short || commit.startsWith(ref) ? short : `${ref} (${short})`,
      bundle,
      nodeFlags: nodeFlagsOf(dir),
    };
  } catch (err) {
    removeWorktree(root, dir);
    throw err;
  }
}

/** Removes every worktree makeRefBuild put under `workDir`, built in full or not (SIGINT). */
export function removeRefBuilds(root: string, workDir: string): void {
  if (!existsSync(workDir)) return;
  for (const entry of readdirSync(workDir)) if (entry.startsWith('build-')) removeWorktree(root, join(workDir, entry));
}

function removeWorktree(root: string, dir: string): void {
  spawnSync('git', ['worktree', 'remove', '--force', dir], { cwd: root, stdio: 'ignore' });
  rmSync(dir, { recursive: true, force: true });
  spawnSync('git', ['worktree', 'prune'], { cwd: root, stdio: 'ignore' });
}

/** The Dockerfile's `ARG NODE_VERSION` (the image's exact Node.js). */
function imageNodeVersion(root: string): string | undefined {
  try {
    return /^ARG NODE_VERSION=(\d+\.\d+\.\d+)$/m.exec(readFileSync(join(root, 'Dockerfile'), 'utf8'))?.[1];
  } catch {
    return undefined;
  }
}

const NODE_CACHE = join(homedir(), '.cache', 'ipvs-node-controller', 'node');

/** A cached bin/node of `spec` (an exact version, or the highest cached of a major). */
function cachedNode(spec: string): NodeBinary | undefined {
  if (!existsSync(NODE_CACHE)) return undefined;
  const versions = readdirSync(NODE_CACHE)
    .filter((v) => (spec.includes('.') ? v === spec : v.split('.')[0] === spec))
    .filter((v) => existsSync(join(NODE_CACHE, v, 'bin', 'node')))
    .sort((a, b) => a.localeCompare(b, 'en', { numeric: true }));
  const version = versions.at(-1);
  return version ? { label: `Node ${version}`, path: join(NODE_CACHE, version, 'bin', 'node') } : undefined;
}

/** `npm pack node-linux-<arch>@spec` into the cache. */
async function fetchNode(spec: string): Promise<NodeBinary> {
  const pkg = `node-linux-${process.arch}@${spec}`;
  log(`fetching ${pkg} (npm pack)`);
  mkdirSync(NODE_CACHE, { recursive: true });
  const tmp = mkdtempSync(join(NODE_CACHE, '.fetch-'));
  try {
    const packed = JSON.parse(await run('npm', ['pack', '--json', '--pack-destination', tmp, pkg], tmp)) as Array<{
      filename: string;
      version: string;
    }>;
    const { filename, version } = packed[0]!;
    await run('tar', ['-xzf', join(tmp, filename), '-C', tmp], tmp);
    const target = join(NODE_CACHE, version);
    rmSync(target, { recursive: true, force: true });
    mkdirSync(join(target, 'bin'), { recursive: true });
    copyFileSync(join(tmp, 'package', 'bin', 'node'), join(target, 'bin', 'node'));
    chmodSync(join(target, 'bin', 'node'), 0o755);
    return { label: `Node ${version}`, path: join(target, 'bin', 'node') };
  } finally {
    rmSync(tmp, { recursive: true, force: true });
  }
}

/**
 * The Node.js binary `spec` names: '24' (the image's version when the Dockerfile's is a 24),
 * another major or exact version (node-linux-<arch> from npm), 'current', or a path. When it cannot
 * be had, the Node running the bench, with a warning.
 */
export async function nodeBinary(root: string, spec: string): Promise<NodeBinary> {
  const current: NodeBinary = { label: `Node ${process.versions.node}`, path: process.execPath };
  if (spec === 'current') return current;
  if (spec.includes('/')) {
    const version = (await run(spec, ['--version'], root)).replace(/^v/, '');
    return { label: `Node ${version}`, path: spec };
  }
  if (!/^\d+(\.\d+\.\d+)?$/.test(spec))
    throw new Error(`--node: '${spec}' is not a major, a version, 'current' or a path`);
  const image = imageNodeVersion(root);
  const wanted = image && image.split('.')[0] === spec ? image : spec;
  if (wanted === process.versions.node || (!wanted.includes('.') && process.versions.node.split('.')[0] === wanted))
    return current;
  const cached = cachedNode(wanted);
  if (cached) return cached;
  try {
    return await fetchNode(wanted);
  } catch (err) {
    log(
      `WARNING: Node.js ${wanted} cannot be had (${(err as Error).message.split('\n')[0]}): the controller runs under this bench's own Node ${process.versions.node}`,
    );
    return current;
  }
}
