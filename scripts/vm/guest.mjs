// Boots one of Debian's kernels in QEMU (TCG; KVM when asked and /dev/kvm is usable) with
// the host's own root filesystem as the guest's root, and runs one command in it. The root is
// shared read-only over virtio-9p under a tmpfs overlay, so the guest sees the same node, nft,
// iptables, ipvsadm and checkout as the host at the same paths, and nothing it writes reaches the
// host. A second, read-write 9p share (a temporary directory) carries the command in and its exit
// status out; the command's stdout and stderr come back on serial ports of their own, the
// kernel's console on a third (kept for the report when the guest fails).

import { spawn } from 'node:child_process';
import { closeSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ensureInitramfs, ensureKernel } from './kernels.mjs';

const here = dirname(fileURLToPath(import.meta.url));

/** Exit statuses of the runner when the command itself did not give one. */
export const STATUS = { timeout: 124, noStatus: 125 };

const CONSOLE_LINES = 60;

/**
 * QEMU's accelerator: 'tcg' (emulation) unless IPVS_NODE_CONTROLLER_VM_ACCEL=kvm and /dev/kvm
 * opens read-write (GitHub's Linux runners: the workflows ask for it). Not by default: on a
 * machine whose /dev/kvm opens but is itself emulated (a sandbox's), a guest under it made no
 * progress in minutes where TCG boots it in 17 s. With KVM, QEMU is given TCG as its second
 * accelerator, so a /dev/kvm that cannot make a VM (nested virtualisation off) still boots.
 */
export function accelerator() {
  if (process.env.IPVS_NODE_CONTROLLER_VM_ACCEL !== 'kvm') return 'tcg';
  try {
    closeSync(openSync('/dev/kvm', 'r+'));
    return 'kvm';
  } catch {
    return 'tcg';
  }
}

/** Passes `stream`'s lines to `each`, keeping the last `limit` of them in `into`. */
function collect(stream, into, limit, each) {
  let rest = '';
  const take = (text) => {
    const lines = (rest + text).split('\n');
    rest = lines.pop() ?? '';
    for (const line of lines) {
      into.push(line);
      if (into.length > limit) into.shift();
      each?.(line);
    }
  };
  stream.on('data', (chunk) => take(chunk.toString('utf8')));
  stream.on('end', () => take('\n'));
}

/**
 * Listens on a unix socket for qemu's one connection, handing it to `onSocket`. finish() resolves
 * once that connection has closed, or at once when qemu never connected.
 */
async function serve(path, onSocket) {
  let connection;
  const server = createServer((socket) => {
    server.close();
    connection = new Promise((resolve) => socket.on('close', resolve));
    onSocket(socket);
  });
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, resolve);
  });
  return {
    finish: async () => {
      server.close();
      await connection;
    },
  };
}

/** Single-quotes a word for sh. */
const quote = (word) => `'${String(word).replaceAll("'", "'\\''")}'`;

/** Environment variables of the caller that reach the command in the guest. */
function passedEnv() {
  const env = {};
  for (const [key, value] of Object.entries(process.env)) {
    if (value === undefined) continue;
    if (
      key === 'CI' ||
      key === 'UPDATE_GOLDEN' ||
      key.startsWith('MOCHA_') ||
      key.startsWith('IPVS_NODE_CONTROLLER_')
    ) {
      env[key] = value;
    }
  }
  return env;
}

/**
 * Runs `command` (an argument vector) in a guest of `kernel` (an entry of KERNELS), in `cwd`.
 * Resolves to { status, reason, bootSeconds, totalSeconds, record } where status is the command's
 * exit status (commandStatus true), or STATUS.timeout / STATUS.noStatus (reason says why) when the
 * guest gave none.
 * `stdout` and `stderr` (anything with write(chunk)) receive the command's output; `onConsole` each line of the kernel's console.
 */
/**
 * An AbortController that SIGINT and SIGTERM abort, stopping the guest; the process then exits
 * with 130 or 143, as a shell reports a command ended by the signal.
 */
export function abortOnStopSignals() {
  const controller = new AbortController();
  for (const sig of ['SIGINT', 'SIGTERM']) {
    process.once(sig, () => {
      console.error(`vm: ${sig}: stopping the guest`);
      controller.abort();
      process.exitCode = sig === 'SIGINT' ? 130 : 143;
    });
  }
  return controller;
}

export async function runInGuest(options) {
  const record = ensureKernel(options.kernel);
  const initramfs = ensureInitramfs(record);
  const results = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-vm-'));
  const socketDir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-vm-serial-'));
  try {
    return await boot({ ...options, record, initramfs, results, socketDir });
  } finally {
    rmSync(results, { recursive: true, force: true });
    rmSync(socketDir, { recursive: true, force: true });
  }
}

