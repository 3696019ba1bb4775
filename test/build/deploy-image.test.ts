// The Dockerfile, checked without a container runtime: its base images and packages, that what
// it copies exists and is not excluded by .dockerignore, its labels and version, and that the
// bundle it ships runs from a layout without node_modules. The image itself is built and run
// under the DaemonSet by the container suite (test/container).

import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { access, cp, mkdir, mkdtemp, readFile, readdir, readlink, rm, stat } from 'node:fs/promises';
import { isBuiltin } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { readFileSync } from 'node:fs';
import { LAUNCHER } from '../../testbed/shipped-controller.js';

const run = promisify(execFile);
const exists = (path: string) => access(path).then(
  () => true,
  () => false,
);
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

  it('builds on BUILD_IMAGE (Node.js of the exact NODE_VERSION on trixie) and assembles the runtime from RUNTIME_IMAGE, both build arguments', () => {
    const nodeVersion = /^ARG NODE_VERSION=(\S+)$/m.exec(text)?.[1];
    expect(nodeVersion, 'Node.js pinned exactly: 24.x.y, not 24').to.match(/^24\.\d+\.\d+$/);
    expect(text).to.match(/^ARG BUILD_IMAGE=node:[\d.]+-trixie(-slim)?@sha256:[0-9a-f]{64}$/m);
    expect(text).to.match(/^ARG RUNTIME_IMAGE=debian:trixie-slim@sha256:[0-9a-f]{64}$/m);
    expect(stages.map((s) => [s.from, s.name])).to.deep.equal([
      ['${BUILD_IMAGE}', 'build'],
      ['${RUNTIME_IMAGE}', 'runtime-root'],
      ['scratch', undefined],
    ]);
    for (const p of ['libnftables-dev', 'libbpf-dev', 'clang', 'pkg-config', 'g++', 'make', 'python3'])
      expect(aptPackages(stages[0]!), p).to.include(p);
  });

  it('runtime: only the files of nft, iptables, conntrack, the libraries and node; no compiler, npm, apt, dpkg or shell', () => {
    const [, root, runtime] = stages as [Stage, Stage, Stage];
    const packages = aptPackages(root);
    for (const p of ['nftables', 'iptables', 'libnftables1', 'libbpf1', 'conntrack', 'libstdc++6'])
      expect(packages, p).to.include(p);
    for (const p of ['gcc', 'g++', 'clang', 'make', 'npm', 'nodejs', 'python3', 'node-gyp', 'bash'])
      expect(packages, `${p} in the runtime`).to.not.include(p);
    // The root filesystem is exactly those packages and their dependencies (runtime-rootfs.sh).
    const assemble = root.instructions.find((i) => i.op === 'RUN' && i.args.includes('runtime-rootfs.sh'));
    const named = assemble!.args.split('/rootfs')[1]!.split('&&')[0]!.trim().split(/\s+/);
    expect(named.sort()).to.deep.equal([...packages].sort());
    // The final image: that root filesystem, Node.js and the assembled files, and nothing is installed in it.
    expect(copies(runtime, 'runtime-root').flatMap((c) => c.sources)).to.deep.equal(['/rootfs/']);
    expect(
      copies(runtime, 'build')
        .flatMap((c) => c.sources)
        .sort(),
      'only Node.js itself and the assembled files',
    ).to.deep.equal(['/out/', '/usr/local/bin/node']);
    for (const i of runtime.instructions.filter((i) => i.op === 'RUN')) {
      expect(i.args, 'exec form: the image has no shell').to.match(/^\[/);
      expect(i.args).to.not.match(/apt|dpkg/);
    }
    expect(runtime.instructions.map((i) => i.args).join('\n'), 'no node_modules at run time').to.not.match(
      /node_modules/,
    );
    // The launcher of package.json's bin: the Node flags are defined once, in package.json
    // (test/build/bundle-launcher.test.ts shows what it runs).
    const entrypoint = JSON.parse(runtime.instructions.find((i) => i.op === 'ENTRYPOINT')!.args) as string[];
    expect(entrypoint, "package.json's bin under the image's node").to.deep.equal([
      'node',
      '/opt/ipvs-node-controller/bin/ipvs-node-controller.mjs',
    ]);
    const pkg = JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { bin: Record<string, string> };
    expect(pkg.bin['ipvs-node-controller']).to.equal('bin/ipvs-node-controller.mjs');
    const assembled = stages[0]!.instructions.map((i) => i.args).join('\n');
    expect(assembled, 'the launcher in /out, runnable by the image node').to.include(
      'cp bin/ipvs-node-controller.mjs /out/bin/',
    );
    expect(assembled).to.include("sed -i '1s|^#!/usr/bin/env node$|#!/usr/local/bin/node|' /out/bin/ipvs-node-controller.mjs");
    // `ipvs-node-controller` on PATH is the same launcher.
    expect(root.instructions.map((i) => i.args).join('\n')).to.include(
      'ln -s /opt/ipvs-node-controller/bin/ipvs-node-controller.mjs /rootfs/usr/local/bin/ipvs-node-controller',
    );
  });

  it('runtime-rootfs.sh: the dependency closure of the named packages, their files and alternatives links, and no apt, dpkg or shell', async function () {
    // On this machine's own Debian packages (the image's are trixie's): what the script does is the same.
    const dir = await mkdtemp(join(tmpdir(), 'runtime-rootfs-'));
    try {
      const root = join(dir, 'rootfs');
      const { stdout } = await run('sh', [
        join(repoRoot, 'scripts', 'runtime-rootfs.sh'),
        root,
        'nftables',
        'iptables',
        'libnftables1',
        'libbpf1',
        'conntrack',
        'libstdc++6',
        'netbase',
      ]);
      const packages = stdout.trim().split('\n');
      for (const p of ['nftables', 'iptables', 'conntrack', 'libc6', 'libnftnl11', 'libmnl0', 'libstdc++6'])
        expect(packages, p).to.include(p);
      for (const p of ['apt', 'dpkg', 'bash', 'dash', 'coreutils', 'perl-base']) expect(packages).to.not.include(p);
      const status = await readFile(join(root, 'var', 'lib', 'dpkg', 'status'), 'utf8');
      expect([...status.matchAll(/^Package: (\S+)$/gm)].map((m) => m[1]).sort()).to.deep.equal([...packages].sort());
      for (const f of ['usr/sbin/nft', 'usr/sbin/xtables-nft-multi', 'usr/sbin/conntrack', 'etc/protocols'])
        await stat(join(root, f));
      // iptables through its alternatives link, as on Debian: iptables -> /etc/alternatives/iptables -> xtables-*-multi.
      expect(await readlink(join(root, 'usr', 'sbin', 'iptables'))).to.equal('/etc/alternatives/iptables');
      expect(await readlink(join(root, 'etc', 'alternatives', 'iptables'))).to.match(/^\/usr\/sbin\/iptables-(nft|legacy)$/);
      // libc6 without its iconv modules.
      const multiarch = (await readdir(join(root, 'usr', 'lib'))).filter((d) => d.endsWith('-linux-gnu'));
      expect(multiarch.length).to.equal(1);
      expect(await exists(join(root, 'usr', 'lib', multiarch[0]!, 'libc.so.6'))).to.equal(true);
      expect(await exists(join(root, 'usr', 'lib', multiarch[0]!, 'gconv'))).to.equal(false);
      for (const f of ['usr/bin/apt', 'usr/bin/dpkg', 'usr/bin/sh', 'usr/bin/bash', 'usr/bin/ls']) {
        expect(await exists(join(root, f)), `${f} in the runtime`).to.equal(false);
      }
      // A package whose closure holds dpkg is refused, naming it.
      const refused = await run('sh', [join(repoRoot, 'scripts', 'runtime-rootfs.sh'), join(dir, 'x'), 'apt']).catch(
        (err: { code: number; stderr: string }) => err,
      );
      expect((refused as { code: number }).code).to.equal(1);
      expect((refused as { stderr: string }).stderr).to.match(/runtime-rootfs: (apt|dpkg|debconf|[a-z-]+) would enter the runtime image/);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
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
    // The layout the build stage assembles in /out (package.json, the launcher, the bundle, addons,
    // BPF object), started as the ENTRYPOINT starts it.
    const image = await mkdtemp(join(tmpdir(), 'image-layout-'));
    try {
      await cp(join(repoRoot, 'package.json'), join(image, 'package.json'));
      await mkdir(join(image, 'dist'), { recursive: true });
      await cp(bundle, join(image, 'dist', 'bundle'), { recursive: true });
      await cp(LAUNCHER, join(image, 'bin', 'ipvs-node-controller.mjs'), { recursive: true });
      const main = join(image, 'bin', 'ipvs-node-controller.mjs');
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
