// `npm run demo`: ipvs-node-controller on a machine without a cluster (root needed).
//
// The node, its pods, the second node with the endpoint, the API stand-in and the controller all run in a
// network and mount namespace of their own (demo/node.ts, started under `unshare`); the
// machine's firewall, routes and interfaces are never touched. A tmpfs on /run/netns inside that
// mount namespace holds the pods' `ip netns` names: without it `ip netns add` would create its
// files in the machine's /run/netns (only the bind mount on them stays private), broken entries
// on the host while the demo runs and leftovers after a crash. This launcher only relays three
// loopback ports into that namespace through Unix sockets (the API for kubectl, /metrics and the
// health endpoints for curl), and removes its temporary directory at the end. Ctrl-C stops it all.

import { spawn, spawnSync } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import type net from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { relayTcpToUnix } from './relay.js';

const here = dirname(fileURLToPath(import.meta.url));
const NODE_SCRIPT = join(here, 'node.js');
/** The pods' namespace names (demo/cluster.ts); older demos left them in the machine's /run/netns. */
const POD_NETNS = ['demo-pod-a', 'demo-pod-b'];

// Output may go to a pipe whose reader is gone (`npm start | tee log`, Ctrl-C): never a crash.
process.stdout.on('error', () => undefined);
process.stderr.on('error', () => undefined);

function fail(line: string): never {
  process.stderr.write(`demo: ${line}\n`);
  process.exit(2);
}

/** Names an earlier demo (before the private /run/netns) left behind, with how to remove them. */
function reportLeftovers(): void {
  let names: string[];
  try {
    names = readdirSync('/run/netns').filter((n) => POD_NETNS.includes(n));
  } catch {
    return;
  }
  if (names.length === 0) return;
  process.stderr.write(
    `demo: ${names.map((n) => `/run/netns/${n}`).join(' and ')} ${names.length > 1 ? 'are' : 'is'} left over` +
      ' from an earlier run of the demo; it no longer gets in the way, remove it with: ' +
      names.map((n) => `sudo ip netns delete ${n}`).join('; ') +
      '\n',
  );
}

async function main(): Promise<number> {
  if (process.getuid?.() !== 0)
    fail(
      'the demo needs root for its network namespaces and nftables: run `sudo npm start`' +
        ' (or `npm run preview` for a --dry-run of example Services, without root)',
    );
  for (const tool of ['unshare', 'ip', 'nft']) {
    if (spawnSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' }).status !== 0) {
      fail(`'${tool}' is missing: run \`sudo bash scripts/install-system-packages.sh\``);
    }
  }
  if (!existsSync(join(here, '..', 'bundle', 'ipvs-node-controller.mjs')))
    fail('the controller is not built: run `npm run build`');
  reportLeftovers();

  const workdir = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-demo-'));
  const uid = Number(process.env.SUDO_UID);
  const gid = Number(process.env.SUDO_GID);
  if (Number.isInteger(uid) && uid > 0 && Number.isInteger(gid)) chownSync(workdir, uid, gid);
  const relays: net.Server[] = [];
  try {
    const ports: Record<string, number> = {};
    for (const [name, preferred] of [
      ['api', 6443],
      ['metrics', 9477],
      ['healthz', 9478],
    ] as const) {
      const relay = await relayTcpToUnix(preferred, join(workdir, `${name}.sock`));
      relays.push(relay.server);
      ports[name] = relay.port;
    }
    const child = spawn(
      'unshare',
      [
        '--net',
        '--mount',
        '--propagation',
        'private',
        '--',
        'sh',
        '-c',
        'mkdir -p /run/netns && mount -t tmpfs -o mode=0755 ipvs-node-controller-demo /run/netns && exec "$0" "$@"',
        process.execPath,
        NODE_SCRIPT,
        `--workdir=${workdir}`,
        `--api-port=${ports.api}`,
        `--metrics-port=${ports.metrics}`,
        `--healthz-port=${ports.healthz}`,
      ],
      { stdio: 'inherit' },
    );
    // Ctrl-C reaches every process of the terminal's group; a signal sent to this process alone
    // (kill, a test) is passed on. The node side tears down and exits; this side waits for it.
    let forwarded = false;
    const forward = (signal: NodeJS.Signals) => {
      if (forwarded) return;
      forwarded = true;
      child.kill(signal);
    };
    process.on('SIGINT', () => forward('SIGINT'));
    process.on('SIGTERM', () => forward('SIGTERM'));
    const code = await new Promise<number>((resolve) =>
      child.on('exit', (c, signal) => resolve(c ?? (signal ? 1 : 0))),
    );
    return code;
  } finally {
    for (const r of relays) r.close();
    rmSync(workdir, { recursive: true, force: true });
  }
}

main().then(
  (code) => process.exit(code),
  (err: unknown) => {
    process.stderr.write(`demo: ${(err as Error).message}\n`);
    process.exit(1);
  },
);
