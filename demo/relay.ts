// Byte relays between a loopback TCP port and a Unix socket. The demo's node lives in a network
// namespace of its own; a Unix socket is a file, visible from both sides, so a pair of relays
// makes a port of the node reachable as the same port on the machine's loopback (for kubectl
// and curl) without changing the machine's network.

import { once } from 'node:events';
import net from 'node:net';

function pipeBoth(a: net.Socket, b: net.Socket): void {
  a.pipe(b);
  b.pipe(a);
  const close = () => {
    a.destroy();
    b.destroy();
  };
  a.on('error', close).on('close', close);
  b.on('error', close).on('close', close);
}

/**
 * Accepts on 127.0.0.1, on `preferredPort` when it is free (else on a port the kernel picks), and
 * forwards each connection to the Unix socket, which need not exist yet.
 */
export async function relayTcpToUnix(
  preferredPort: number,
  socketPath: string,
): Promise<{ server: net.Server; port: number }> {
  for (const port of [preferredPort, 0]) {
    const server = net.createServer((client) => pipeBoth(client, net.connect(socketPath)));
    try {
      server.listen(port, '127.0.0.1');
      await once(server, 'listening');
      return { server, port: (server.address() as net.AddressInfo).port };
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EADDRINUSE') throw err;
    }
  }
  throw new Error('no free port on 127.0.0.1');
}

/** Accepts on the Unix socket and forwards each connection to 127.0.0.1:port. */
export async function relayUnixToTcp(socketPath: string, port: number): Promise<net.Server> {
  const server = net.createServer((client) => pipeBoth(client, net.connect(port, '127.0.0.1')));
  server.listen(socketPath);
  await once(server, 'listening');
  return server;
}
