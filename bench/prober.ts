// Real packets, end to end: when does a connection to an address first succeed (TCP), or a
// datagram to it first arrive (UDP)? A long-lived C prober is asked to probe one address; it
// answers with the CLOCK_MONOTONIC time (process.hrtime.bigint()'s clock) at which the first
// attempt that got through was started. The benchmark takes its own hrtime when it acts (spawns
// the controller, writes a Service): the difference is the figure.
//
// The node it probes from is set up by `probeNode()`: the ClusterIPs are local (a `local` route
// on lo, answered by the prober's listener on 0.0.0.0:PORT), and so are the LoadBalancer and moved
// ranges, as kube-ipvs0 binds them (the controller translates a local destination only), but a
// packet to one of them that was not translated (nor a reply of one that was) is dropped on input,
// where it vanishes (no answer, no reset). So an attempt gets through if and only if it was translated.
//
// The prober is in C: it must start an attempt every ~150 us for seconds on end and time them on
// CLOCK_MONOTONIC, which an event loop cannot do. One process, one poll loop, driven by lines on
// stdin:
//   probe ADDRESS PORT TIMEOUT_MS INTERVAL_US SPREAD
// prints `started NS` once the first attempt is on its way, then, every INTERVAL_US, starts an
// attempt from a new socket (so a new source port: the conntrack entry of an attempt that went out
// untranslated never decides a later one) until one gets through. TCP: a non-blocking connect();
// the listener accepts and resets every connection (an attempt that reads ECONNRESET had thus
// connected); an attempt with no answer after ATTEMPT_LIFE_NS is closed (its SYN vanished). UDP:
// one datagram carrying the probe's serial number and the attempt's index, so what arrives names
// its attempt. It prints one JSON line: when that attempt started (firstOkNs), when the attempt
// before it started (so the translation appeared between the two), how
// many attempts ran, and the first error other than "no answer yet". SPREAD > 0 lets the interval
// grow to 1/SPREAD of the time probed so far (a relative resolution), so that a wait of seconds
// costs thousands of attempts, not tens of thousands; 0 keeps it fixed. The listener is on
// 0.0.0.0:PORT (LISTEN_PORT env var, default 443).

