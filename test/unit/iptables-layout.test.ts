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
import { emptyNatTable } from '../../src/backends/iptables/parse.js';
import { planPartialWrite } from '../../src/backends/iptables/partial-write.js';
import { IptablesAnnex } from '../../src/backends/iptables/annex.js';
import { renderFamilyRestore } from '../../src/backends/iptables/render.js';
import { ipBytes, parseIp } from '../../src/model/ip.js';
import type { Entry } from '../../src/model/types.js';
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

describe('iptables partial write of one large bucket', function () {
  // Seconds of string work on a loaded machine; what is checked is the lines, never the time.
  this.timeout(60_000);
  // One tenant's Service can put tens of thousands of ports on one address, so one bucket can hold
  // more rules than a JavaScript call takes arguments (about 120,000 here).
  const shape = { localPodMatch: { kind: 'cidrs' as const, cidrs: ['10.244.1.0/24'] }, masqueradeMark: 0x4000 };
  const entry = ([protocol, port]: [Entry['protocol'], number], clusterIp = '10.96.0.7'): Entry => ({
    family: 'ipv4',
    externalIp: '203.0.113.7',
    protocol,
    port,
    clusterIp,
    service: 'tenant/large',
  });
  const ports = (['TCP', 'UDP'] as const).flatMap((protocol) =>
    Array.from({ length: 60_000 }, (_, i): [Entry['protocol'], number] => [protocol, 1 + i]),
  );

  it('adds, rewrites and deletes rules of a bucket of 240,000 rules per hook', () => {
    const empty = IptablesAnnex.of(
      renderFamilyRestore('ipv4', { entries: [], localPodMatch: shape.localPodMatch }, 0x4000, emptyNatTable()),
      { ...shape, useKubeMarkMasq: false },
    );
    const added = planPartialWrite(
      'ipv4',
      empty,
      [],
      ports.map((p) => entry(p)),
      Number.POSITIVE_INFINITY,
    );
    const appended = added.text!.split('\n').filter((l) => l.startsWith('-A IPVS_OUTPUT_7 '));
    expect(appended).to.have.length(240_000);
    for (const [bucket, held] of added.buckets) empty.setBucket(bucket, held);
    // Every entry moves to another ClusterIP: past the bound the bucket is written whole, under it
    // each rule is deleted and added.
    const moved = ports.map((p) => entry(p, '10.96.0.8'));
    const rewrite = planPartialWrite(
      'ipv4',
      empty,
      ports.map((p) => entry(p)),
      moved,
      4,
    );
    expect(rewrite.rewritten).to.equal(2);
    const spelled = planPartialWrite(
      'ipv4',
      empty,
      ports.map((p) => entry(p)),
      moved,
      Number.POSITIVE_INFINITY,
    );
    // The mark rules stay (they do not name the ClusterIP): one DNAT rule per entry and hook goes.
    expect(spelled.deletes).to.equal(240_000);
  });
});
