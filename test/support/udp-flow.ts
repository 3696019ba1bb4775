// Long-lived UDP flows for conntrack tests: senders with a fixed source port (in a pod namespace
// or on the node) and servers that count the datagrams of each sender.

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import * as dgram from 'node:dgram';
import { fileURLToPath } from 'node:url';

const SENDER = fileURLToPath(new URL('./udp-flow-sender.js', import.meta.url));

/** A sender of one datagram every `intervalMs` from `sourcePort`; `ns` undefined: the node. */
export class UdpFlow {
  private constructor(private readonly child: ChildProcess) {}

  static async start(options: {
    ns?: string;
    address: string;
    port: number;
    sourcePort: number;
    tag: string;
    intervalMs?: number;
  }): Promise<UdpFlow> {
    const args = [
      SENDER,
      options.address,
      String(options.port),
      String(options.sourcePort),
      options.tag,
      String(options.intervalMs ?? 20),
    ];
    const [cmd, argv] = options.ns
      ? ['nsenter', [`--net=/run/netns/${options.ns}`, process.execPath, ...args]]
      : [process.execPath, args];
    const child = spawn(cmd, argv as string[], { stdio: ['ignore', 'pipe', 'inherit'] });
    const [data] = (await Promise.race([once(child.stdout!, 'data'), once(child, 'exit')])) as [unknown];
    if (!Buffer.isBuffer(data)) throw new Error(`the UDP sender ${options.tag} did not start`);
    return new UdpFlow(child);
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = once(this.child, 'exit');
    this.child.kill('SIGKILL');
    await exited;
  }
}

/** A UDP server on one address and port that counts the datagrams of each tag. */
export class CountingUdpServer {
  private readonly counts = new Map<string, number>();

  private constructor(
    readonly name: string,
    private readonly socket: dgram.Socket,
  ) {
    socket.on('message', (msg) => {
      const tag = msg.toString();
      this.counts.set(tag, (this.counts.get(tag) ?? 0) + 1);
    });
  }

  static async start(name: string, address: string, port: number): Promise<CountingUdpServer> {
    const socket = dgram.createSocket(address.includes(':') ? 'udp6' : 'udp4');
    socket.bind(port, address);
    await once(socket, 'listening');
    return new CountingUdpServer(name, socket);
  }

  received(tag: string): number {
    return this.counts.get(tag) ?? 0;
  }

  async stop(): Promise<void> {
    await new Promise<void>((resolve) => this.socket.close(() => resolve()));
  }
}