import { execFileSync, spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { CLUSTER_RANGE, INGRESS_RANGE, MOVED_RANGE, NODE_ADDRESS } from './services.js';

const PRELUDE_C = String.raw`
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_OPEN 4000
#define ATTEMPT_LIFE_NS (100LL * 1000 * 1000)

static long long now_ns(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int listener = -1;

struct attempt {
  int fd;
  long long started;
};

/* Of the probe under way: when it began, its attempts, its first error other than "no answer yet". */
static long long begin;
static long attempts;
static int first_errno, announced;

static void failed(int err) {
  if (!first_errno) first_errno = err;
}

/* Starts a probe of address:port; prints the error line when the address is not one. */
static int start(const char *address, int port, struct sockaddr_in *to) {
  memset(to, 0, sizeof *to);
  to->sin_family = AF_INET;
  to->sin_port = htons((unsigned short)port);
  begin = now_ns();
  attempts = 0;
  first_errno = announced = 0;
  if (inet_pton(AF_INET, address, &to->sin_addr) == 1) return 1;
  printf("{\"error\":\"bad address %s\"}\n", address);
  fflush(stdout);
  return 0;
}

static void announce(void) {
  if (announced) return;
  printf("started %lld\n", begin);
  fflush(stdout);
  announced = 1;
}

/* The time of the next attempt: every interval, or 1/spread of the time probed so far once longer. */
static long long next_attempt(long long next, long long t, long long interval, long spread) {
  long long step = interval;
  if (spread > 0 && (t - begin) / spread > step) step = (t - begin) / spread;
  next += step;
  return next < t ? t + step : next;
}

/* ppoll() until the next attempt is due (or the deadline); -1 on an error other than EINTR. */
static int wait_for(struct pollfd *fds, nfds_t n, long long next, long long t, long long deadline) {
  long long wait = next - now_ns();
  if (wait < 0) wait = 0;
  if (wait > deadline - t) wait = deadline - t > 0 ? deadline - t : 0;
  struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
  int ready = ppoll(fds, n, &ts, NULL);
  return ready < 0 && errno != EINTR ? -1 : ready;
}

static void print_outcome(long long ok_started, long long before_ok) {
  announce();
  printf("{\"ok\":%s,\"firstOkNs\":\"%lld\",\"beforeOkNs\":\"%lld\",\"attempts\":%ld,\"firstError\":\"%s\"}\n",
         ok_started ? "true" : "false", ok_started, before_ok, attempts, first_errno ? strerror(first_errno) : "");
  fflush(stdout);
}
`;

const TCP_PROBE_C = String.raw`
static void close_reset(int fd) {
  struct linger reset = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  close(fd);
}

static void accept_all(void) {
  for (int c; (c = accept4(listener, NULL, NULL, SOCK_NONBLOCK)) >= 0;) close_reset(c);
}

static void probe(const char *address, int port, long timeout_ms, long interval_us, long spread) {
  struct sockaddr_in to;
  if (!start(address, port, &to)) return;
  static struct attempt open_[MAX_OPEN];
  static struct pollfd fds[MAX_OPEN + 1];
  int n = 0;
  long long deadline = begin + timeout_ms * 1000000LL;
  long long next = begin;
  long long last_started = 0, previous_started = 0, ok_started = 0;
  while (!ok_started) {
    long long t = now_ns();
    if (t >= deadline) break;
    if (t >= next && n < MAX_OPEN) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        failed(errno);
      } else {
        long long s = now_ns();
        int rc = connect(fd, (struct sockaddr *)&to, sizeof to);
        attempts++;
        previous_started = last_started;
        last_started = s;
        if (rc == 0) {
          ok_started = s;
          close_reset(fd);
          break;
        } else if (errno == EINPROGRESS) {
          open_[n].fd = fd;
          open_[n].started = s;
          n++;
        } else {
          failed(errno);
          close(fd);
        }
      }
      announce();
      next = next_attempt(next, t, interval_us * 1000LL, spread);
    }
    for (int i = 0; i < n; i++) fds[i] = (struct pollfd){open_[i].fd, POLLOUT, 0};
    fds[n] = (struct pollfd){listener, POLLIN, 0};
    if (wait_for(fds, (nfds_t)n + 1, next, t, deadline) < 0) break;
    long long seen = now_ns();
    int n_before_accept = n;
    int kept = 0;
    for (int i = 0; i < n; i++) {
      struct attempt a = open_[i];
      if (fds[i].revents) {
        int err = 0;
        socklen_t len = sizeof err;
        getsockopt(a.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        // ECONNRESET: the listener below accepted and reset it, so it had connected.
        if (err == 0 || err == ECONNRESET) {
          if (!ok_started || a.started < ok_started) ok_started = a.started;
        } else {
          failed(err);
        }
        close_reset(a.fd);
      } else if (seen - a.started > ATTEMPT_LIFE_NS || ok_started) {
        close_reset(a.fd);
      } else {
        open_[kept++] = a;
      }
    }
    n = kept;
    // After the attempts were looked at: the reset it sends must not hide a success.
    if (fds[n_before_accept].revents) accept_all();
  }
  for (int i = 0; i < n; i++) close_reset(open_[i].fd);
  // The attempt started just before the one that connected: the translation appeared between them.
  long long before_ok = 0;
  if (ok_started) before_ok = ok_started == last_started ? previous_started : 0;
  print_outcome(ok_started, before_ok);
  accept_all();
}
`;

const UDP_PROBE_C = String.raw`
#define MAX_ATTEMPTS 65536
/* After the first arrival, how long an earlier attempt still in flight may take to arrive. */
#define GRACE_NS (300LL * 1000)

struct datagram {
  uint32_t serial;
  uint32_t index;
};

static uint32_t serial = 0;
static long long starts[MAX_ATTEMPTS];
static long ok_index = -1;

/* Reads every datagram waiting: the earliest attempt of this probe that arrived is kept. */
static void drain(void) {
  struct datagram d;
  for (;;) {
    ssize_t n = recv(listener, &d, sizeof d, MSG_DONTWAIT);
    if (n < 0) return;
    if (n != (ssize_t)sizeof d || d.serial != serial || (long)d.index >= attempts) continue;
    if (ok_index < 0 || (long)d.index < ok_index) ok_index = (long)d.index;
  }
}

static void probe(const char *address, int port, long timeout_ms, long interval_us, long spread) {
  struct sockaddr_in to;
  serial++;
  ok_index = -1;
  drain();
  if (!start(address, port, &to)) return;
  static struct attempt open_[MAX_OPEN];
  int n = 0;
  long long deadline = begin + timeout_ms * 1000000LL;
  long long next = begin;
  while (ok_index < 0) {
    long long t = now_ns();
    if (t >= deadline) break;
    if (t >= next && n < MAX_OPEN && attempts < MAX_ATTEMPTS) {
      int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        failed(errno);
      } else if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
        failed(errno);
        close(fd);
      } else {
        struct datagram d = {serial, (uint32_t)attempts};
        /* Before send(): a local delivery may be done before send() returns. */
        long long s = now_ns();
        starts[attempts++] = s;
        if (send(fd, &d, sizeof d, 0) < 0) failed(errno);
        open_[n].fd = fd;
        open_[n].started = s;
        n++;
      }
      announce();
      next = next_attempt(next, t, interval_us * 1000LL, spread);
    }
    struct pollfd pfd = {listener, POLLIN, 0};
    if (wait_for(&pfd, 1, next, t, deadline) < 0) break;
    if (pfd.revents) drain();
    if (ok_index >= 0) {
      struct timespec grace = {0, GRACE_NS};
      nanosleep(&grace, NULL);
      drain();
    }
    long long seen = now_ns();
    int kept = 0;
    for (int i = 0; i < n; i++) {
      if (seen - open_[i].started > ATTEMPT_LIFE_NS) close(open_[i].fd);
      else open_[kept++] = open_[i];
    }
    n = kept;
  }
  for (int i = 0; i < n; i++) close(open_[i].fd);
  print_outcome(ok_index >= 0 ? starts[ok_index] : 0, ok_index > 0 ? starts[ok_index - 1] : 0);
}
`;

/**
 * Both probers' main(): listens on LISTEN_PORT (default 443) with a socket of `socketType`
 * (`listen` for a stream socket), prints `ready`, then serves `probe` lines from stdin, calling
 * `drain` whenever the listener has something waiting.
 */
function mainC(options: { socketType: 'SOCK_STREAM' | 'SOCK_DGRAM'; drain: string; name: string }): string {
  const stream = options.socketType === 'SOCK_STREAM';
  return String.raw`
int main(void) {
  signal(SIGPIPE, SIG_IGN);
  struct rlimit files = {MAX_OPEN + 64, MAX_OPEN + 64};
  setrlimit(RLIMIT_NOFILE, &files);
  const char *port_text = getenv("LISTEN_PORT");
  int listen_port = port_text ? atoi(port_text) : 443;
  listener = socket(AF_INET, ${options.socketType} | SOCK_NONBLOCK, 0);
  int one = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in any = {0};
  any.sin_family = AF_INET;
  any.sin_port = htons((unsigned short)listen_port);
  if (bind(listener, (struct sockaddr *)&any, sizeof any) != 0${stream ? ' || listen(listener, 4096) != 0' : ''}) {
    fprintf(stderr, "${options.name}: cannot listen on port %d: %s\n", listen_port, strerror(errno));
    return 1;
  }
  printf("ready\n");
  fflush(stdout);
  char line[256];
  struct pollfd idle[2] = {{0, POLLIN, 0}, {listener, POLLIN, 0}};
  for (;;) {
    idle[0].revents = idle[1].revents = 0;
    if (poll(idle, 2, -1) < 0 && errno != EINTR) return 1;
    if (idle[1].revents) ${options.drain}();
    if (!idle[0].revents) continue;
    if (!fgets(line, sizeof line, stdin)) return 0;
    char address[64];
    int port;
    long timeout_ms, interval_us, spread;
    if (sscanf(line, "probe %63s %d %ld %ld %ld", address, &port, &timeout_ms, &interval_us, &spread) == 5) {
      probe(address, port, timeout_ms, interval_us, spread);
    } else {
      printf("{\"error\":\"bad command\"}\n");
      fflush(stdout);
    }
  }
}
`;
}

export interface ProbeOutcome {
  ok: boolean;
  /** hrtime (ns) at which the first attempt that connected was started (0 when none did). */
  firstOkNs: bigint;
  /** The attempt started right before it (the translation appeared in between); 0 if unknown. */
  beforeOkNs: bigint;
  attempts: number;
  firstError: string;
}

/** A probe under way: when its first attempt started (an hrtime, ns), and its outcome. */
type Probing = { startedNs: bigint; outcome: Promise<ProbeOutcome> };

/** Node network of the benchmark's namespace: see the header. */
export interface ProbeNodeLayout {
  /** Local ranges whose traffic must vanish unless translated (the ingress and moved addresses by default). */
  sinkRanges: string[];
  /** Range of the ClusterIPs, made local. */
  clusterRange: string;
  /** The node's address (the source of the probes), put on a bridge of its own. */
  nodeAddress: string;
  /**
   * Also a pod: a network namespace joined to the node by a veth, with this address (in the
   * node's pod CIDR, so the prerouting rule takes its traffic) and the gateway on the node side.
   */
  pod?: { address: string; gateway: string };
}

/** Where the pod namespace of `probeNode` is (bench/run.ts mounts its own tmpfs on /run/netns). */
export const POD_NETNS = '/run/netns/bench-pod';

const SINK = 'lb-sink';
let sinkRanges: string[] = [];

/** `nft flush ruleset`, then the drop of untranslated packets again. */
export function flushRuleset(): void {
  execFileSync('nft', ['flush', 'ruleset']);
  dropUntranslated();
}

function dropUntranslated(): void {
  if (sinkRanges.length === 0) return;
  const drop = `ip daddr { ${sinkRanges.join(', ')} } ct status & dnat == 0 drop`;
  const table = `table ip bench-sink {\n chain input {\n  type filter hook input priority 0;\n  ${drop}\n }\n}\n`;
  execFileSync('nft', ['-f', '-'], { input: `table ip bench-sink\ndelete table ip bench-sink\n${table}` });
}

/** Sets the node's network up (`asked` over the benchmark's own layout); idempotent, never leaves the namespace. */
export function probeNode(asked: Partial<ProbeNodeLayout> = {}): void {
  const layout: ProbeNodeLayout = {
    ...{ sinkRanges: [INGRESS_RANGE, MOVED_RANGE], clusterRange: CLUSTER_RANGE, nodeAddress: `${NODE_ADDRESS}/24` },
    ...asked,
  };
  const ip = (...args: string[]) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });
  ip('link', 'set', 'lo', 'up');
  // A bridge without ports: the `dummy` link type is not built into this kernel.
  if (spawnSync('ip', ['link', 'show', SINK], { stdio: 'ignore' }).status !== 0) {
    ip('link', 'add', SINK, 'type', 'bridge');
    ip('link', 'set', SINK, 'up');
  }
  ip('addr', 'replace', layout.nodeAddress, 'dev', SINK);
  ip('route', 'replace', 'local', layout.clusterRange, 'dev', 'lo');
  // The node's address the source of the connections to them, as before they were local.
  const src = layout.nodeAddress.split('/')[0]!;
  for (const range of layout.sinkRanges) ip('route', 'replace', 'local', range, 'dev', 'lo', 'src', src);
  sinkRanges = layout.sinkRanges;
  dropUntranslated();
  if (layout.pod && spawnSync('ip', ['netns', 'pid', 'bench-pod'], { stdio: 'ignore' }).status !== 0) {
    // A tmpfs of this mount namespace only: the netns name never appears on the machine.
    execFileSync('mkdir', ['-p', '/run/netns']);
    execFileSync('mount', ['-t', 'tmpfs', 'bench-netns', '/run/netns']);
    ip('netns', 'add', 'bench-pod');
    ip('link', 'add', 'bench-vpod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', 'bench-pod');
    ip('addr', 'add', layout.pod.gateway, 'dev', 'bench-vpod');
    ip('link', 'set', 'bench-vpod', 'up');
    const inPod = (...args: string[]) => ip('-n', 'bench-pod', ...args);
    inPod('link', 'set', 'lo', 'up');
    inPod('addr', 'add', layout.pod.address, 'dev', 'eth0');
    inPod('link', 'set', 'eth0', 'up');
    inPod('route', 'add', 'default', 'via', layout.pod.gateway.split('/')[0]!);
  }
  // Untranslated attempts leave a SYN_SENT conntrack entry each; do not keep them for 2 min.
  try {
    execFileSync('sysctl', ['-qw', 'net.netfilter.nf_conntrack_tcp_timeout_syn_sent=5']);
  } catch {
    // not a per-namespace setting on this kernel: the default holds
  }
}

