#!/usr/bin/env node
// Compiles the eBPF backend's object: bpf/ipvs_node_controller.bpf.c -> bpf/ipvs_node_controller.bpf.o,
// beside its source (build/ is node-gyp's and is wiped by every rebuild).
// A missing clang or missing libbpf headers is not an error: the object is skipped with one line
// naming what to install, and the ebpf backend's probe says it is not built. A compile error with
// everything present is a bug: it fails loudly. The addon (binding.gyp target ebpf_addon) is
// built by node-gyp when pkg-config finds libbpf; this script says so in one line when it does not.

import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

const packageRoot = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const source = join(packageRoot, 'bpf', 'ipvs_node_controller.bpf.c');
const output = join(packageRoot, 'bpf', 'ipvs_node_controller.bpf.o');
const clang = process.env.CLANG || 'clang';
const say = (line) => console.warn(`ipvs-node-controller: ${line}`);

function run(command, args) {
  return spawnSync(command, args, { encoding: 'utf8' });
}

/** Debian's multiarch directory names, by Node's name of the machine. */
const MULTIARCH_BY_ARCH = {
  x64: 'x86_64-linux-gnu',
  arm64: 'aarch64-linux-gnu',
  arm: 'arm-linux-gnueabihf',
  ppc64: 'powerpc64le-linux-gnu',
  s390x: 's390x-linux-gnu',
  riscv64: 'riscv64-linux-gnu',
  ia32: 'i386-linux-gnu',
};

/**
 * The host's multiarch triple (x86_64-linux-gnu): asm/types.h lives under /usr/include/<triple>.
 * Not from clang: `clang -print-multiarch` is an error from clang 19 on (Debian trixie).
 */
function multiarchTriple() {
  for (const [command, args] of [
    ['dpkg-architecture', ['-qDEB_HOST_MULTIARCH']],
    ['gcc', ['-print-multiarch']],
  ]) {
    const result = run(command, args);
    const triple = result.status === 0 ? result.stdout.trim() : '';
    if (triple) return triple;
  }
  return MULTIARCH_BY_ARCH[process.arch] ?? '';
}

/** Include directories for the system headers (asm/types.h lives under the multiarch directory). */
function includeDirs() {
  const dirs = [];
  const triple = multiarchTriple();
  if (triple && existsSync(join('/usr/include', triple))) dirs.push(join('/usr/include', triple));
  const pkg = run('pkg-config', ['--cflags-only-I', 'libbpf']);
  if (pkg.status === 0) {
    for (const flag of pkg.stdout.trim().split(/\s+/)) if (flag.startsWith('-I')) dirs.push(flag.slice(2));
  }
  return dirs;
}

function main() {
  if (run('pkg-config', ['--exists', 'libbpf']).status !== 0) {
    say(
      'libbpf not found by pkg-config: install the Debian packages pkg-config and libbpf-dev to build the eBPF addon (--backend=ebpf)',
    );
  }
  const version = run(clang, ['--version']);
  if (version.error || version.status !== 0) {
    say(`eBPF object not built: '${clang}' not found (install clang to use --backend=ebpf)`);
    return 0;
  }
  const dirs = includeDirs();
  const hasHeader = (rel) => ['/usr/include', ...dirs].some((d) => existsSync(join(d, rel)));
  if (!hasHeader('bpf/bpf_helpers.h')) {
    say('eBPF object not built: bpf/bpf_helpers.h not found (install libbpf-dev to use --backend=ebpf)');
    return 0;
  }
  if (!hasHeader('linux/bpf.h') || !hasHeader('asm/types.h')) {
    say('eBPF object not built: kernel UAPI headers not found (install linux-libc-dev to use --backend=ebpf)');
    return 0;
  }
  const args = ['-O2', '-g', '-target', 'bpf', '-Wall', ...dirs.map((d) => `-I${d}`), '-c', source, '-o', output];
  const result = spawnSync(clang, args, { stdio: 'inherit' });
  if (result.status !== 0) {
    say(`eBPF object failed to compile: ${clang} ${args.join(' ')}`);
    return 1;
  }
  say(`eBPF object built: ${output}`);
  return 0;
}

process.exit(main());
