// Child process of probe(): connects or sends once, prints what the server answered, `refused`
// (ECONNREFUSED: a TCP reset or an ICMP port unreachable) or `timeout`.
// Usage: probe-client.js tcp|udp ADDRESS PORT TIMEOUT_MS [LOCAL_PORT]

import * as dgram from 'node:dgram';
import * as net from 'node:net';

const [protocol, address, portText, timeoutText, localPortText] = process.argv.slice(2);
const localPort = localPortText ? Number(localPortText) : undefined;
const port = Number(portText);
const timeoutMs = Number(timeoutText);
const finish = (answer: string) => {
  process.stdout.write(`${answer}\n`);
  process.exit(0);
};
setTimeout(() => finish('timeout'), timeoutMs).unref();

if (protocol === 'tcp') {
  const sock = net.connect({ host: address!, port, localPort });
  let data = '';
  sock.on('data', (d) => (data += d.toString()));
  sock.on('end', () => finish(data.trim() || 'empty'));
  sock.on('error', (err: NodeJS.ErrnoException) =>
    finish(err.code === 'ECONNREFUSED' ? 'refused' : `error:${err.code}`),
  );
} else {
  // Connected, as a UDP client that expects an answer is: an ICMP port unreachable for its
  // datagram (IPVS's virtual service without a real server) then fails the next receive with
  // ECONNREFUSED; an unconnected socket would never hear of it.
  const sock = dgram.createSocket(address!.includes(':') ? 'udp6' : 'udp4');
  sock.on('message', (msg, rinfo) => finish(`${msg.toString().trim()} from ${rinfo.address}`));
  sock.on('error', (err: NodeJS.ErrnoException) =>
    finish(err.code === 'ECONNREFUSED' ? 'refused' : `error:${err.code}`),
  );
  const send = () => sock.connect(port, address!, () => sock.send('ping'));
  if (localPort === undefined) send();
  else sock.bind(localPort, send);
}
