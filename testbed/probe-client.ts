// Child process of probe(): connects or sends once, prints what the server answered.
// Usage: probe-client.js tcp|udp ADDRESS PORT TIMEOUT_MS

import * as dgram from 'node:dgram';
import * as net from 'node:net';

const [protocol, address, portText, timeoutText] = process.argv.slice(2);
const port = Number(portText);
const timeoutMs = Number(timeoutText);
const finish = (answer: string) => {
  process.stdout.write(`${answer}\n`);
  process.exit(0);
};
setTimeout(() => finish('timeout'), timeoutMs).unref();

if (protocol === 'tcp') {
  const sock = net.connect({ host: address!, port });
  let data = '';
  sock.on('data', (d) => (data += d.toString()));
  sock.on('end', () => finish(data.trim() || 'empty'));
  sock.on('error', (err: NodeJS.ErrnoException) =>
    finish(err.code === 'ECONNREFUSED' ? 'refused' : `error:${err.code}`),
  );
} else {
  const sock = dgram.createSocket(address!.includes(':') ? 'udp6' : 'udp4');
  sock.on('message', (msg, rinfo) => finish(`${msg.toString().trim()} from ${rinfo.address}`));
  sock.on('error', (err: NodeJS.ErrnoException) => finish(`error:${err.code}`));
  sock.send('ping', port, address!);
}
