#!/usr/bin/env node
// Builds the native addons of binding.gyp (npm runs this as the package's install script).
// A missing system library or build tool is not an error: that addon is skipped with one line
// naming the Debian package to install, and the controller uses its fallback. A build that
// fails although everything it needs is present is an error: that is a bug to see, not hide.

import { spawnSync } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const say = (line) => console.warn(`ipvs-node-controller: ${line}`);

/** One entry per binding.gyp target; binding.gyp declares a target only when pkg-config finds its library. */
const NATIVE_LIBRARIES = [
  {
    pkgConfigName: 'libnftables',
    debianPackage: 'libnftables-dev',
    addon: 'in-process nftables addon',
    fallback: 'the `nft` CLI will be used',
  },
  {
    pkgConfigName: 'libmnl',
    debianPackage: 'libmnl-dev',
    addon: 'conntrack addon',
    fallback: 'stale conntrack entries are deleted by the `conntrack` command',
  },
  {
    pkgConfigName: 'libbpf',
    debianPackage: 'libbpf-dev',
    addon: 'eBPF addon',
    fallback: '--backend=ebpf is not available',
  },
];

function succeeds(command, args) {
  const result = spawnSync(command, args, { stdio: 'ignore' });
  return result.error === undefined && result.status === 0;
}

/** Node's own headers: npm's nodedir setting when given, else the ones installed beside this node binary. */
function nodeHeadersDir() {
  if (process.env.npm_config_nodedir) return process.env.npm_config_nodedir;
  const prefix = dirname(dirname(process.execPath));
  const installed = join(prefix, 'include', 'node');
  return existsSync(join(installed, 'node_api.h')) && existsSync(join(installed, 'common.gypi')) ? prefix : undefined;
}

/** Our node-gyp dependency, else the one npm bundles (npm names it in the environment of scripts). */
function nodeGypScript() {
  try {
    return createRequire(join(packageRoot, 'package.json')).resolve('node-gyp/bin/node-gyp.js');
  } catch {
    return process.env.npm_config_node_gyp;
  }
}

function main() {
  const havePkgConfig = succeeds('pkg-config', ['--version']);
  const present = NATIVE_LIBRARIES.filter(
    (lib) => havePkgConfig && succeeds('pkg-config', ['--exists', lib.pkgConfigName]),
  );
  for (const lib of NATIVE_LIBRARIES.filter((l) => !present.includes(l))) {
    const missing = havePkgConfig ? `${lib.pkgConfigName} not found by pkg-config` : 'pkg-config not found';
    const install = `install the Debian packages pkg-config and ${lib.debianPackage} to build the ${lib.addon}`;
    say(`${missing}: ${install}; until then ${lib.fallback}.`);
  }
  if (present.length === 0) {
    // Nothing to build: leave no stale addon from an earlier build behind.
    rmSync(join(packageRoot, 'build'), { recursive: true, force: true });
    return 0;
  }

  const missingTools = [
    ['python3', ['--version'], 'python3'],
    ['make', ['--version'], 'make'],
    [process.env.CXX ?? 'c++', ['--version'], 'g++'],
  ].filter(([command, args]) => !succeeds(command, args));
  if (missingTools.length > 0) {
    const packages = missingTools.map(([, , debianPackage]) => debianPackage).join(' ');
    const fallbacks = present.map((l) => l.fallback).join(' and ');
    say(`cannot build native addons: install the Debian packages ${packages}; until then ${fallbacks}.`);
    return 0;
  }

  const nodeGyp = nodeGypScript();
  if (!nodeGyp) {
    say('node-gyp is not installed: run `npm ci` (it is a dependency) and then `npm run build:native`.');
    return 1;
  }
  const headers = nodeHeadersDir();
  const args = [nodeGyp, 'rebuild', '--loglevel=warn', ...(headers ? [`--nodedir=${headers}`] : [])];
  const build = spawnSync(process.execPath, args, { cwd: packageRoot, stdio: 'inherit' });
  if (build.status !== 0) {
    const expectedHeaders = join(dirname(dirname(process.execPath)), 'include', 'node');
    const hint = headers
      ? 'see the compiler output above'
      : `no Node.js headers in ${expectedHeaders}: install Node.js with its headers or set npm's nodedir`;
    say(`building the native addons failed (${hint}).`);
    return 1;
  }
  return 0;
}

process.exitCode = main();
