// One first-packet measurement in a network namespace of its own, made fresh for it, so that no
// NAT table or hook of another scenario (iptables-legacy tables cannot be removed from a
// namespace) is in the path. Started by the benchmark as `unshare --net -- node first-packet-lab.js
// SPEC_FILE`; prints one JSON line with the figures of a node client and of a pod client.
//
//   pod namespace (10.244.1.2) --veth-- this namespace, the node --- kube-ipvs0 (bridge, no ports):
//                                                                      the Service's ClusterIP and
//                                                                      LoadBalancer IP

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { isolatedFromMachine, waitForOwnNetworkNamespace } from './namespace.js';

export interface LabSpec {
  connectLoop: string;
  acceptLoop: string;
  ingressIp: string;
  clusterIp: string;
  port: number;
  /** Loads the scenario's rules: `nft -f FILE` or an iptables-restore variant reading FILE. */
  rules: { loader: 'nft' | 'iptables-legacy-restore' | 'iptables-nft-restore'; file: string };
  warmup: number;
  connects: number;
}

export interface ConnectFigures {
  /** First byte the server answered: C (ClusterIP, translated) or E (external IP, not translated). */
  answer: string;
  failures: number;
  p50Us: number;
  p90Us: number;
  p99Us: number;
  meanUs: number;
}

const POD_IP = '10.244.1.2';
const POD_GATEWAY = '10.244.1.1';

function sh(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

async function startServer(program: string, address: string, port: number, tag: string): Promise<ChildProcess> {
  const server = spawn(program, [address, String(port), tag], { stdio: ['ignore', 'pipe', 'inherit'] });
  await new Promise<void>((resolve, reject) => {
    server.once('exit', (code) => reject(new Error(`accept-loop on ${address} exited (${code})`)));
    createInterface({ input: server.stdout! }).once('line', () => resolve());
  });
  return server;
}

async function main(spec: LabSpec): Promise<void> {
  if (!isolatedFromMachine()) throw new Error('first-packet-lab must run in a network namespace of its own');
  const children: ChildProcess[] = [];
  try {
    sh('ip', ['link', 'set', 'lo', 'up']);
    sh('ip', ['link', 'add', 'kube-ipvs0', 'type', 'bridge']);
    sh('ip', ['link', 'set', 'kube-ipvs0', 'up']);
    for (const address of [spec.clusterIp, spec.ingressIp])
      sh('ip', ['addr', 'add', `${address}/32`, 'dev', 'kube-ipvs0']);

    // The pod: a namespace held open by a sleeping process (no /run/netns entry to clean up).
    const pod = spawn('unshare', ['--net', '--', 'sleep', 'infinity'], { stdio: 'ignore' });
    children.push(pod);
    await waitForOwnNetworkNamespace(pod.pid!);
    const inPod = ['nsenter', `--net=/proc/${pod.pid}/ns/net`, '--'];
    sh('ip', ['link', 'add', 'veth-pod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', String(pod.pid)]);
    sh('ip', ['addr', 'add', `${POD_GATEWAY}/24`, 'dev', 'veth-pod']);
    sh('ip', ['link', 'set', 'veth-pod', 'up']);
    sh(inPod[0]!, [...inPod.slice(1), 'ip', 'link', 'set', 'lo', 'up']);
    sh(inPod[0]!, [...inPod.slice(1), 'ip', 'addr', 'add', `${POD_IP}/24`, 'dev', 'eth0']);
    sh(inPod[0]!, [...inPod.slice(1), 'ip', 'link', 'set', 'eth0', 'up']);
    sh(inPod[0]!, [...inPod.slice(1), 'ip', 'route', 'add', 'default', 'via', POD_GATEWAY]);

    children.push(await startServer(spec.acceptLoop, spec.clusterIp, spec.port, 'C'));
    children.push(await startServer(spec.acceptLoop, spec.ingressIp, spec.port, 'E'));

    if (spec.rules.loader === 'nft') sh('nft', ['-f', spec.rules.file]);
    else sh(spec.rules.loader, [spec.rules.file]);

    const loop = (prefix: string[], count: number): ConnectFigures => {
      const args = [...prefix, spec.connectLoop, spec.ingressIp, String(spec.port), String(count)];
      return JSON.parse(sh(args[0]!, args.slice(1))) as ConnectFigures;
    };
    const figures: Record<'node' | 'pod', ConnectFigures> = {} as never;
    for (const [client, prefix] of [
      ['node', []],
      ['pod', inPod],
    ] as const) {
      loop([...prefix], spec.warmup);
      figures[client] = loop([...prefix], spec.connects);
    }
    process.stdout.write(`${JSON.stringify(figures)}\n`);
  } finally {
    for (const child of children) child.kill('SIGKILL');
  }
}

const specFile = process.argv[2];
if (!specFile) {
  console.error('usage: first-packet-lab.js SPEC_FILE (started by the benchmark)');
  process.exit(2);
}
main(JSON.parse(readFileSync(specFile, 'utf8')) as LabSpec).catch((err: unknown) => {
  console.error(`first-packet-lab: ${(err as Error).message}`);
  process.exit(1);
});
