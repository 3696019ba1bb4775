// Child process of UdpFlow: sends `TAG` from a fixed source port to ADDRESS:PORT every
// INTERVAL_MS until killed, as a DNS forwarder, statsd or syslog sender does.
// Usage: udp-flow-sender.js ADDRESS PORT SOURCE_PORT TAG INTERVAL_MS

import * as dgram from 'node:dgram';

const [address, portText, sourcePortText, tag, intervalText] = process.argv.slice(2);
const sock = dgram.createSocket(address!.includes(':') ? 'udp6' : 'udp4');
// ICMP errors (nothing listening) must not stop the flow.
sock.on('error', () => undefined);
sock.bind(Number(sourcePortText), () => {
  setInterval(() => sock.send(tag!, Number(portText), address!, () => undefined), Number(intervalText));
  process.stdout.write('sending\n');
});
