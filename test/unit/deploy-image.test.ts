// The Dockerfile, checked without a container runtime: its stages and packages, that what it
// copies exists and is not excluded by .dockerignore, and that the runtime layout it assembles
// (replayed here from this checkout's build) runs the CLI and finds both addons and the BPF object.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readFile, readdir, rm, stat, symlink } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

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
    const stage = stages.at(-1)!;
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
  assert.ok(install, `stage ${stage.name ?? stage.from} installs no packages`);
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
  let stages: Stage[];
  let ignore: string[];

  before(async () => {
    stages = parseDockerfile(await readFile(join(repoRoot, 'Dockerfile'), 'utf8'));
    ignore = (await readFile(join(repoRoot, '.dockerignore'), 'utf8'))
      .split('\n')
      .map((l) => l.trim())
      .filter((l) => l && !l.startsWith('#'));
  });

  it('builds on node:20-bookworm with the -dev packages and clang, and runs on node:20-bookworm-slim with nft and iptables', () => {
    assert.equal(stages.length, 2);
    const [build, runtime] = stages as [Stage, Stage];
    assert.equal(build.from, 'node:20-bookworm');
    assert.equal(build.name, 'build');
    for (const p of ['libnftables-dev', 'libbpf-dev', 'clang', 'pkg-config'])
      assert.ok(aptPackages(build).includes(p), p);
    assert.equal(runtime.from, 'node:20-bookworm-slim');
    for (const p of ['nftables', 'iptables', 'libnftables1', 'libbpf1']) assert.ok(aptPackages(runtime).includes(p), p);
    assert.equal(process.versions.node.split('.')[0], '20', 'the image runs the Node.js major the tests run on');
  });

  it('copies from the context only files that exist and that .dockerignore lets through', async () => {
    for (const { sources } of copies(stages[0]!)) {
      for (const source of sources) {
        await stat(join(repoRoot, source)); // throws when missing
        assert.ok(!ignoredBy(ignore, source.replace(/\/$/, '')), `${source} is excluded by .dockerignore`);
      }
    }
    for (const excluded of ['node_modules', 'dist', 'build', 'bpf/ipvs_node_controller.bpf.o', '.git']) {
      assert.ok(ignoredBy(ignore, excluded), `${excluded} is sent to the build`);
    }
  });

  it('imports at run time only production dependencies (the image prunes the others)', async () => {
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as {
      dependencies: Record<string, string>;
    };
    const files = (await readdir(join(repoRoot, 'dist', 'src'), { recursive: true })).filter((f) => f.endsWith('.js'));
    assert.ok(files.length > 10);
    const imported = new Set<string>();
    for (const f of files) {
      const text = await readFile(join(repoRoot, 'dist', 'src', f), 'utf8');
      for (const m of text.matchAll(/(?:from\s+|import\()\s*['"]([^'".][^'"]*)['"]/g)) {
        const spec = m[1]!;
        if (spec.startsWith('node:')) continue;
        imported.add(spec.startsWith('@') ? spec.split('/').slice(0, 2).join('/') : spec.split('/')[0]!);
      }
    }
    for (const name of imported)
      assert.ok(name in pkg.dependencies, `${name} is imported by dist/src but not a dependency`);
    assert.ok(imported.has('prom-client') && imported.has('@kubernetes/client-node'));
  });

  it('assembles a runtime layout that runs the CLI and finds both addons and the BPF object', async () => {
    const runtime = stages[1]!;
    const workdir = runtime.workdir!;
    const entrypoint = JSON.parse(runtime.instructions.find((i) => i.op === 'ENTRYPOINT')!.args) as string[];
    const image = await mkdtemp(join(tmpdir(), 'image-layout-'));
    try {
      // Replay COPY --from=build with this checkout standing in for the build stage's /src.
      for (const { sources, dest } of copies(runtime, 'build')) {
        const target = join(image, dest.startsWith('/') ? relative(workdir, dest) : dest);
        for (const source of sources) {
          const from = join(repoRoot, relative('/src', source));
          const into = dest.endsWith('/') ? join(target, source.split('/').at(-1)!) : target;
          await mkdir(dirname(into), { recursive: true });
          if (source === '/src/node_modules')
            await symlink(from, into); // pruned in the image; the full tree here
          else await cp(from, into, { recursive: true });
        }
      }
      assert.equal(entrypoint[0], 'node');
      const main = join(image, relative(workdir, entrypoint[1]!));
      const help = await run(process.execPath, [main, '--help']);
      assert.match(help.stdout, /--metrics-bind-address/);
      const dry = await run(process.execPath, [
        main,
        '--dry-run',
        '--from-file',
        join(repoRoot, 'examples', 'services.yaml'),
      ]);
      assert.match(dry.stdout, /table ip ipvs-node-controller/);
      const probe = [
        `const nft = await import(${JSON.stringify(join(image, 'dist/src/backends/nft/addon-executor.js'))});`,
        `const bpf = await import(${JSON.stringify(join(image, 'dist/src/backends/ebpf/native.js'))});`,
        `const fs = await import('node:fs');`,
        `const load = nft.loadNftAddon();`,
        `console.log(JSON.stringify({ nft: load.executor ? 'addon' : load.reason, addonPath: nft.defaultAddonPath(),`,
        `  ebpfAddon: fs.existsSync(bpf.defaultAddonPath()) && bpf.defaultAddonPath(),`,
        `  object: fs.existsSync(bpf.defaultObjectPath()) && bpf.defaultObjectPath() }));`,
      ].join('\n');
      const found = JSON.parse((await run(process.execPath, ['--input-type=module', '-e', probe])).stdout) as Record<
        string,
        string
      >;
      assert.equal(found.nft, 'addon');
      assert.equal(found.addonPath, join(image, 'build/Release/nftables_addon.node'));
      assert.equal(found.ebpfAddon, join(image, 'build/Release/ebpf_addon.node'));
      assert.equal(found.object, join(image, 'bpf/ipvs_node_controller.bpf.o'));
    } finally {
      await rm(image, { recursive: true, force: true });
    }
  });
});
