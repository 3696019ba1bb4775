// The UDP prober of the react benchmark (bench/react.ts): when does a datagram to a Service's new
// LoadBalancer address first reach the Service? A C program, as bench/packet-probe-program.ts is,
// and driven the same way, so that bench/packet-probe.ts's PacketProbe runs it:
//   probe ADDRESS PORT TIMEOUT_MS INTERVAL_US SPREAD
// prints `started NS` once the first attempt is out, then every INTERVAL_US sends one datagram to
// ADDRESS:PORT from a new socket (a new source port, so a new conntrack entry: an attempt that
// went out untranslated never decides a later one), until one arrives. It prints the same JSON
// line as the TCP prober: when the first attempt that arrived was sent (CLOCK_MONOTONIC, the
// clock of Node's process.hrtime.bigint()), when that was seen, when the attempt before it was
// sent, how many attempts ran and the first error.
// It listens on 0.0.0.0:PORT (UDP, LISTEN_PORT env var, default 443): the ClusterIPs are local
// addresses of the bench's node, so a translated datagram arrives here, and one that was not
// translated never does (its address is routed to a device where packets vanish). Each datagram
// carries the probe's serial number and the attempt's index, so what arrives names its attempt.

import { compileC } from './packet-probe.js';
import { PROBER_PRELUDE_C, proberMainC } from './packet-probe-program.js';

const UDP_PROBE_C =
  PROBER_PRELUDE_C +
  String.raw`
#define MAX_ATTEMPTS 65536
/* After the first arrival, how long an earlier attempt still in flight may take to arrive. */
#define GRACE_NS (300LL * 1000)

struct datagram {
  uint32_t serial;
  uint32_t index;
};

static uint32_t serial = 0;
static long long starts[MAX_ATTEMPTS];
static long attempts = 0;
static long ok_index = -1;
static long long ok_seen = 0;

/* Reads every datagram waiting: the earliest attempt of this probe that arrived is kept. */
static void drain(void) {
  struct datagram d;
  for (;;) {
    ssize_t n = recv(listener, &d, sizeof d, MSG_DONTWAIT);
    if (n < 0) return;
    if (n != (ssize_t)sizeof d || d.serial != serial || (long)d.index >= attempts) continue;
    if (ok_index < 0 || (long)d.index < ok_index) {
      ok_index = (long)d.index;
      if (!ok_seen) ok_seen = now_ns();
    }
  }
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
  int n = 0;
  serial++;
  attempts = 0;
  ok_index = -1;
  ok_seen = 0;
  drain();
  long long interval = interval_us * 1000LL;
  long long begin = now_ns();
  long long deadline = begin + timeout_ms * 1000000LL;
  long long next = begin;
  long errors = 0;
  int first_errno = 0;
  int announced = 0;
  while (ok_index < 0) {
    long long t = now_ns();
    if (t >= deadline) break;
    if (t >= next && n < MAX_OPEN && attempts < MAX_ATTEMPTS) {
      int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
      if (fd < 0) {
        errors++;
        if (!first_errno) first_errno = errno;
      } else if (connect(fd, (struct sockaddr *)&to, sizeof to) != 0) {
        errors++;
        if (!first_errno) first_errno = errno;
        close(fd);
      } else {
        struct datagram d = {serial, (uint32_t)attempts};
        /* Before send(): a local delivery may be done before send() returns. */
        long long s = now_ns();
        starts[attempts++] = s;
        if (send(fd, &d, sizeof d, 0) < 0) {
          errors++;
          if (!first_errno) first_errno = errno;
        }
        open_[n].fd = fd;
        open_[n].started = s;
        n++;
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
    struct pollfd pfd = {listener, POLLIN, 0};
    long long wait = next - now_ns();
    if (wait < 0) wait = 0;
    if (wait > deadline - t) wait = deadline - t > 0 ? deadline - t : 0;
    struct timespec ts = {wait / 1000000000LL, wait % 1000000000LL};
    int ready = ppoll(&pfd, 1, &ts, NULL);
    if (ready < 0 && errno != EINTR) break;
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
  if (!announced) printf("started %lld\n", begin);
  long long ok_started = ok_index >= 0 ? starts[ok_index] : 0;
  long long before_ok = ok_index > 0 ? starts[ok_index - 1] : 0;
  long long last_started = attempts > 0 ? starts[attempts - 1] : 0;
  printf("{\"ok\":%s,\"beginNs\":\"%lld\",\"firstOkNs\":\"%lld\",\"okSeenNs\":\"%lld\",\"lastStartedNs\":\"%lld\","
         "\"beforeOkNs\":\"%lld\",\"attempts\":%ld,\"errors\":%ld,\"firstError\":\"%s\"}\n",
         ok_index >= 0 ? "true" : "false", begin, ok_started, ok_seen, last_started, before_ok, attempts, errors,
         first_errno ? strerror(first_errno) : "");
  fflush(stdout);
}

` +
  proberMainC({ socketType: 'SOCK_DGRAM', drain: 'drain', name: 'react-udp-probe' });

/** Compiles the UDP prober into `dir`; returns the binary's path. */
export function compileUdpProbe(dir: string): string {
  return compileC(dir, 'react-udp-probe', UDP_PROBE_C, 'the UDP prober');
}
