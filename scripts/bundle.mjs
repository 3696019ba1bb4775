#!/usr/bin/env node
// Bundles the controller's runtime (src/cli/main.ts and everything it imports, dependencies
// included) with esbuild into dist/bundle/: the image ships this instead of node_modules, and the
// kernel and end-to-end tests run it. Only code that runs is loaded: the lazily imported modules
// (the Kubernetes client, metrics) stay in chunks of their own, loaded when first used.
//
// The native addons (build/Release/*.node) and the BPF object (bpf/*.o) are not bundled: the
// bundle finds them from the package root, as dist/ does (the directory above dist/ holding
// package.json).
//
// Stamped in through `define`: the version (package.json) and the revision (env REVISION, else
// `git rev-parse HEAD` of this checkout, else `unknown`).
//
//   node scripts/bundle.mjs            (npm run build runs it after tsc)

import { build } from 'esbuild';
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createRequire } from 'node:module';
import { kubeConfigOnly } from './bundle-kubeconfig.mjs';

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const outdir = join(packageRoot, 'dist', 'bundle');
const pkg = JSON.parse(readFileSync(join(packageRoot, 'package.json'), 'utf8'));

/**
 * `import http from 'node:http'` through require(). An ES module import of a built-in builds the
 * module's whole namespace, which reads every export, and node:http's WebSocket, CloseEvent and
 * MessageEvent are getters that load Node's own undici (and http2): on Node 24 about 6 MiB of
 * resident memory for code the controller never runs. require() returns the exports object and
 * reads only what is used. The stand-in re-exports the plain data properties by name, so a named
 * import of one of them still works, and a named import of a getter fails the build.
 */
const httpThroughRequire = {
  name: 'http-through-require',
  setup(build) {
    build.onResolve({ filter: /^(node:)?http$/ }, (args) =>
      args.kind === 'import-statement' || args.kind === 'dynamic-import'
        ? { path: 'node:http', namespace: 'http-through-require' }
        : undefined,
    );
    build.onLoad({ filter: /.*/, namespace: 'http-through-require' }, () => {
      const http = createRequire(import.meta.url)('node:http');
      const names = Object.entries(Object.getOwnPropertyDescriptors(http))
        .filter(([name, d]) => !d.get && /^[A-Za-z_$][\w$]*$/.test(name))
        .map(([name]) => name);
      return {
        contents: `const http = require('node:http');\nexport default http;\nexport const { ${names.join(', ')} } = http;\n`,
        loader: 'js',
      };
    });
  },
};

function revision() {
  if (process.env.REVISION) return process.env.REVISION;
  const git = spawnSync('git', ['rev-parse', 'HEAD'], { cwd: packageRoot, encoding: 'utf8' });
  if (git.status !== 0) return 'unknown';
  const dirty = spawnSync('git', ['status', '--porcelain', '--untracked-files=no'], {
    cwd: packageRoot,
    encoding: 'utf8',
  });
  return git.stdout.trim() + (dirty.status === 0 && dirty.stdout.trim() !== '' ? '-dirty' : '');
}

/** The npm packages that went into the bundle (their directories under node_modules), sorted. */
function bundledPackages(metafile) {
  const dirs = new Set();
  for (const input of Object.keys(metafile.inputs)) {
    const m = /^(.*node_modules\/(?:@[^/]+\/)?[^/]+)\//.exec(input);
    if (m) dirs.add(m[1]);
  }
  return [...dirs].sort().map((dir) => {
    const abs = join(packageRoot, dir);
    return { dir, abs, manifest: JSON.parse(readFileSync(join(abs, 'package.json'), 'utf8')) };
  });
}

/** The license texts of every package that went into the bundle, for the image's notices. */
function thirdPartyLicenses(packages) {
  const parts = [];
  for (const { abs, manifest } of packages) {
    const licenseFile = readdirSync(abs).find((f) => /^(licen[cs]e|copying)/i.test(f));
    const text = licenseFile ? readFileSync(join(abs, licenseFile), 'utf8').trim() : '(no license file in the package)';
    parts.push(`${manifest.name}@${manifest.version} (${manifest.license ?? 'see text'})\n\n${text}\n`);
  }
  return parts.join('\n' + '-'.repeat(78) + '\n\n');
}

/**
 * The same packages as data, shipped beside the bundle: the release's SBOM lists them from the
 * image itself (scripts/release.mjs). Packages that appear at two versions appear twice.
 */
function bundledPackagesJson(packages) {
  const seen = new Set();
  const list = [];
  for (const { manifest } of packages) {
    const key = `${manifest.name}@${manifest.version}`;
    if (seen.has(key)) continue;
    seen.add(key);
    list.push({ name: manifest.name, version: manifest.version, license: manifest.license ?? null });
  }
  return JSON.stringify(list, null, 1) + '\n';
}

async function main() {
  rmSync(outdir, { recursive: true, force: true });
  const rev = revision();
  const result = await build({
    absWorkingDir: packageRoot,
    entryPoints: { 'ipvs-node-controller': 'src/cli/main.ts' },
    outdir,
    bundle: true,
    splitting: true,
    format: 'esm',
    platform: 'node',
    target: 'node20.19',
    outExtension: { '.js': '.mjs' },
    chunkNames: 'chunks/[name]-[hash]',
    minifyWhitespace: true,
    minifySyntax: true,
    keepNames: true,
    legalComments: 'none',
    metafile: true,
    logLevel: 'warning',
    plugins: [kubeConfigOnly, httpThroughRequire],
    // CommonJS dependencies call require(): give the ESM bundle a real one.
    banner: {
      js: "import { createRequire as __createRequire } from 'node:module'; const require = __createRequire(import.meta.url);",
    },
    define: {
      IPVS_NODE_CONTROLLER_VERSION: JSON.stringify(pkg.version),
      IPVS_NODE_CONTROLLER_REVISION: JSON.stringify(rev),
    },
  });
  const packages = bundledPackages(result.metafile);
  writeFileSync(join(outdir, 'THIRD_PARTY_LICENSES.txt'), thirdPartyLicenses(packages));
  writeFileSync(join(outdir, 'bundled-packages.json'), bundledPackagesJson(packages));
  // Beside the bundle, not in it (the image ships dist/bundle): which modules went into which chunk.
  writeFileSync(join(packageRoot, 'dist', 'bundle-meta.json'), JSON.stringify(result.metafile));
  const bytes = Object.values(result.metafile.outputs).reduce((n, o) => n + o.bytes, 0);
  const entry = join(outdir, 'ipvs-node-controller.mjs');
  if (!existsSync(entry)) throw new Error(`esbuild wrote no ${entry}`);
  // The bundle is run by package.json's bin (bin/ipvs-node-controller.mjs, with the Node flags of
  // ipvsNodeController.nodeFlags), not executed itself: its shebang (of src/cli/main.ts) is dropped
  // so that nobody starts it without those flags by accident.
  writeFileSync(entry, readFileSync(entry, 'utf8').replace(/^#!.*\n/, ''));
  console.log(
    `bundle: ${relative(packageRoot, entry)} (${pkg.version}, revision ${rev}): ` +
      `${Object.keys(result.metafile.outputs).length} files, ${(bytes / 1024).toFixed(0)} KiB`,
  );
}

main().catch((err) => {
  console.error(`bundle failed: ${err.message}`);
  process.exit(1);
});
