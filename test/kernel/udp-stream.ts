// Child process of nft-whole-write-packets.test.ts, run on the node or in a pod namespace: sends
// one-byte UDP datagrams to ADDRESS:PORT from one socket, BURST every millisecond at most, until
// its stdin closes; then prints, as one JSON line, how many it sent. Prints `sending` once the
// first burst went. The test drops every datagram after the NAT hooks, before conntrack confirms
// its connection, so each one is a new connection whose translation is decided anew.
// Usage: udp-stream.js ADDRESS PORT BURST

import * as dgram from 'node:dgram';

const [address, portText, burstText] = process.argv.slice(2);
const burst = Number(burstText);
const sock = dgram.createSocket(address!.includes(':') ? 'udp6' : 'udp4');
// A datagram dropped on its way out fails its send (EPERM): it was sent all the same.
sock.on('error', () => undefined);
let sent = 0;
let stopping = false;
let announced = false;
const payload = Buffer.from('x');

function sendBurst(): void {
  if (stopping) return;
  let pending = burst;
  const started = performance.now();
  for (let i = 0; i < burst; i++) {
    sock.send(payload, () => {
      sent++;
      if (--pending > 0) return;
      if (!announced) {
        announced = true;
        process.stdout.write('sending\n');
      }
      const wait = Math.max(0, 1 - (performance.now() - started));
      setTimeout(sendBurst, wait);
    });
  }
}

sock.connect(Number(portText), address, sendBurst);
process.stdin.resume();
process.stdin.on('end', () => {
  stopping = true;
  process.stdout.write(`${JSON.stringify({ sent })}\n`);
  sock.close();
});
