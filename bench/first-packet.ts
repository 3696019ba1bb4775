// First-packet cost: TCP connection set-up time to the last-added Service, the scenarios taking
// turns round after round, each round in a fresh network namespace of its own, made for it, so that
// no NAT table or hook of another scenario (iptables-legacy tables cannot be removed from a
// namespace) is in the path: this module runs itself as `unshare --net -- node first-packet.js
// --lab SPEC_FILE` (the lab), which prints one JSON line with the figures of a node client and of a
// pod client.
//
//   pod namespace (10.244.1.2) --veth-- the lab's namespace, the node --- kube-ipvs0 (bridge, no
//                                       ports): the Service's ClusterIP and LoadBalancer IP
//
// Two small C programs, compiled when the benchmark starts: a connect loop (Node's event loop would
// cost more per connection than the NAT lookup being measured; each connection is closed with a
// reset, so no TIME_WAIT piles up) and an accept loop answering each connection with one byte.

import { execFile, execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { isolatedFromMachine, waitForOwnNetworkNamespace } from './namespace.js';
import { compileC } from './prober.js';
import { BENCH_PORT, POD_CIDR, clusterIp, ingressIp, serviceName } from './services.js';

const SELF = fileURLToPath(import.meta.url);
const run = promisify(execFile);

const CONNECT_LOOP_C = String.raw`
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double micros(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int ascending(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  struct sockaddr_in server = {0};
  server.sin_family = AF_INET;
  server.sin_port = htons((unsigned short)atoi(argv[2]));
  if (inet_pton(AF_INET, argv[1], &server.sin_addr) != 1) return 2;
  long count = atol(argv[3]);
  double *setup = calloc((size_t)count, sizeof(double));
  long failures = 0;
  char answer = '-';
  for (long i = 0; i < count; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct linger reset = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    double before = micros();
    int rc = connect(fd, (struct sockaddr *)&server, sizeof server);
    setup[i] = micros() - before;
    if (rc != 0) failures++;
    if (i == 0 && rc == 0) {
      struct timeval wait = {2, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
      if (read(fd, &answer, 1) != 1) answer = '?';
    }
    close(fd);
  }
  qsort(setup, (size_t)count, sizeof(double), ascending);
  double sum = 0;
  for (long i = 0; i < count; i++) sum += setup[i];
  printf("{\"answer\":\"%c\",\"failures\":%ld,\"p50Us\":%.2f,\"p90Us\":%.2f,\"p99Us\":%.2f,\"meanUs\":%.2f}\n",
         answer, failures, setup[count / 2], setup[count * 9 / 10], setup[count * 99 / 100], sum / count);
  return 0;
}
`;

/** accept-loop ADDRESS PORT TAG: answers every connection with the one byte TAG. */
const ACCEPT_LOOP_C = String.raw`
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  if (argc != 4) return 2;
  struct sockaddr_in at = {0};
  at.sin_family = AF_INET;
  at.sin_port = htons((unsigned short)atoi(argv[2]));
  if (inet_pton(AF_INET, argv[1], &at.sin_addr) != 1) return 2;
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&at, sizeof at) != 0 || listen(fd, 4096) != 0) {
    perror("accept-loop");
    return 1;
  }
  printf("listening\n");
  fflush(stdout);
  for (;;) {
    int conn = accept(fd, NULL, NULL);
    if (conn < 0) continue;
    (void)!write(conn, argv[3], 1);
    close(conn);
  }
}
`;

interface LabSpec {
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

interface ConnectFigures {
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

async function lab(spec: LabSpec): Promise<void> {
  if (!isolatedFromMachine()) throw new Error('the first-packet lab must run in a network namespace of its own');
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

export interface FirstPacketScenario {
  label: string;
  services: number;
  rules: LabSpec['rules'];
}

export interface FirstPacketResult {
  label: string;
  services: number;
  client: 'node' | 'pod';
  answers: string;
  failures: number;
  /** One figure per round. */
  p50Us: number[];
  p99Us: number[];
}

/**
 * The original controller's rules for Services 0..n-1: per Service a KUBE-MARK-MASQ and a DNAT
 * rule in IPVS_OUTPUT (local sources) and in IPVS_PREROUTING (pod sources), jumped to from rule
 * 1 of nat OUTPUT / PREROUTING, matched on the address alone as it did.
 */
export function originalIptablesRules(n: number): string {
  const lines = [
    '*nat',
    ':PREROUTING ACCEPT [0:0]',
    ':INPUT ACCEPT [0:0]',
    ':OUTPUT ACCEPT [0:0]',
    ':POSTROUTING ACCEPT [0:0]',
    ':KUBE-MARK-MASQ - [0:0]',
    ':IPVS_OUTPUT - [0:0]',
    ':IPVS_PREROUTING - [0:0]',
    '-A PREROUTING -j IPVS_PREROUTING',
    '-A OUTPUT -j IPVS_OUTPUT',
    '-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000',
  ];
  for (let i = 0; i < n; i++) {
    const { namespace, name } = serviceName(i);
    const comment = `-m comment --comment "${namespace}/${name}"`;
    const toService = `-j DNAT --to-destination ${clusterIp(i)}`;
    const output = `-A IPVS_OUTPUT -d ${ingressIp(i)}/32 ${comment} -m addrtype --src-type LOCAL`;
    const prerouting = `-A IPVS_PREROUTING -s ${POD_CIDR} -d ${ingressIp(i)}/32 ${comment}`;
    lines.push(`${output} -j KUBE-MARK-MASQ`, `${output} ${toService}`);
    lines.push(`${prerouting} -j KUBE-MARK-MASQ`, `${prerouting} ${toService}`);
  }
  lines.push('COMMIT', '');
  return lines.join('\n');
}

export interface FirstPacketOptions {
  workDir: string;
  rounds: number;
  warmup: number;
  connects: number;
  onRound?(round: number): void;
}

export async function measureFirstPacket(
  scenarios: FirstPacketScenario[],
  options: FirstPacketOptions,
): Promise<FirstPacketResult[]> {
  const results = new Map<string, FirstPacketResult>();
  const programs = {
    connectLoop: compileC(options.workDir, 'connect-loop', CONNECT_LOOP_C, 'the first-packet measure'),
    acceptLoop: compileC(options.workDir, 'accept-loop', ACCEPT_LOOP_C, 'the first-packet measure'),
  };
  for (let round = 0; round < options.rounds; round++) {
    options.onRound?.(round);
    for (const [index, scenario] of scenarios.entries()) {
      const target = scenario.services - 1;
      const spec: LabSpec = {
        ...programs,
        ingressIp: ingressIp(target),
        clusterIp: clusterIp(target),
        port: BENCH_PORT,
        rules: scenario.rules,
        warmup: options.warmup,
        connects: options.connects,
      };
      const specFile = join(options.workDir, `first-packet-${index}.json`);
      writeFileSync(specFile, JSON.stringify(spec));
      const { stdout } = await run('unshare', ['--net', '--', process.execPath, SELF, '--lab', specFile], {
        maxBuffer: 1 << 20,
      });
      const figures = JSON.parse(stdout) as Record<'node' | 'pod', ConnectFigures>;
      for (const client of ['node', 'pod'] as const) {
        const key = `${scenario.label}|${scenario.services}|${client}`;
        const r = results.get(key) ?? {
          label: scenario.label,
          services: scenario.services,
          client,
          answers: '',
          failures: 0,
          p50Us: [],
          p99Us: [],
        };
        const f = figures[client];
        r.answers += f.answer;
        r.failures += f.failures;
        r.p50Us.push(f.p50Us);
        r.p99Us.push(f.p99Us);
        results.set(key, r);
      }
    }
  }
  return [...results.values()];
}

if (process.argv[1] === SELF && process.argv[2] === '--lab') {
  lab(JSON.parse(readFileSync(process.argv[3]!, 'utf8')) as LabSpec).catch((err: unknown) => {
    console.error(`first-packet lab: ${(err as Error).message}`);
    process.exit(1);
  });
}
