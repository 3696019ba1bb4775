// Where the iptables backend puts its rules (src/backends/iptables/layout.ts): the bucket of an
// address, the gotos as -save prints them back, and which chain names are ours. Pure.

import { expect } from 'chai';
import {
  bucketChain,
  bucketOf,
  byBucket,
  gotoSpec,
  isOurChain,
  parseBucketChain,
} from '../../src/backends/iptables/layout.js';
import { ipBytes, parseIp } from '../../src/model/ip.js';
import { seededRandom } from '../support/fixtures.js';

describe('iptables layout', () => {
  it('puts an address in the bucket of its last byte: decimal for IPv4, hexadecimal for IPv6', () => {
    expect(bucketOf('ipv4', '10.19.20.201')).to.equal('201');
    expect(bucketOf('ipv4', '10.19.20.0')).to.equal('0');
    expect(bucketOf('ipv6', '2001:db8::c9')).to.equal('c9');
    expect(bucketOf('ipv6', '2001:db8::1c9')).to.equal('c9');
    expect(bucketOf('ipv6', '2001:db8::1:0')).to.equal('0');
    expect(bucketOf('ipv6', '2001:db8::')).to.equal('0');
    expect(bucketOf('ipv6', '::')).to.equal('0');
    expect(bucketOf('ipv6', 'fd00::a')).to.equal('a');
    // Read from the text, it is the last byte the address's parse gives, for any address.
    const random = seededRandom(11);
    for (let i = 0; i < 2000; i++) {
      const groups = Array.from({ length: 8 }, () => (random() < 0.3 ? 0 : Math.floor(random() * 0x10000)));
      const v6 = parseIp(groups.map((g) => g.toString(16)).join(':'))!;
      expect(bucketOf('ipv6', v6.address), v6.address).to.equal(ipBytes(v6).at(-1)!.toString(16));
      const v4 = Array.from({ length: 4 }, () => Math.floor(random() * 256)).join('.');
      expect(bucketOf('ipv4', v4)).to.equal(String(ipBytes(parseIp(v4)!).at(-1)));
    }
  });

  it('goes to a bucket with a match of that byte, written as -save prints it back', () => {
    expect(gotoSpec('ipv4', 'IPVS_OUTPUT', '201')).to.equal('-d 0.0.0.201/0.0.0.255 -g IPVS_OUTPUT_201');
    expect(gotoSpec('ipv4', 'IPVS_PREROUTING', '0')).to.equal('-d 0.0.0.0/0.0.0.255 -g IPVS_PREROUTING_0');
    expect(gotoSpec('ipv6', 'IPVS_OUTPUT', 'c9')).to.equal('-d ::c9/::ff -g IPVS_OUTPUT_c9');
    expect(gotoSpec('ipv6', 'IPVS_OUTPUT', '0')).to.equal('-d ::/::ff -g IPVS_OUTPUT_0');
    expect(['201', '3', '57', '0'].sort(byBucket('ipv4'))).to.deep.equal(['0', '3', '57', '201']);
    expect(['c9', '10', 'a', '0'].sort(byBucket('ipv6'))).to.deep.equal(['0', 'a', '10', 'c9']);
  });

  it('knows its chains by name: the entry chains and their buckets, nothing else', () => {
    expect(bucketChain('IPVS_OUTPUT', '201')).to.equal('IPVS_OUTPUT_201');
    expect(parseBucketChain('IPVS_PREROUTING_c9')).to.deep.equal({ entry: 'IPVS_PREROUTING', bucket: 'c9' });
    expect(parseBucketChain('IPVS_OUTPUT')).to.equal(undefined);
    for (const name of ['IPVS_OUTPUT', 'IPVS_PREROUTING', 'IPVS_OUTPUT_0', 'IPVS_OUTPUT_255', 'IPVS_PREROUTING_ff']) {
      expect(isOurChain(name), name).to.equal(true);
    }
    for (const name of ['IPVS_OUTPUT_OTHER', 'IPVS_OUTPUT_1234', 'IPVS_POSTROUTING', 'KUBE-SERVICES', 'IPVS_OUTPUT_']) {
      expect(isOurChain(name), name).to.equal(false);
    }
  });
});
