// The one address text (model/ip.ts): RFC 5952 section 4 without the mixed notation of its
// section 5. The reference is Node's own WHATWG URL serializer, whose IPv6 host is exactly that
// (lower case, no leading zeros, the first longest run of two or more zero groups as `::`, never
// a dotted quad); what the kernel's tools print is what inet_ntop prints, and Node's
// net.SocketAddress prints an address with libuv's inet_ntop, which writes the same mixed
// notation as glibc's (`::1.2.3.4`, `::ffff:1.2.3.4`; the kernel tests read nft's and
// ip6tables-save's own output).

import { expect } from 'chai';
import { SocketAddress, isIPv6 } from 'node:net';
import { canonicalAddress, ipBytes, listedAddress, parseCidr, parseIp } from '../../src/model/ip.js';

/** The WHATWG URL serializer's text of an IPv6 address. */
const urlText = (address: string) => new URL(`http://[${address}]/`).hostname.slice(1, -1);
/** inet_ntop's text (libuv's, as Node prints a socket address). */
const ntopText = (address: string) => new SocketAddress({ address, family: 'ipv6' }).address;

/** xorshift32: the same addresses on every run. */
function random(seed: number): (n: number) => number {
  let x = seed;
  return (n) => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) % n;
  };
}

/** Random groups, many zero runs, and many addresses of ::/96 and ::ffff:0:0/96 (mixed notation). */
function randomGroups(next: (n: number) => number): number[] {
  const groups = Array.from({ length: 8 }, () => (next(3) === 0 ? 0 : next(3) === 0 ? next(16) : next(65_536)));
  const kind = next(6);
  if (kind === 0) groups.fill(0, 0, 6);
  if (kind === 1) {
    groups.fill(0, 0, 5);
    groups[5] = 0xffff;
  }
  return groups;
}

describe('one canonical address text', () => {
  // [any form, the model's text]
  const forms: Array<[string, string]> = [
    ['::', '::'],
    ['0:0:0:0:0:0:0:0', '::'],
    ['::1', '::1'],
    ['::0.0.0.1', '::1'],
    ['1::', '1::'],
    ['::ffff:0:0', '::ffff:0:0'],
    ['::ffff:0.0.0.0', '::ffff:0:0'],
    ['::1.2.3.4', '::102:304'],
    ['::ffff:1.2.3.4', '::ffff:102:304'],
    ['::0.1.0.0', '::1:0'],
    ['::255.255.0.1', '::ffff:1'],
    ['::ffff', '::ffff'],
    ['64:ff9b::1.2.3.4', '64:ff9b::102:304'],
    ['1:2:3:4:5:6:1.2.3.4', '1:2:3:4:5:6:102:304'],
    // Zero runs: the longest compressed, the first of equal ones, a single zero group never.
    ['1:0:0:1:0:0:1:1', '1::1:0:0:1:1'],
    ['1:0:0:0:1:0:0:0', '1::1:0:0:0'],
    ['0:0:1:0:0:1:0:0', '::1:0:0:1:0:0'],
    ['1:0:0:1:0:0:0:1', '1:0:0:1::1'],
    ['1:0:1:1:1:1:1:1', '1:0:1:1:1:1:1:1'],
    ['0:1:1:1:1:1:1:1', '0:1:1:1:1:1:1:1'],
    ['1:1:1:1:1:1:1:0', '1:1:1:1:1:1:1:0'],
    ['1:2:3:4:5:6:7::', '1:2:3:4:5:6:7:0'],
    ['::2:3:4:5:6:7:8', '0:2:3:4:5:6:7:8'],
    // Case and leading zeros.
    ['2001:0DB8:0000:0000:0000:0000:0000:0001', '2001:db8::1'],
    ['FE80::ABCD:0001', 'fe80::abcd:1'],
  ];

  it('writes each edge form as RFC 5952 without mixed notation, as the URL serializer does', () => {
    for (const [form, text] of forms) {
      expect(canonicalAddress(form), form).to.equal(text);
      expect(urlText(form), `the reference for ${form}`).to.equal(text);
      // And as the model takes an address (IPv4-mapped ones and dotted text it refuses).
      const mapped = /^::ffff:[^:]+:[^:]+$/.test(text);
      if (!form.includes('.') && !mapped) expect(parseIp(form)?.address, form).to.equal(text);
      if (!mapped) expect(parseCidr(`${text}/128`)?.address, `${text}/128`).to.equal(text);
    }
  });

  it('reads what inet_ntop prints as the model writes it: mixed notation for ::/96 and ::ffff:0:0/96', () => {
    expect(ntopText('::102:304')).to.equal('::1.2.3.4');
    expect(ntopText('::ffff:102:304')).to.equal('::ffff:1.2.3.4');
    for (const [form, text] of forms) expect(listedAddress(ntopText(form)), form).to.equal(text);
  });

  it('agrees with the URL serializer on 5,000 random addresses, in every form a tool prints', () => {
    const next = random(0x5eed);
    const wrong: string[] = [];
    let mixed = 0;
    for (let i = 0; i < 5_000; i++) {
      const groups = randomGroups(next);
      const full = groups.map((g) => g.toString(16)).join(':');
      const text = urlText(full);
      const ntop = ntopText(full);
      if (ntop.includes('.')) mixed++;
      const padded = groups.map((g) => g.toString(16).padStart(4, '0')).join(':');
      for (const form of [full, padded, padded.toUpperCase(), ntop, text]) {
        if (canonicalAddress(form) !== text) wrong.push(`${form} -> ${canonicalAddress(form)}, not ${text}`);
      }
      if (listedAddress(ntop) !== text) wrong.push(`listed ${ntop} -> ${listedAddress(ntop)}, not ${text}`);
      // The model's own text, and its bytes back.
      if (!(groups.slice(0, 5).every((g) => g === 0) && groups[5] === 0xffff)) {
        const ip = parseIp(full);
        if (ip?.address !== text) wrong.push(`parseIp ${full} -> ${ip?.address}, not ${text}`);
        else if (ipBytes(ip).join() !== groups.flatMap((g) => [g >> 8, g & 0xff]).join())
          wrong.push(`bytes of ${full}`);
      }
    }
    expect(wrong.slice(0, 10)).to.deep.equal([]);
    expect(mixed, 'addresses inet_ntop prints in mixed notation').to.be.above(1_000);
  });

  it('leaves text that is no IPv6 address as it is, as node:net judges it', () => {
    const next = random(0xc0de);
    const pieces = ['0', '1', 'f', 'F', 'a', ':', '::', '.', '9', '25', '255', 'ffff', '0000', '1.2.3.4', '%', 'g'];
    const wrong: string[] = [];
    let valid = 0;
    for (let i = 0; i < 50_000; i++) {
      let text = '';
      for (let n = 1 + next(12); n > 0; n--) text += pieces[next(pieces.length)];
      const want = isIPv6(text) && !text.includes('%') ? urlText(text) : text;
      if (want !== text || isIPv6(text)) valid++;
      if (canonicalAddress(text) !== want) wrong.push(`${text} -> ${canonicalAddress(text)}, not ${want}`);
    }
    expect(wrong.slice(0, 10)).to.deep.equal([]);
    expect(valid).to.be.above(500);
    for (const text of ['', '1.2.3.4', '::1%eth0', '::01.2.3.4', '::1.2.3', '::256.1.1.1', 'fe80::1/64', '12345::']) {
      expect(canonicalAddress(text), text).to.equal(text);
      expect(listedAddress(text), text).to.equal(text);
    }
  });
});
