// connect() to an external IP with 10,000 entries programmed: the ebpf backend (socket-level,
// cgroup hooks) against the nft backend (per-packet DNAT, NftCliExecutor), and against a plain
// connect() to the ClusterIP with nothing programmed. Clients run in the node namespace (a
// host-network pod) and in a pod namespace. Also times the syncs of the 10,000 entries.
// Prints figures; asserts nothing.
//
//   node dist/bench/ebpf-connect.js          (root; re-runs itself in private net + mount namespaces)
//
// The connect loop is a small C program compiled here: Node's event loop would cost more per
// connection than the translation does, hiding the difference being measured. Each connection
// is opened, then closed with a reset (no TIME_WAIT to exhaust ports); the server accepts and
// closes. Conntrack is switched on in both namespaces for every scenario, as on a real node
// where kube-proxy's rules use it, so the nft figures show the cost of the NAT itself.

import { Reconciler } from '../src/reconciler/reconciler.js';
import { spawn, spawnSync, execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { fileURLToPath } from 'node:url';

import { EbpfDriver, defaultCgroupPath } from '../src/backends/ebpf/ebpf-driver.js';
import { NftCliExecutor } from '../src/backends/nft/executor.js';
import { NftDriver } from '../src/backends/nft/nft-driver.js';
import type { DesiredState, Entry } from '../src/model/types.js';

const IN_NAMESPACE_FLAG = '--in-private-namespaces';
const ENTRIES = 10_000;
const CONNECTS = 20_000;
const WARMUP = 2_000;
const ROUNDS = 7;
const PORT = 8080;
const CLUSTER_IP = '10.96.0.10';
const POD_NS = `inc-bench-pod-${process.pid}`;
const POD_IP = '10.244.0.2';
const NODE_SIDE_IP = '10.244.0.1';

/** Entry i of the 10,000; the benchmark connects to the last one. */
function entry(i: number): Entry {
  return {
    family: 'ipv4',
    externalIp: `198.${18 + ((i >> 16) & 1)}.${(i >> 8) & 255}.${i & 255}`,
    protocol: 'TCP',
    port: PORT,
    clusterIp: CLUSTER_IP,
    service: `bench/service-${i}`,
  };
}
const TARGET = entry(ENTRIES - 1).externalIp;

function desired(entries: Entry[]): DesiredState {
  return {
    ipv4: { entries, localPodMatch: { kind: 'cidrs', cidrs: ['10.244.0.0/24'] } },
    ipv6: { entries: [], localPodMatch: { kind: 'cidrs', cidrs: ['fd00:244::/64'] } },
    masqueradeMark: 0x4000,
    skips: [],
    conflicts: [],
  };
}

const CLIENT_C = String.raw`
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}
int main(int argc, char **argv) {
  struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
  inet_pton(AF_INET, argv[1], &to.sin_addr);
  long count = atol(argv[3]), failures = 0;
  double *lat = malloc(sizeof(double) * count);
  char first = '?';
  double start = now_us();
  for (long i = 0; i < count; i++) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct linger lg = { 1, 0 };
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    double a = now_us();
    int rc = connect(fd, (struct sockaddr *)&to, sizeof to);
    lat[i] = now_us() - a;
    if (rc != 0) failures++;
    if (i == 0 && rc == 0) {
      struct timeval tv = { 2, 0 };
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      if (read(fd, &first, 1) != 1) first = '!';
    }
    close(fd);
  }
  double seconds = (now_us() - start) / 1e6;
  qsort(lat, count, sizeof(double), cmp);
  double sum = 0;
  for (long i = 0; i < count; i++) sum += lat[i];
  printf("{\"first\":\"%c\",\"failures\":%ld,\"perSecond\":%.0f,\"meanUs\":%.2f,\"p50Us\":%.2f,\"p90Us\":%.2f,\"p99Us\":%.2f}\n",
         first, failures, count / seconds, sum / count, lat[count / 2], lat[count * 9 / 10], lat[count * 99 / 100]);
  return 0;
}
`;

const SERVER_C = String.raw`
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
  struct sockaddr_in at = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
  inet_pton(AF_INET, argv[1], &at.sin_addr);
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, (struct sockaddr *)&at, sizeof at) != 0 || listen(fd, 4096) != 0) { perror("listen"); return 1; }
  printf("listening\n");
  fflush(stdout);
  for (;;) {
    int c = accept(fd, NULL, NULL);
    if (c < 0) continue;
    (void)!write(c, argv[3], 1);
    close(c);
  }
}
`;

interface Figures {
  first: string;
  failures: number;
  perSecond: number;
  meanUs: number;
  p50Us: number;
  p90Us: number;
  p99Us: number;
}

function sh(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { encoding: 'utf8' });
}

