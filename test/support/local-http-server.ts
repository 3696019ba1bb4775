// An HTTP server on 127.0.0.1 and a port of its own, whose answers the test sets (`handler`): the
// stand-in of an address the controller reads, such as kube-proxy's metrics address.

import * as http from 'node:http';
import * as net from 'node:net';
import { once } from 'node:events';
import type { BindAddress } from '../../src/http/endpoint.js';

export class LocalHttpServer {
  handler: http.RequestListener = (_req, res) => res.end('');
  private constructor(readonly server: http.Server) {}

  static async start(handler?: http.RequestListener): Promise<LocalHttpServer> {
    const s = new LocalHttpServer(http.createServer((req, res) => s.handler(req, res)));
    if (handler) s.handler = handler;
    s.server.listen(0, '127.0.0.1');
    await once(s.server, 'listening');
    return s;
  }

  get address(): BindAddress {
    return { host: '127.0.0.1', port: (this.server.address() as net.AddressInfo).port };
  }

  async stop(): Promise<void> {
    this.server.closeAllConnections();
    await new Promise((r) => this.server.close(r));
  }
}

/** A port of 127.0.0.1 that nothing listens on (one the system gave, then closed): a connection is refused. */
export async function closedLoopbackPort(): Promise<number> {
  const server = net.createServer();
  server.listen(0, '127.0.0.1');
  await once(server, 'listening');
  const port = (server.address() as net.AddressInfo).port;
  await new Promise((r) => server.close(r));
  return port;
}
