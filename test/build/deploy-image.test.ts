// The Dockerfile, checked without a container runtime: its base images and packages, that what
// it copies exists and is not excluded by .dockerignore, its labels and version, and that the
// bundle it ships runs from a layout without node_modules. The image itself is built and run
// under the DaemonSet by the container suite (test/container).

import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readFile, readdir, rm, stat } from 'node:fs/promises';
import { isBuiltin } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { NODE_FLAGS } from '../../testbed/shipped-controller.js';

const run = promisify(execFile);
const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');

interface Stage {
  from: string;
  name?: string;
  workdir?: string;
  instructions: Array<{ op: string; args: string }>;
}

/** Dockerfile instructions by stage; line continuations joined, comments dropped. */
function parseDockerfile(text: string): Stage[] {
  const logical = text
    .replace(/\\\n/g, ' ')
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith('#'));
  const stages: Stage[] = [];
  for (const line of logical) {
    const [op, ...rest] = line.split(/\s+/);
    const args = rest.join(' ');
    if (op === 'FROM') {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?$/i.exec(args)!;
      stages.push({ from: m[1]!, name: m[2], instructions: [] });
      continue;
    }
    const stage = stages.at(-1);
    if (!stage) continue; // the ARGs before the first FROM
    if (op === 'WORKDIR') stage.workdir = args;
    stage.instructions.push({ op: op!, args });
  }
  return stages;
}

function copies(stage: Stage, fromStage?: string): Array<{ sources: string[]; dest: string }> {
  return stage.instructions
    .filter((i) => i.op === 'COPY')
    .map((i) => i.args.split(/\s+/))
    .filter((words) => (fromStage ? words[0] === `--from=${fromStage}` : !words[0]!.startsWith('--from=')))
    .map((words) => {
      const paths = words.filter((w) => !w.startsWith('--'));
      return { sources: paths.slice(0, -1), dest: paths.at(-1)! };
    });
}

function aptPackages(stage: Stage): string[] {
  const install = stage.instructions.find((i) => i.op === 'RUN' && i.args.includes('apt-get install'));
  if (!install) expect.fail(`stage ${stage.name ?? stage.from} installs no packages`);
  const after = install.args.split('apt-get install')[1]!.split('&&')[0]!;
  return after.split(/\s+/).filter((w) => w && !w.startsWith('-'));
}

/** A minimal .dockerignore matcher for the patterns used here: exact paths, dir/, and `*` globs. */
function ignoredBy(patterns: string[], path: string): boolean {
  return patterns.some((p) => {
    const re = new RegExp(`^${p.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '[^/]*')}(/.*)?$`);
    return re.test(path);
  });
}

