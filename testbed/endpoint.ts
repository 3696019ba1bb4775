// A Service's endpoint elsewhere in the cluster, for the demo and the kernel tests: a process in a
// network namespace of its own (a pod on another node) that answers every TCP connection and every
// UDP datagram with "<name> <client address>", the source address as the endpoint sees it, after
// whatever NAT the path did. Whether a client kept its own address or was masqueraded is what
// kube-proxy's modes, and the controller, decide; this makes it visible. Ports are opened and closed
// while it runs, one command at a time on its stdin; it exits when its stdin closes.

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface, type Interface } from 'node:readline';

/** Runs in the endpoint's namespace (`node -e`): one JSON command a line, one JSON answer a line. */
const SCRIPT = `
const net = require('node:net');
const dgram = require('node:dgram');
const readline = require('node:readline');
const [address] = process.argv.slice(1);
const open = new Map();
const say = (v) => process.stdout.write(JSON.stringify(v) + '\\n');
const lines = readline.createInterface({ input: process.stdin });
lines.on('close', () => process.exit(0));
let queue = Promise.resolve();
lines.on('line', (line) => {
  queue = queue.then(async () => {
    const cmd = JSON.parse(line);
    try {
      if (cmd.op === 'listen') {
        const tcp = net.createServer((s) => {
          s.on('error', () => undefined);
          s.end(cmd.name + ' ' + s.remoteAddress + '\\n');
        });
        await new Promise((resolve, reject) => tcp.once('error', reject).listen(cmd.port, address, resolve));
        const udp = dgram.createSocket(address.includes(':') ? 'udp6' : 'udp4');
        udp.on('message', (_m, r) => udp.send(cmd.name + ' ' + r.address + '\\n', r.port, r.address));
        await new Promise((resolve, reject) => udp.once('error', reject).bind(cmd.port, address, resolve));
        open.set(cmd.port, { tcp, udp });
      } else if (cmd.op === 'close') {
        const o = open.get(cmd.port);
        open.delete(cmd.port);
        if (o) {
          await new Promise((resolve) => o.tcp.close(resolve));
          await new Promise((resolve) => o.udp.close(resolve));
        }
      }
      say({ ok: true });
    } catch (err) {
      say({ ok: false, error: err.message });
    }
  });
});
say({ ok: true, started: true });
`;

export class SourceEchoEndpoint {
  private answers: string[] = [];
  private waiting: Array<(line: string) => void> = [];
  private constructor(
    private readonly child: ChildProcess,
    lines: Interface,
    readonly address: string,
  ) {
    lines.on('line', (line) => {
      const next = this.waiting.shift();
      if (next) next(line);
      else this.answers.push(line);
    });
  }

  /** Starts the endpoint in the `ip netns` namespace `ns`, answering on `address`. */
  static async start(ns: string, address: string): Promise<SourceEchoEndpoint> {
    const child = spawn('nsenter', [`--net=/run/netns/${ns}`, process.execPath, '-e', SCRIPT, address], {
      stdio: ['pipe', 'pipe', 'inherit'],
    });
    const lines = createInterface({ input: child.stdout! });
    const endpoint = new SourceEchoEndpoint(child, lines, address);
    await endpoint.answer('start');
    return endpoint;
  }

  /** Answers on `port` (TCP and UDP) with `name` and the client's address. */
  async listen(port: number, name: string): Promise<void> {
    await this.command({ op: 'listen', port, name });
  }

  async close(port: number): Promise<void> {
    await this.command({ op: 'close', port });
  }

  async stop(): Promise<void> {
    if (this.child.exitCode !== null || this.child.signalCode !== null) return;
    const exited = once(this.child, 'exit');
    this.child.stdin!.end();
    await exited;
  }

  private async command(cmd: Record<string, unknown>): Promise<void> {
    this.child.stdin!.write(`${JSON.stringify(cmd)}\n`);
    await this.answer(String(cmd.op));
  }

  private async answer(what: string): Promise<void> {
    const line = await new Promise<string>((resolve, reject) => {
      const queued = this.answers.shift();
      if (queued !== undefined) return resolve(queued);
      if (this.child.exitCode !== null || this.child.signalCode !== null)
        return reject(new Error(`the endpoint process is gone (${what})`));
      const onExit = () => reject(new Error(`the endpoint process exited (${what})`));
      this.child.once('exit', onExit);
      this.waiting.push((l) => {
        this.child.off('exit', onExit);
        resolve(l);
      });
    });
    const parsed = JSON.parse(line) as { ok: boolean; error?: string };
    if (!parsed.ok) throw new Error(`the endpoint could not ${what}: ${parsed.error}`);
  }
}
