// The one HTTP server of the process, shared by /metrics (src/metrics/) and /healthz and /readyz
// (src/health/): GET or HEAD on a fixed set of paths, nothing else. Not the place for business logic.

import http from 'node:http';
import type { AddressInfo } from 'node:net';

/** An IP address and TCP port to listen on (or, for kube-proxy's /proxyMode, to ask). */
export interface BindAddress {
  host: string;
  port: number;
}

export interface EndpointResponse {
  status: number;
  contentType: string;
  body: string;
}

export type EndpointHandler = () => EndpointResponse | Promise<EndpointResponse>;

export class HttpEndpoint {
  private constructor(private readonly server: http.Server) {}

  /**
   * Listens on `bind` and answers each path with its handler. A listen failure (address in use,
   * no such address on this host) rejects with one line naming `flag`.
   */
  static async start(bind: BindAddress, flag: string, routes: Record<string, EndpointHandler>): Promise<HttpEndpoint> {
    const server = http.createServer((req, res) => {
      const path = (req.url ?? '/').split('?')[0]!;
      const handler = routes[path];
      if (req.method !== 'GET' && req.method !== 'HEAD') {
        res
          .writeHead(405, { 'content-type': 'text/plain; charset=utf-8', allow: 'GET, HEAD' })
          .end('method not allowed\n');
        return;
      }
      if (!handler) {
        const known = Object.keys(routes).join(', ');
        res.writeHead(404, { 'content-type': 'text/plain; charset=utf-8' }).end(`not found; try ${known}\n`);
        return;
      }
      Promise.resolve()
        .then(handler)
        .then(
          (r) => {
            res.writeHead(r.status, { 'content-type': r.contentType, 'cache-control': 'no-store' });
            res.end(req.method === 'HEAD' ? undefined : r.body);
          },
          (err: unknown) => {
            res
              .writeHead(500, { 'content-type': 'text/plain; charset=utf-8' })
              .end(`${(err as Error)?.message ?? err}\n`);
          },
        );
    });
    // Probes and scrapes are short requests; a slow client must not pin a socket for long.
    server.requestTimeout = 10_000;
    server.headersTimeout = 5_000;
    server.keepAliveTimeout = 5_000;
    await new Promise<void>((resolve, reject) => {
      server.once('error', (err: NodeJS.ErrnoException) => {
        const why =
          err.code === 'EADDRINUSE'
            ? 'the port is in use by another process'
            : err.code === 'EADDRNOTAVAIL'
              ? 'the address is not on this host'
              : err.message;
        reject(new Error(`cannot listen on ${flag} ${formatBindAddress(bind)}: ${why}; choose another with ${flag}`));
      });
      server.listen(bind.port, bind.host, () => resolve());
    });
    return new HttpEndpoint(server);
  }

  /** The address actually bound (the port is known here when 0 was asked). */
  get address(): BindAddress {
    const a = this.server.address() as AddressInfo;
    return { host: a.address, port: a.port };
  }

  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeAllConnections();
    await closed;
  }
}

export function formatBindAddress(bind: BindAddress): string {
  return bind.host.includes(':') ? `[${bind.host}]:${bind.port}` : `${bind.host}:${bind.port}`;
}