function compile(dir: string, name: string, source: string): string {
  const src = join(dir, `${name}.c`);
  const bin = join(dir, name);
  writeFileSync(src, source);
  for (const cc of ['cc', 'clang']) {
    if (spawnSync(cc, ['-O2', '-o', bin, src], { stdio: 'inherit' }).status === 0) return bin;
  }
  throw new Error('no C compiler (cc or clang) to build the connect loop');
}

class Lab {
  readonly work = mkdtempSync(join(tmpdir(), 'inc-bench-'));
  readonly bpffsMount = join(this.work, 'bpffs');
  readonly cgroupPath = join(defaultCgroupPath() ?? '/nonexistent', `ipvs-node-controller-bench-${process.pid}`);
  client = '';
  private server = '';
  private readonly servers: Array<ReturnType<typeof spawn>> = [];

  async setup(): Promise<void> {
    this.client = compile(this.work, 'connect-loop', CLIENT_C);
    this.server = compile(this.work, 'accept-loop', SERVER_C);
    mkdirSync(this.bpffsMount);
    sh('mount', ['-t', 'bpf', 'bpf', this.bpffsMount]);
    mkdirSync(this.cgroupPath);
    // This process runs in its own network namespace: it is the "node".
    sh('ip', ['link', 'set', 'lo', 'up']);
    sh('ip', ['link', 'add', 'kube-ipvs0', 'type', 'bridge']);
    sh('ip', ['link', 'set', 'kube-ipvs0', 'up']);
    sh('ip', ['addr', 'add', `${CLUSTER_IP}/32`, 'dev', 'kube-ipvs0']);
    // kube-proxy binds every LoadBalancer IP on kube-ipvs0; here it answers 'E' if reached.
    sh('ip', ['addr', 'add', `${TARGET}/32`, 'dev', 'kube-ipvs0']);
    sh('ip', ['netns', 'add', POD_NS]);
    sh('ip', ['-n', POD_NS, 'link', 'set', 'lo', 'up']);
    sh('ip', ['link', 'add', 'veth-pod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', POD_NS]);
    sh('ip', ['addr', 'add', `${NODE_SIDE_IP}/24`, 'dev', 'veth-pod']);
    sh('ip', ['link', 'set', 'veth-pod', 'up']);
    sh('ip', ['-n', POD_NS, 'addr', 'add', `${POD_IP}/24`, 'dev', 'eth0']);
    sh('ip', ['-n', POD_NS, 'link', 'set', 'eth0', 'up']);
    sh('ip', ['-n', POD_NS, 'route', 'add', 'default', 'via', NODE_SIDE_IP]);
    const conntrackOn =
      'table inet bench-conntrack { chain out { type filter hook output priority 0; ct state new counter; }; chain pre { type filter hook prerouting priority 0; ct state new counter; }; }';
    for (const ns of [[], ['ip', 'netns', 'exec', POD_NS]]) {
      execFileSync(ns[0] ?? 'nft', [...ns.slice(1), ...(ns.length ? ['nft'] : []), '-f', '-'], { input: conntrackOn });
    }
    for (const [ip, tag] of [
      [CLUSTER_IP, 'C'],
      [TARGET, 'E'],
    ] as const) {
      const server = spawn(this.server, [ip, String(PORT), tag], { stdio: ['ignore', 'pipe', 'inherit'] });
      this.servers.push(server);
      await new Promise((resolve) => server.stdout!.once('data', resolve));
    }
  }

  /** Runs the connect loop from the node or pod namespace, in the test cgroup or not. */
  connectLoop(where: 'node' | 'pod', inCgroup: boolean, ip: string, count: number): Figures {
    const command = [
      ...(where === 'pod' ? ['ip', 'netns', 'exec', POD_NS] : []),
      this.client,
      ip,
      String(PORT),
      String(count),
    ];
    const args = inCgroup
      ? ['sh', '-c', 'echo $$ > "$0" && exec "$@"', join(this.cgroupPath, 'cgroup.procs'), ...command]
      : command;
    return JSON.parse(execFileSync(args[0]!, args.slice(1), { encoding: 'utf8' })) as Figures;
  }

  /**
   * Conntrack entries of NATed connections outlive the nft table; a later direct connection
   * reusing a source port clashes with such an entry's reply tuple and stalls on SYN retries.
   */
  forgetConnections(): void {
    spawnSync('conntrack', ['-F'], { stdio: 'ignore' });
    spawnSync('ip', ['netns', 'exec', POD_NS, 'conntrack', '-F'], { stdio: 'ignore' });
  }

  teardown(): void {
    for (const s of this.servers) s.kill('SIGKILL');
    spawnSync('ip', ['netns', 'del', POD_NS]);
    spawnSync('umount', [this.bpffsMount]);
    try {
      rmdirSync(this.cgroupPath);
    } catch {
      // still busy or never made: the next run uses another name
    }
    rmSync(this.work, { recursive: true, force: true });
  }
}

function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor(sorted.length / 2)]!;
}

async function timedMs(work: () => Promise<unknown>): Promise<number> {
  const start = performance.now();
  await work();
  return performance.now() - start;
}

