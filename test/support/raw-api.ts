// An HTTPS server whose answers each test writes byte by byte: for what the API stand-in never
// sends (an HTTP 410 or 403 to a watch, a line cut inside a character, a connection reset in the
// middle of a line). Certificates are made with openssl as a cluster's are: a CA, a serving
// certificate for 127.0.0.1, and a client certificate the server asks for.

import { execFile } from 'node:child_process';
import https from 'node:https';
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface TlsFixture {
  caPem: string;
  serverCertPem: string;
  serverKeyPem: string;
  clientCertPem: string;
  clientKeyPem: string;
  /** A CA that signed nothing here: a kubeconfig trusting only it must refuse the server. */
  otherCaPem: string;
}

export async function makeTlsFixture(): Promise<TlsFixture> {
  const dir = await mkdtemp(join(tmpdir(), 'raw-api-'));
  const f = (name: string) => join(dir, name);
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  const ca = (name: string) =>
    run('openssl', [
      'req',
      '-x509',
      ...ec,
      '-keyout',
      f(`${name}.key`),
      '-out',
      f(`${name}.crt`),
      '-days',
      '30',
      '-subj',
      `/CN=${name}`,
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
  const leaf = async (name: string, ext: string[]) => {
    await run('openssl', ['req', ...ec, '-keyout', f(`${name}.key`), '-out', f(`${name}.csr`), '-subj', `/CN=${name}`]);
    await writeFile(f(`${name}.ext`), ['basicConstraints=CA:FALSE', ...ext, ''].join('\n'));
    await run('openssl', [
      'x509',
      '-req',
      '-in',
      f(`${name}.csr`),
      '-CA',
      f('ca.crt'),
      '-CAkey',
      f('ca.key'),
      '-CAcreateserial',
      '-out',
      f(`${name}.crt`),
      '-days',
      '30',
      '-extfile',
      f(`${name}.ext`),
    ]);
  };
  try {
    await ca('ca');
    await ca('other-ca');
    await leaf('server', ['extendedKeyUsage=serverAuth', 'subjectAltName=IP:127.0.0.1']);
    await leaf('watch-client', ['extendedKeyUsage=clientAuth']);
    const read = (name: string) => readFile(f(name), 'utf8');
    return {
      caPem: await read('ca.crt'),
      serverCertPem: await read('server.crt'),
      serverKeyPem: await read('server.key'),
      clientCertPem: await read('watch-client.crt'),
      clientKeyPem: await read('watch-client.key'),
      otherCaPem: await read('other-ca.crt'),
    };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

export type RawHandler = (req: IncomingMessage, res: ServerResponse, url: URL) => void;

export class RawApiServer {
  /** Every request, in order. */
  readonly requests: Array<{
    url: URL;
    headers: IncomingMessage['headers'];
    clientCN?: string;
    clientAuthorized: boolean;
  }> = [];
  /** Connections open now (TLS), and their TCP sockets. */
  readonly sockets = new Set<Socket>();
  private readonly tcpSockets = new Set<Socket>();
  handler: RawHandler = (_req, res) => res.writeHead(404).end();

  private constructor(
    private readonly server: https.Server,
    readonly url: string,
    private readonly tls: TlsFixture,
  ) {}

  static async start(tls: TlsFixture): Promise<RawApiServer> {
    const server = https.createServer({
      key: tls.serverKeyPem,
      cert: tls.serverCertPem,
      ca: tls.caPem,
      // Asked for, not required: a test sees whether the client presented it.
      requestCert: true,
      rejectUnauthorized: false,
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const raw = new RawApiServer(server, `https://127.0.0.1:${(server.address() as AddressInfo).port}`, tls);
    server.on('tlsClientError', () => undefined);
    server.on('connection', (socket: Socket) => {
      raw.tcpSockets.add(socket);
      socket.on('close', () => raw.tcpSockets.delete(socket));
    });
    server.on('secureConnection', (socket) => {
      raw.sockets.add(socket);
      socket.on('close', () => raw.sockets.delete(socket));
    });
    server.on('request', (req: IncomingMessage, res: ServerResponse) => {
      const url = new URL(req.url ?? '/', 'https://raw');
      const socket = req.socket as import('node:tls').TLSSocket;
      const peer = socket.getPeerCertificate();
      raw.requests.push({
        url,
        headers: req.headers,
        clientCN: peer?.subject?.CN as string | undefined,
        clientAuthorized: socket.authorized,
      });
      res.on('error', () => undefined);
      raw.handler(req, res, url);
    });
    return raw;
  }

  /** A kubeconfig (client-node options) for this server: CA, bearer token, client certificate. */
  kubeconfigOptions(user: { token?: string; clientCert?: boolean } = {}, ca = this.tls.caPem): object {
    const b64 = (s: string) => Buffer.from(s).toString('base64');
    return {
      clusters: [{ name: 'raw', server: this.url, caData: b64(ca) }],
      users: [
        {
          name: 'u',
          ...(user.token !== undefined ? { token: user.token } : {}),
          ...(user.clientCert ? { certData: b64(this.tls.clientCertPem), keyData: b64(this.tls.clientKeyPem) } : {}),
        },
      ],
      contexts: [{ name: 'x', cluster: 'raw', user: 'u' }],
      currentContext: 'x',
    };
  }

  /** Resets every connection (TCP RST), as a crashed server or a middlebox would. */
  resetConnections(): void {
    for (const socket of this.tcpSockets) socket.resetAndDestroy();
  }

  async stop(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    this.server.closeAllConnections();
    await new Promise<void>((resolve) => this.server.close(() => resolve()));
  }
}
