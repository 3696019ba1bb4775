// The C source of the packet prober (bench/packet-probe.ts runs it). A program of its own, in C:
// it must open a TCP connection every ~150 us for seconds on end and time them on the clock
// Node's process.hrtime.bigint() reads (CLOCK_MONOTONIC), which an event loop cannot do.
//
// One process, one poll loop, driven by lines on stdin:
//   probe ADDRESS PORT TIMEOUT_MS INTERVAL_US SPREAD
// prints `started NS` once the first attempt is on its way, then, every INTERVAL_US, starts a
// non-blocking connect() to ADDRESS:PORT from a new socket (so a new ephemeral port: the conntrack
// entry of an attempt that went out untranslated never decides a later one), until one
// connects. It prints one JSON line: when that attempt started (firstOkNs) and when its success
// was seen, when the last attempt before it started (so the translation appeared between the
// two), how many attempts ran, and the first error other than "no answer yet".
// An attempt that has no answer after ATTEMPT_LIFE_MS is closed (its SYN went out untranslated
// and vanished: it will never connect). SPREAD > 0 lets the interval grow to 1/SPREAD of the
// time probed so far (a relative resolution), so that a wait of seconds costs thousands of
// attempts, not tens of thousands; 0 keeps it fixed.
//
// It also listens on 0.0.0.0:PORT (LISTEN_PORT env var, default 443) and accepts and resets
// every connection (an attempt that reads ECONNRESET had thus connected): the ClusterIPs are local addresses of the bench's node, so an attempt that
// was translated is answered here, and one that was not is never answered (its address is routed
// to a device where packets vanish).
/** What both probers begin with: headers, limits, the clock, the listening socket. */
export const PROBER_PRELUDE_C = String.raw`
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
`;

export const PACKET_PROBE_C =
  PROBER_PRELUDE_C +
  String.raw`
static void accept_all(void) {
  for (;;) {
    int c = accept4(listener, NULL, NULL, SOCK_NONBLOCK);
    if (c < 0) return;
    struct linger reset = {1, 0};
    setsockopt(c, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    close(c);
  }
}

static void close_reset(int fd) {
  struct linger reset = {1, 0};
  setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
  close(fd);
}

static void probe(const char *address, int port, long timeout_ms, long interval_us, long spread) {
  struct sockaddr_in to = {0};
  to.sin_family = AF_INET;
  to.sin_port = htons((unsigned short)port);
  if (inet_pton(AF_INET, address, &to.sin_addr) != 1) {
    printf("{\"error\":\"bad address %s\"}\n", address);
    fflush(stdout);
    return;
  }
  static struct attempt open_[MAX_OPEN];
  static struct pollfd fds[MAX_OPEN + 1];
  int n = 0;
  long long interval = interval_us * 1000LL;
  long long begin = now_ns();
  long long deadline = begin + timeout_ms * 1000000LL;
  long long next = begin;
  long long last_started = 0, previous_started = 0, ok_started = 0, ok_seen = 0;
  long attempts = 0, errors = 0;
  int first_errno = 0;
  int announced = 0;
  while (!ok_started) {
    long long t = now_ns();
    if (t >= deadline) break;
    if (t >= next && n < MAX_OPEN) {
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        errors++;
        if (!first_errno) first_errno = errno;
      } else {
        long long s = now_ns();
        int rc = connect(fd, (struct sockaddr *)&to, sizeof to);
        attempts++;
        previous_started = last_started;
        last_started = s;
        if (rc == 0) {
          ok_started = s;
          ok_seen = now_ns();
          close_reset(fd);
          break;
        } else if (errno == EINPROGRESS) {
          open_[n].fd = fd;
          open_[n].started = s;
          n++;
        } else {
          errors++;
          if (!first_errno) first_errno = errno;
          close(fd);
        }
      }
      if (!announced) {
        printf("started %lld\n", begin);
        fflush(stdout);
        announced = 1;
      }
      long long step = interval;
      if (spread > 0 && (t - begin) / spread > step) step = (t - begin) / spread;
      next += step;
      if (next < t) next = t + step;
    }
    for (int i = 0; i < n; i++) {
      fds[i].fd = open_[i].fd;
      fds[i].events = POLLOUT;
      fds[i].revents = 0;
    }
    fds[n].fd = listener;
    fds[n].events = POLLIN;
    fds[n].revents = 0;
    long long wait = next - now_ns();
    if (wait < 0) wait = 0;
    if (wait > deadline - t) wait = deadline - t > 0 ? deadline - t : 0;
    struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
    int ready = ppoll(fds, (nfds_t)n + 1, &ts, NULL);
    if (ready < 0 && errno != EINTR) break;
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
          if (!ok_started || a.started < ok_started) {
            ok_started = a.started;
            ok_seen = seen;
          }
        } else {
          errors++;
          if (!first_errno) first_errno = err;
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
  if (!announced) {
    printf("started %lld\n", begin);
    announced = 1;
  }
  // The attempt started just before the one that connected: the translation appeared between them.
  long long before_ok = 0;
  if (ok_started) before_ok = ok_started == last_started ? previous_started : 0;
  printf("{\"ok\":%s,\"beginNs\":\"%lld\",\"firstOkNs\":\"%lld\",\"okSeenNs\":\"%lld\",\"lastStartedNs\":\"%lld\","
         "\"beforeOkNs\":\"%lld\",\"attempts\":%ld,\"errors\":%ld,\"firstError\":\"%s\"}\n",
         ok_started ? "true" : "false", begin, ok_started, ok_seen, last_started, before_ok, attempts, errors,
         first_errno ? strerror(first_errno) : "");
  fflush(stdout);
  accept_all();
}

` +
  proberMainC({ socketType: 'SOCK_STREAM', drain: 'accept_all', name: 'packet-probe' });

/**
 * Both probers' main(): listens on LISTEN_PORT (default 443) with a socket of `socketType`
 * (`listen` for a stream socket), prints `ready`, then serves `probe` lines from stdin, calling
 * `drain` whenever the listener has something waiting.
 */
export function proberMainC(options: {
  socketType: 'SOCK_STREAM' | 'SOCK_DGRAM';
  drain: string;
  name: string;
}): string {
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