describe('Dockerfile', function () {
  this.timeout(60_000);
  let text: string;
  let stages: Stage[];
  let ignore: string[];

  before(async () => {
    text = await readFile(join(repoRoot, 'Dockerfile'), 'utf8');
    stages = parseDockerfile(text);
    ignore = (await readFile(join(repoRoot, '.dockerignore'), 'utf8'))
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith('#'));
  });

  it('builds on BUILD_IMAGE (node:24-trixie) and runs on RUNTIME_IMAGE (debian:trixie-slim), both build arguments', () => {
    expect(text).to.match(/^ARG BUILD_IMAGE=node:24-trixie$/m);
    expect(text).to.match(/^ARG RUNTIME_IMAGE=debian:trixie-slim$/m);
    expect(stages).to.have.lengthOf(2);
    const [build, runtime] = stages as [Stage, Stage];
    expect(build.from).to.equal('${BUILD_IMAGE}');
    expect(build.name).to.equal('build');
    expect(runtime.from).to.equal('${RUNTIME_IMAGE}');
    for (const p of ['libnftables-dev', 'libbpf-dev', 'clang', 'pkg-config', 'g++', 'make', 'python3'])
      expect(aptPackages(build), p).to.include(p);
  });

  it('runtime: nft, iptables, conntrack and the two libraries; no compiler, npm or node-gyp', () => {
    const runtime = stages[1]!;
    const packages = aptPackages(runtime);
    for (const p of ['nftables', 'iptables', 'libnftables1', 'libbpf1', 'conntrack']) expect(packages, p).to.include(p);
    for (const p of ['gcc', 'g++', 'clang', 'make', 'npm', 'nodejs', 'python3', 'node-gyp'])
      expect(packages, `${p} in the runtime`).to.not.include(p);
    const fromBuild = copies(runtime, 'build').flatMap((c) => c.sources);
    expect(fromBuild.sort(), 'only Node.js itself and the assembled files').to.deep.equal([
      '/out/',
      '/usr/local/bin/node',
    ]);
    expect(runtime.instructions.map((i) => i.args).join('\n'), 'no node_modules at run time').to.not.match(
      /node_modules/,
    );
    const entrypoint = JSON.parse(runtime.instructions.find((i) => i.op === 'ENTRYPOINT')!.args) as string[];
    expect(entrypoint, "package.json's ipvsNodeController.nodeFlags, then the bundle").to.deep.equal([
      'node',
      ...NODE_FLAGS,
      '/opt/ipvs-node-controller/dist/bundle/ipvs-node-controller.mjs',
    ]);
  });

  it('labels the image (OCI version, revision, source, licenses) with the version of package.json', async () => {
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as {
      version: string;
      license: string;
    };
    for (const key of ['version', 'revision', 'source', 'licenses']) {
      expect(text, key).to.match(new RegExp(`org\\.opencontainers\\.image\\.${key}=`));
    }
    expect(text).to.match(new RegExp(`org\\.opencontainers\\.image\\.licenses="${pkg.license}"`));
    expect(text).to.match(new RegExp(`^ARG VERSION=${pkg.version.replace(/\./g, '\\.')}$`, 'm'));
  });

  it('never fetches a tool on the fly: no npx without --no-install in the Dockerfile, the scripts or package.json', async () => {
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as {
      scripts: Record<string, string>;
    };
    const scripts = await readdir(join(repoRoot, 'scripts'), { recursive: true, withFileTypes: true });
    const texts = [text, ...Object.values(pkg.scripts)];
    for (const f of scripts) if (f.isFile()) texts.push(await readFile(join(f.parentPath, f.name), 'utf8'));
    texts.push(await readFile(join(repoRoot, '.ci', 'run'), 'utf8'));
    for (const t of texts) {
      for (const m of t.matchAll(/\bnpx\s+(\S+)/g)) expect(m[1], `npx ${m[1]} may download`).to.equal('--no-install');
    }
  });

  it('copies from the context only files that exist and that .dockerignore lets through', async () => {
    for (const { sources } of copies(stages[0]!)) {
      for (const source of sources) {
        await stat(join(repoRoot, source)); // throws when missing
        expect(ignoredBy(ignore, source.replace(/\/$/, '')), `${source} is excluded by .dockerignore`).to.equal(false);
      }
    }
    for (const excluded of ['node_modules', 'dist', 'build', 'bpf/ipvs_node_controller.bpf.o', '.git']) {
      expect(ignoredBy(ignore, excluded), `${excluded} is sent to the build`).to.equal(true);
    }
  });

  it('the bundle imports nothing but Node.js built-ins, and runs from the image layout without node_modules', async () => {
    const bundle = join(repoRoot, 'dist', 'bundle');
    const files = (await readdir(bundle, { recursive: true })).filter((f) => f.endsWith('.mjs'));
    expect(files.length).to.be.at.least(1);
    for (const f of files) {
      const code = await readFile(join(bundle, f), 'utf8');
      for (const m of code.matchAll(/(?:\bfrom\s*|\bimport\s*\(\s*|\brequire\s*\(\s*)["']([^"']+)["']/g)) {
        const spec = m[1]!;
        if (!/^(?:node:)?[@a-z0-9_./][\w./@-]*$/.test(spec) || spec === '.' || /^\.[^/.]/.test(spec)) continue; // prose, not a module
        expect(spec.startsWith('./') || spec.startsWith('../') || isBuiltin(spec), `${f} loads ${spec}`).to.equal(true);
      }
    }
    // The layout the build stage assembles in /out (package.json, the bundle, addons, BPF object).
    const image = await mkdtemp(join(tmpdir(), 'image-layout-'));
    try {
      await cp(join(repoRoot, 'package.json'), join(image, 'package.json'));
      await mkdir(join(image, 'dist'), { recursive: true });
      await cp(bundle, join(image, 'dist', 'bundle'), { recursive: true });
      const main = join(image, 'dist', 'bundle', 'ipvs-node-controller.mjs');
      const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
      expect((await run(process.execPath, [main, '--version'])).stdout.trim()).to.equal(pkg.version);
      expect((await run(process.execPath, [main, '--help'])).stdout).to.match(/--metrics-bind-address/);
      const dry = await run(process.execPath, [
        main,
        '--dry-run',
        '--from-file',
        join(repoRoot, 'examples', 'services.yaml'),
      ]);
      expect(dry.stdout).to.match(/table ip ipvs-node-controller/);
      expect(
        (await stat(join(bundle, 'THIRD_PARTY_LICENSES.txt'))).size,
        "the bundled packages' licenses ship",
      ).to.be.above(1000);
    } finally {
      await rm(image, { recursive: true, force: true });
    }
  });
});