/** Compiles the TCP prober (or the UDP one) into `dir`; returns the binary's path. */
export function compilePacketProbe(dir: string, protocol: 'tcp' | 'udp' = 'tcp'): string {
  const [probe, socketType, drain] =
    protocol === 'tcp'
      ? [TCP_PROBE_C, 'SOCK_STREAM' as const, 'accept_all']
      : [UDP_PROBE_C, 'SOCK_DGRAM' as const, 'drain'];
  const name = `${protocol}-probe`;
  const [source, binary] = [join(dir, `${name}.c`), join(dir, name)];
  writeFileSync(source, PRELUDE_C + probe + mainC({ socketType, drain, name }));
  for (const compiler of ['cc', 'clang']) {
    if (spawnSync(compiler, ['-O2', '-Wall', '-o', binary, source], { stdio: 'inherit' }).status === 0) return binary;
  }
  throw new Error(`the ${protocol.toUpperCase()} prober needs a C compiler: install gcc (or clang)`);
}

export class PacketProbe {
  private readonly lines: string[] = [];
  private waiter: (() => void) | undefined;
  private exited = false;
  private busy = false;

  private constructor(private readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      this.lines.push(line);
      this.waiter?.();
    });
    child.on('exit', () => {
      this.exited = true;
      this.waiter?.();
    });
  }

  /**
   * Starts the prober. `cgroupProcs`: a cgroup.procs file it joins before exec (the ebpf backend
   * translates only sockets of processes below its cgroup).
   */
  static async start(
    binary: string,
    options: { port: number; cgroupProcs?: string; netns?: string },
  ): Promise<PacketProbe> {
    const env = { ...process.env, LISTEN_PORT: String(options.port) };
    // nsenter, not `ip netns exec`: that remounts /sys, which would hide the cgroup tree.
    const command = options.netns ? ['nsenter', `--net=${options.netns}`, binary] : [binary];
    const argv = options.cgroupProcs
      ? ['sh', '-c', 'echo $$ > "$0" && exec "$@"', options.cgroupProcs, ...command]
      : command;
    const child = spawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'pipe', 'inherit'], env });
    const probe = new PacketProbe(child);
    const ready = await probe.nextLine(5_000);
    if (ready !== 'ready') throw new Error(`the packet prober did not start: ${ready}`);
    return probe;
  }

  private async nextLine(timeoutMs: number): Promise<string> {
    const deadline = performance.now() + timeoutMs;
    while (this.lines.length === 0) {
      if (this.exited) throw new Error('the packet prober exited');
      const left = deadline - performance.now();
      if (left <= 0) throw new Error(`the packet prober said nothing for ${timeoutMs} ms`);
      await new Promise<void>((resolve) => {
        const timer = setTimeout(resolve, left);
        this.waiter = () => {
          clearTimeout(timer);
          resolve();
        };
      });
      this.waiter = undefined;
    }
    return this.lines.shift()!;
  }

  /**
   * Starts probing `address:port` every `intervalUs` (with `spread` > 0, every 1/spread of the
   * time probed so far once that is longer); resolves once the first attempt is out, so that
   * what the caller does next happens while probing runs, with the outcome: it resolves once an
   * attempt got through or the timeout passed.
   */
  async begin(address: string, port: number, timeoutMs: number, intervalUs = 150, spread = 0): Promise<Probing> {
    if (this.busy) throw new Error('the packet prober is already probing');
    this.busy = true;
    this.child.stdin!.write(`probe ${address} ${port} ${timeoutMs} ${intervalUs} ${spread}\n`);
    const started = await this.nextLine(5_000);
    if (!started.startsWith('started ')) throw new Error(`packet prober: ${started}`);
    const outcome = this.nextLine(timeoutMs + 5_000).then((line) => {
      this.busy = false;
      const r = JSON.parse(line) as Record<string, unknown>;
      if (typeof r.error === 'string') throw new Error(`packet prober: ${r.error}`);
      return {
        ok: r.ok === true,
        firstOkNs: BigInt(r.firstOkNs as string),
        beforeOkNs: BigInt(r.beforeOkNs as string),
        attempts: r.attempts as number,
        firstError: r.firstError as string,
      };
    });
    return { startedNs: BigInt(started.slice('started '.length).trim()), outcome };
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const exit = once(this.child, 'exit');
    this.child.stdin!.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await exit;
    clearTimeout(timer);
  }
}

/**
 * Milliseconds from the spawn of the controller (an hrtime) to the start of the first attempt
 * through `target`; throws when none got through, or one did before it started (rules left in place).
 */
export function throughAfter(spawnedAtNs: bigint, outcome: ProbeOutcome, target: string): number {
  if (!outcome.ok)
    throw new Error(`${target} never answered (${outcome.attempts} attempts, ${outcome.firstError || 'no error'})`);
  if (outcome.firstOkNs < spawnedAtNs)
    throw new Error(`${target} answered before the controller started: rules were left in place`);
  return msSince(spawnedAtNs, outcome);
}

/** Milliseconds from `fromNs` (an hrtime) to when the first attempt that connected started. */
export function msSince(fromNs: bigint, outcome: ProbeOutcome): number {
  return Number(outcome.firstOkNs - fromNs) / 1e6;
}
