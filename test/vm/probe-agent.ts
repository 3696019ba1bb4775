// A long-lived probe process, one per network namespace of the real-IPVS test (starting a process
// costs seconds in an emulated guest, a probe through a running one does not). It reads one JSON
// request per line on stdin and writes one JSON answer per line on stdout, with the request's id:
//
//   { id, op: 'tcp', address, port, timeoutMs?, localPort? }
//                                       connects (from localPort when given); answer: what the server
//                                       wrote, or refused / timeout (nothing within timeoutMs, default
//                                       15 s) / error:CODE; local: this end's address and port; peer:
//                                       getpeername()
//   { id, op: 'udp', address, port, timeoutMs?, localPort? }
//                                       a connected UDP socket (bound to localPort when given) sends
//                                       one datagram; answer: the reply
//                                       (only a reply from address:port reaches a connected socket),
//                                       or refused (ICMP port unreachable) / timeout; from: its source
//   { id, op: 'serve', address, port, tag }
//                                       TCP and UDP servers on address:port answering
//                                       "<tag> <client address>"; answer: listening
//
// On start it prints { ready: true }.

import * as dgram from 'node:dgram';
import * as net from 'node:net';
import { createInterface } from 'node:readline';

interface Request {
  id: number;
  op: 'tcp' | 'udp' | 'serve';
  address: string;
  port: number;
  tag?: string;
  timeoutMs?: number;
  localPort?: number;
}

interface Answer {
  answer: string;
  local?: string;
  peer?: string;
  from?: string;
}

const DEFAULT_TIMEOUT_MS = 15_000;

function hostPort(address: string | undefined, port: number | undefined): string {
  if (address === undefined || port === undefined) return '';
  return address.includes(':') ? `[${address}]:${port}` : `${address}:${port}`;
}

function tcp(req: Request): Promise<Answer> {
  return new Promise((resolve) => {
    const sock = net.connect({ host: req.address, port: req.port, localPort: req.localPort });
    let data = '';
    let local: string | undefined;
    let peer: string | undefined;
    const done = (answer: string) => {
      clearTimeout(timer);
      sock.destroy();
      resolve({ answer, local, peer });
    };
    const timer = setTimeout(() => done('timeout'), req.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    sock.on('connect', () => {
      local = hostPort(sock.localAddress, sock.localPort);
      peer = hostPort(sock.remoteAddress, sock.remotePort);
    });
    sock.on('data', (d: Buffer) => (data += d.toString()));
    sock.on('end', () => done(data.trim() || 'empty'));
    sock.on('error', (err: NodeJS.ErrnoException) =>
      done(err.code === 'ECONNREFUSED' ? 'refused' : `error:${err.code ?? err.message}`),
    );
  });
}

function udp(req: Request): Promise<Answer> {
  return new Promise((resolve) => {
    const sock = dgram.createSocket(net.isIPv6(req.address) ? 'udp6' : 'udp4');
    let local: string | undefined;
    let finished = false;
    const done = (answer: string, from?: string) => {
      if (finished) return;
      finished = true;
      clearTimeout(timer);
      sock.close();
      resolve({ answer, local, from });
    };
    const timer = setTimeout(() => done('timeout'), req.timeoutMs ?? DEFAULT_TIMEOUT_MS);
    sock.on('message', (msg, rinfo) => done(msg.toString().trim(), hostPort(rinfo.address, rinfo.port)));
    sock.on('error', (err: NodeJS.ErrnoException) =>
      done(err.code === 'ECONNREFUSED' ? 'refused' : `error:${err.code ?? err.message}`),
    );
    const connect = () =>
      sock.connect(req.port, req.address, () => {
        const a = sock.address();
        local = hostPort(a.address, a.port);
        sock.send('ping', (err) => {
          if (err) done(`error:${(err as NodeJS.ErrnoException).code ?? err.message}`);
        });
      });
    if (req.localPort === undefined) connect();
    else sock.bind(req.localPort, connect);
  });
}

async function serve(req: Request): Promise<Answer> {
  const tag = req.tag ?? 'server';
  const server = net.createServer((sock) => {
    sock.on('error', () => undefined);
    sock.end(`${tag} ${sock.remoteAddress}\n`);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(req.port, req.address, () => resolve());
  });
  const sock = dgram.createSocket(net.isIPv6(req.address) ? 'udp6' : 'udp4');
  sock.on('message', (_msg, rinfo) => sock.send(`${tag} ${rinfo.address}\n`, rinfo.port, rinfo.address));
  await new Promise<void>((resolve, reject) => {
    sock.once('error', reject);
    sock.bind(req.port, req.address, () => resolve());
  });
  return { answer: 'listening' };
}

const handlers: Record<Request['op'], (req: Request) => Promise<Answer>> = { tcp, udp, serve };

function write(value: unknown): void {
  process.stdout.write(`${JSON.stringify(value)}\n`);
}

createInterface({ input: process.stdin }).on('line', (line) => {
  let req: Request;
  try {
    req = JSON.parse(line) as Request;
  } catch {
    write({ id: -1, answer: `error:bad request ${line}` });
    return;
  }
  const handler = handlers[req.op];
  if (!handler) {
    write({ id: req.id, answer: `error:unknown op ${String(req.op)}` });
    return;
  }
  handler(req).then(
    (answer) => write({ id: req.id, ...answer }),
    (err: Error) => write({ id: req.id, answer: `error:${err.message}` }),
  );
});
process.stdin.on('end', () => process.exit(0));
write({ ready: true });
