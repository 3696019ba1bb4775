// Processes for the eBPF kernel tests, each started by the test inside a network namespace and,
// for clients and the controller, inside the test's cgroup. Every mode prints one JSON line.
//
//   server <ip> <port> <tag>            TCP + UDP on ip:port; answers "<tag> <client address>"
//   tcp <ip> <port>                     connects, prints { peer (getpeername), reply }
//   udp <ip> <port> [datagrams]         unconnected sends (1 datagram, or that many on one socket),
//                                       prints { from (recvfrom source), reply, replies }
//   udp-connected <ip> <port>           connect + send, prints { peer, from, reply }
//   tcp-loop <ip> <port> <stopFile>     connects one after the other until stopFile exists
//   controller <cgroup> <bpffs> <json>  an Reconciler syncing the given entries, then idle

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { createSocket } from 'node:dgram';
import { existsSync } from 'node:fs';
import { connect, createServer, isIPv6 } from 'node:net';

import { EbpfDriver } from '../../src/backends/ebpf/ebpf-driver.js';
import type { DesiredState, Entry } from '../../src/model/types.js';

const TIMEOUT_MS = 3000;

function print(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

function serve(ip: string, port: number, tag: string): void {
  const tcp = createServer((sock) => {
    sock.end(`${tag} ${sock.remoteAddress}`);
    sock.on('error', () => undefined);
  });
  const udp = createSocket(isIPv6(ip) ? 'udp6' : 'udp4');
  udp.on('message', (_msg, rinfo) => udp.send(`${tag} ${rinfo.address}`, rinfo.port, rinfo.address));
  let bound = 0;
  const ready = () => {
    if (++bound === 2) print({ listening: `${ip}:${port}` });
  };
  tcp.listen(port, ip, ready);
  udp.bind(port, ip, ready);
}

function tcpOnce(
  ip: string,
  port: number,
): Promise<{ peer?: string; peerPort?: number; reply?: string; error?: string }> {
  return new Promise((resolve) => {
    const sock = connect({ host: ip, port });
    let reply = '';
    let peer: string | undefined;
    let peerPort: number | undefined;
    const timer = setTimeout(() => {
      sock.destroy();
      resolve({ error: 'timeout' });
    }, TIMEOUT_MS);
    sock.on('connect', () => {
      peer = sock.remoteAddress;
      peerPort = sock.remotePort;
    });
    sock.on('data', (d) => (reply += d.toString()));
    sock.on('end', () => {
      clearTimeout(timer);
      resolve({ peer, peerPort, reply });
    });
    sock.on('error', (err) => {
      clearTimeout(timer);
      resolve({ error: err.message });
    });
  });
}

function udpOnce(ip: string, port: number, connected: boolean, datagrams = 1): Promise<Record<string, unknown>> {
  return new Promise((resolve) => {
    const sock = createSocket(isIPv6(ip) ? 'udp6' : 'udp4');
    const timer = setTimeout(() => {
      sock.close();
      resolve({ error: 'timeout' });
    }, TIMEOUT_MS);
    const result: Record<string, unknown> = { replies: 0 };
    sock.on('message', (msg, rinfo) => {
      result.replies = (result.replies as number) + 1;
      if ((result.replies as number) < datagrams) return;
      clearTimeout(timer);
      result.from = rinfo.address;
      result.fromPort = rinfo.port;
      result.reply = msg.toString();
      sock.close();
      resolve(result);
    });
    sock.on('error', (err) => {
      clearTimeout(timer);
      resolve({ error: err.message });
    });
    if (connected) {
      sock.connect(port, ip, () => {
        const remote = sock.remoteAddress();
        result.peer = remote.address;
        result.peerPort = remote.port;
        sock.send('ping');
      });
    } else {
      for (let i = 0; i < datagrams; i++) sock.send('ping', port, ip);
    }
  });
}

async function tcpLoop(ip: string, port: number, stopFile: string): Promise<void> {
  const replies: Record<string, number> = {};
  const errors: string[] = [];
  let attempts = 0;
  while (!existsSync(stopFile)) {
    attempts++;
    const r = await tcpOnce(ip, port);
    if (r.error) errors.push(r.error);
    else replies[`${r.peer} ${r.reply?.split(' ')[0]}`] = (replies[`${r.peer} ${r.reply?.split(' ')[0]}`] ?? 0) + 1;
  }
  print({ attempts, replies, errors });
}

async function controller(cgroupPath: string, bpffsPath: string, entriesJson: string): Promise<void> {
  const entries = JSON.parse(entriesJson) as Entry[];
  const desired: DesiredState = {
    ipv4: { entries: entries.filter((e) => e.family === 'ipv4'), localPodMatch: { kind: 'cidrs', cidrs: [] } },
    ipv6: { entries: entries.filter((e) => e.family === 'ipv6'), localPodMatch: { kind: 'cidrs', cidrs: [] } },
    masqueradeMark: 0x4000,
    skips: [],
    conflicts: [],
  };
  const driver = new EbpfDriver({ cgroupPath, bpffsPath });
  const result = await new Reconciler(driver).sync(desired, { full: true });
  const a = driver.lastAttachment!;
  print({
    ready: true,
    mode: result.mode,
    nodeNetnsCookie: String(a.nodeNetnsCookie),
    links: a.programs.map((p) => ({ name: p.name, link: p.link, linkId: p.linkId })),
    maps: a.maps.map((m) => ({ name: m.name, id: m.id, reused: m.reused })),
  });
  // Idle like a controller between syncs, until killed.
  setInterval(() => undefined, 1 << 30);
}

async function main(): Promise<void> {
  const [mode, ...args] = process.argv.slice(2);
  switch (mode) {
    case 'server':
      return serve(args[0]!, Number(args[1]), args[2]!);
    case 'tcp':
      return print(await tcpOnce(args[0]!, Number(args[1])));
    case 'udp':
      return print(await udpOnce(args[0]!, Number(args[1]), false, args[2] === undefined ? 1 : Number(args[2])));
    case 'udp-connected':
      return print(await udpOnce(args[0]!, Number(args[1]), true));
    case 'tcp-loop':
      return tcpLoop(args[0]!, Number(args[1]), args[2]!);
    case 'controller':
      return controller(args[0]!, args[1]!, args[2]!);
    default:
      throw new Error(`unknown mode ${mode}`);
  }
}

main().catch((err: unknown) => {
  print({ fatal: (err as Error).message });
  process.exit(1);
});