async function boot({
  record,
  initramfs,
  results,
  socketDir,
  command,
  cwd = process.cwd(),
  env = {},
  timeoutSeconds = 1800,
  memoryMiB = 3072,
  cpus = 2,
  stdout = process.stdout,
  stderr = process.stderr,
  onConsole = () => {},
  signal,
}) {
  const sockets = { console: join(socketDir, 'console'), out: join(socketDir, 'out'), err: join(socketDir, 'err') };
  const qemuOutput = [];
  const consoleTail = [];
  // Each serial port is a unix socket qemu connects to; a stream is over when qemu closes it.
  const streams = await Promise.all([
    serve(sockets.console, (socket) => collect(socket, consoleTail, CONSOLE_LINES, onConsole)),
    serve(sockets.out, (socket) => socket.on('data', (chunk) => stdout.write(chunk))),
    serve(sockets.err, (socket) => socket.on('data', (chunk) => stderr.write(chunk))),
  ]);
  const started = Date.now();
  const environment = {
    ...passedEnv(),
    ...env,
    HOME: '/root',
    TERM: 'dumb',
    LANG: 'C.UTF-8',
    PATH: `${dirname(process.execPath)}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin`,
  };
  const script = [
    ...Object.entries(environment).map(([k, v]) => `export ${k}=${quote(v)}`),
    `cd ${quote(cwd)} || exit 126`,
    `exec ${command.map(quote).join(' ')}`,
    '',
  ].join('\n');
  writeFileSync(join(results, 'command'), script);

  const append = [
    'console=ttyS0',
    'panic=-1',
    'loglevel=4',
    'oops=panic',
    'rdinit=/init',
    `ivc_init=${join(here, 'guest-init.sh')}`,
    `ivc_modules=${record.modules}`,
  ].join(' ');
  const args = [
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    // -cpu max: the host's CPU under KVM, every feature TCG emulates under TCG.
    ...(accelerator() === 'kvm' ? ['-accel', 'kvm'] : []),
    '-accel',
    'tcg,thread=multi',
    '-cpu',
    'max',
    '-smp',
    String(cpus),
    '-m',
    String(memoryMiB),
    '-no-reboot',
    '-kernel',
    record.vmlinuz,
    '-initrd',
    initramfs,
    '-append',
    append,
    '-chardev',
    `socket,id=console,path=${sockets.console}`,
    '-serial',
    'chardev:console',
    '-chardev',
    `socket,id=out,path=${sockets.out}`,
    '-serial',
    'chardev:out',
    '-chardev',
    `socket,id=err,path=${sockets.err}`,
    '-serial',
    'chardev:err',
    '-virtfs',
    'local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap',
    '-virtfs',
    `local,path=${results},mount_tag=results,security_model=none`,
    '-device',
    'virtio-rng-pci',
  ];

  const qemu = spawn('qemu-system-x86_64', args, { stdio: ['ignore', 'pipe', 'pipe'] });
  collect(qemu.stdout, qemuOutput, 40);
  collect(qemu.stderr, qemuOutput, 40);

  let bootSeconds;
  const bootPoll = setInterval(() => {
    if (bootSeconds === undefined && existsSync(join(results, 'booted'))) bootSeconds = (Date.now() - started) / 1000;
  }, 250);
  let timedOut = false;
  let aborted = false;
  const timer = setTimeout(() => {
    timedOut = true;
    qemu.kill('SIGKILL');
  }, timeoutSeconds * 1000);
  const abort = () => {
    aborted = true;
    qemu.kill('SIGKILL');
  };
  signal?.addEventListener('abort', abort, { once: true });

  const exit = await new Promise((resolve) => {
    qemu.on('error', (err) => resolve({ code: null, error: err }));
    qemu.on('close', (code, sig) => resolve({ code, sig }));
  });
  clearTimeout(timer);
  // What qemu wrote before it exited is still on its way: wait for each stream's end.
  await Promise.all(streams.map((s) => s.finish()));
  clearInterval(bootPoll);
  signal?.removeEventListener('abort', abort);
  if (bootSeconds === undefined && existsSync(join(results, 'booted'))) bootSeconds = (Date.now() - started) / 1000;
  const totalSeconds = (Date.now() - started) / 1000;
  const statusFile = join(results, 'status');
  const missing = existsSync(join(results, 'modules-missing'))
    ? readFileSync(join(results, 'modules-missing'), 'utf8').trim().split('\n').filter(Boolean)
    : [];
  const status = existsSync(statusFile) ? Number(readFileSync(statusFile, 'utf8').trim()) : undefined;

  const outcome = { bootSeconds, totalSeconds, record, missingModules: missing };
  if (exit.error) return { ...outcome, status: STATUS.noStatus, reason: `qemu did not start: ${exit.error.message}` };
  if (aborted) return { ...outcome, status: STATUS.noStatus, reason: 'interrupted: qemu killed' };
  if (timedOut) {
    return {
      ...outcome,
      status: STATUS.timeout,
      reason: `timed out after ${timeoutSeconds} s (qemu killed); the console's last lines:\n${consoleTail.join('\n')}`,
    };
  }
  if (status === undefined || !Number.isInteger(status)) {
    const panic = consoleTail.some((l) => /Kernel panic/.test(l));
    const how = exit.sig ? `killed by ${exit.sig}` : `exit ${exit.code}`;
    return {
      ...outcome,
      status: STATUS.noStatus,
      reason:
        `the guest ended without the command's exit status (${panic ? 'kernel panic, ' : ''}qemu ${how})` +
        `; qemu said:\n${qemuOutput.join('\n')}\nthe console's last lines:\n${consoleTail.join('\n')}`,
    };
  }
  return { ...outcome, status, reason: '', commandStatus: true };
}
