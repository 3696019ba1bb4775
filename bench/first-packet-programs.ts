// The two small C programs of the first-packet measure, compiled when the benchmark starts.
// A connect loop in C: Node's event loop would cost more per connection than the NAT lookup
// being measured. Each connection is closed with a reset, so no TIME_WAIT piles up.

import { compileC } from './packet-probe.js';

/** connect-loop ADDRESS PORT COUNT: prints {"answer","failures","p50Us","p90Us","p99Us","meanUs"}. */
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

export interface Programs {
  connectLoop: string;
  acceptLoop: string;
}

export function compilePrograms(dir: string): Programs {
  return {
    connectLoop: compileC(dir, 'connect-loop', CONNECT_LOOP_C, 'the first-packet measure'),
    acceptLoop: compileC(dir, 'accept-loop', ACCEPT_LOOP_C, 'the first-packet measure'),
  };
}
