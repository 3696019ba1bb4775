// The node's interface addresses are read once at construction and then on a timer; a read that
// finds other addresses tells the controller, a failed read keeps the last ones.

import { expect } from 'chai';
import { InterfaceAddressWatch, interfaceAddresses } from '../../src/node/interface-addresses.js';

const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('InterfaceAddressWatch', () => {
  let watch: InterfaceAddressWatch | undefined;
  afterEach(() => watch?.stop());

  it('reads the interfaces once when made, and answers from that read between ticks', () => {
    let reads = 0;
    watch = new InterfaceAddressWatch(() => (reads++, ['192.0.2.1']), 60_000);
    expect(watch.current()).to.deep.equal(['192.0.2.1']);
    watch.current();
    watch.current();
    expect(reads).to.equal(1);
  });

  it('tells of a change found by a later read, once, and not of a read that finds the same', async () => {
    const answers = [['192.0.2.1'], ['192.0.2.1'], ['192.0.2.1', '192.0.2.7'], ['192.0.2.1', '192.0.2.7']];
    let reads = 0;
    watch = new InterfaceAddressWatch(() => answers[Math.min(reads++, answers.length - 1)]!, 5);
    let changes = 0;
    watch.start(() => changes++);
    for (let i = 0; i < 100 && reads < answers.length + 2; i++) await tick(5);
    expect(reads).to.be.greaterThan(answers.length);
    expect(changes).to.equal(1);
    expect(watch.current()).to.deep.equal(['192.0.2.1', '192.0.2.7']);
  });

  it('keeps the last addresses when a read throws, and stops reading when stopped', async () => {
    let reads = 0;
    watch = new InterfaceAddressWatch(() => {
      if (reads++ > 0) throw new Error('getifaddrs failed');
      return ['192.0.2.1'];
    }, 5);
    let changes = 0;
    watch.start(() => changes++);
    for (let i = 0; i < 100 && reads < 4; i++) await tick(5);
    expect(watch.current()).to.deep.equal(['192.0.2.1']);
    expect(changes).to.equal(0);
    watch.stop();
    const stoppedAt = reads;
    await tick(30);
    expect(reads).to.equal(stoppedAt);
  });

  it('leaves out kube-ipvs0, zone suffixes and loopback, reading this machine', () => {
    const addresses = interfaceAddresses();
    expect(addresses).to.not.include('127.0.0.1');
    for (const a of addresses) expect(a).to.not.include('%');
  });

  it("leaves out what always means the node (a pod veth's fe80:: address), once each and sorted", () => {
    const nic = (address: string, family: 'IPv4' | 'IPv6') =>
      ({ address, family, netmask: '', mac: '00:00:00:00:00:00', internal: false, cidr: null }) as never;
    const node = {
      lo: [nic('127.0.0.1', 'IPv4'), nic('::1', 'IPv6')],
      eth0: [nic('172.18.0.1', 'IPv4'), nic('fd18::1', 'IPv6'), nic('fe80::1%eth0', 'IPv6')],
      cni0: [nic('10.244.1.1', 'IPv4'), nic('172.18.0.1', 'IPv4')],
      'kube-ipvs0': [nic('192.0.2.10', 'IPv4')],
    };
    const withPods = {
      ...node,
      veth1a2b: [nic('fe80::8c3e:1ff:fe2a:1%veth1a2b', 'IPv6')],
      veth3c4d: [nic('fe80::8c3e:1ff:fe2a:2%veth3c4d', 'IPv6'), nic('169.254.1.1', 'IPv4')],
    };
    expect(interfaceAddresses(node)).to.deep.equal(['10.244.1.1', '172.18.0.1', 'fd18::1']);
    expect(interfaceAddresses(withPods)).to.deep.equal(interfaceAddresses(node));
  });
});