interface Scenario {
  label: string;
  backend?: Reconciler;
  target: string;
}

async function benchmark(): Promise<void> {
  const lab = new Lab();
  try {
    await lab.setup();
    const entries = Array.from({ length: ENTRIES }, (_, i) => entry(i));
    const ebpf = new Reconciler(
      new EbpfDriver({
        cgroupPath: lab.cgroupPath,
        bpffsPath: join(lab.bpffsMount, 'ipvs-node-controller'),
      }),
    );
    const nft = new Reconciler(new NftDriver(new NftCliExecutor()));
    for (const b of [ebpf, nft]) {
      const probe = await b.driver.probe();
      if (!probe.ok) throw new Error(`${b.name}: ${probe.detail}`);
    }

    console.log(
      `${ENTRIES} entries; connect() loop of ${CONNECTS} connections after ${WARMUP} warm-up; ` +
        `median of ${ROUNDS} rounds, the scenarios taking turns, each backend programmed afresh every round`,
    );
    const scenarios: Scenario[] = [
      { label: 'ClusterIP, nothing programmed', target: CLUSTER_IP },
      { label: 'external IP, ebpf backend', backend: ebpf, target: TARGET },
      { label: 'external IP, nft backend', backend: nft, target: TARGET },
    ];
    const results = new Map<string, Figures[]>();
    const syncFigures: string[] = [];
    for (let round = 0; round < ROUNDS; round++) {
      for (const scenario of scenarios) {
        const b = scenario.backend;
        if (b && round === 0) {
          const first = await timedMs(() => b.sync(desired(entries), { full: true }));
          const again = await timedMs(() => b.sync(desired(entries), { full: true }));
          const oneDelete = await timedMs(() => b.sync(desired(entries.slice(1)), { full: false }));
          const oneAdd = await timedMs(() => b.sync(desired(entries), { full: false }));
          syncFigures.push(
            `${b.name.padEnd(5)} first full ${first.toFixed(1).padStart(7)} ms   full, no change ${again.toFixed(1).padStart(7)} ms   ` +
              `partial, 1 delete ${oneDelete.toFixed(1).padStart(6)} ms   partial, 1 add ${oneAdd.toFixed(1).padStart(6)} ms`,
          );
        } else if (b) {
          await b.sync(desired(entries), { full: true });
        }
        for (const where of ['node', 'pod'] as const) {
          const inCgroup = b?.name === 'ebpf';
          lab.connectLoop(where, inCgroup, scenario.target, WARMUP);
          const key = `${scenario.label.padEnd(32)} ${where.padStart(6)}`;
          results.set(key, [...(results.get(key) ?? []), lab.connectLoop(where, inCgroup, scenario.target, CONNECTS)]);
        }
        await b?.cleanup();
        lab.forgetConnections();
      }
    }
    // The best round's p50 beside the medians: on a shared machine it is the least disturbed figure.
    console.log(
      'scenario                         client    reached   conn/s   mean µs   p50 µs   p90 µs   p99 µs  best p50  failures',
    );
    for (const [key, rounds] of results) {
      const pick = (f: (r: Figures) => number) => median(rounds.map(f));
      const reached = rounds.every((r) => r.first === 'C') ? 'ClusterIP' : `'${rounds.map((r) => r.first).join('')}'`;
      console.log(
        [
          key,
          reached.padStart(10),
          pick((r) => r.perSecond)
            .toFixed(0)
            .padStart(8),
          pick((r) => r.meanUs)
            .toFixed(1)
            .padStart(9),
          pick((r) => r.p50Us)
            .toFixed(1)
            .padStart(8),
          pick((r) => r.p90Us)
            .toFixed(1)
            .padStart(8),
          pick((r) => r.p99Us)
            .toFixed(1)
            .padStart(8),
          Math.min(...rounds.map((r) => r.p50Us))
            .toFixed(1)
            .padStart(9),
          String(rounds.reduce((n, r) => n + r.failures, 0)).padStart(9),
        ].join(' '),
      );
    }
    console.log(`\nsync of ${ENTRIES} entries (ebpf: addon batches; nft: NftCliExecutor)`);
    for (const line of syncFigures) console.log(line);
    await ebpf.close();
  } finally {
    lab.teardown();
  }
}

if (process.argv.includes(IN_NAMESPACE_FLAG)) {
  benchmark().catch((err: unknown) => {
    console.error((err as Error).message);
    process.exit(1);
  });
} else {
  if (process.getuid?.() !== 0) {
    console.error('run as root: the benchmark creates network namespaces, a cgroup and a bpffs mount');
    process.exit(1);
  }
  // The node side is this process's own network namespace: the machine's firewall is never touched.
  const self = fileURLToPath(import.meta.url);
  const r = spawnSync('unshare', ['--net', '--mount', process.execPath, self, IN_NAMESPACE_FLAG], { stdio: 'inherit' });
  process.exit(r.status ?? 1);
}
