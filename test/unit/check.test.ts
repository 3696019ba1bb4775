// What `check` reads from the node's tools, and its flags: conntrack's entries, IPVS's table,
// kube-proxy's KUBE-POSTROUTING as a marked packet walks it.

import { expect } from 'chai';
import { parseCheckArgs } from '../../src/cli/check/check-options.js';
import { parseIpvsTable } from '../../src/cli/check/ipvs-table.js';
import { jumpsToKubePostrouting, walkMarked } from '../../src/cli/check/masquerade.js';
import { judgePaths } from '../../src/cli/check/paths.js';
import type { Entry } from '../../src/model/types.js';
import { parseConntrackLine, type PathTry, type tryPath } from '../../src/probe/path-probe.js';
import { UsageError } from '../../src/config/flag-values.js';
import { webEntry } from '../support/fixtures.js';

describe('check: conntrack entries', () => {
  it('reads both tuples of a translated TCP entry, [UNREPLIED] and the state', () => {
    const v = parseConntrackLine(
      'tcp      6 118 SYN_SENT src=172.18.0.1 dst=192.0.2.10 sport=40100 dport=80 [UNREPLIED] ' +
        'src=10.244.2.5 dst=172.18.0.1 sport=8080 dport=40100 mark=0 use=1',
    )!;
    expect(v).to.deep.equal({
      state: 'SYN_SENT',
      original: { src: '172.18.0.1', dst: '192.0.2.10', sport: 40100, dport: 80 },
      reply: { src: '10.244.2.5', dst: '172.18.0.1', sport: 8080, dport: 40100 },
      unreplied: true,
      translated: true,
    });
  });

  it('an entry answered by the address dialled is not translated; IPv6 text is compared canonical', () => {
    const v = parseConntrackLine(
      'udp      17 29 src=2001:db8::1 dst=2001:0db8:0000::10 sport=5000 dport=53 src=2001:db8::10 dst=2001:db8::1 sport=53 dport=5000 mark=0 use=1',
    )!;
    expect(v.translated).to.equal(false);
    expect(v.original.dst).to.equal('2001:db8::10');
    expect(v.state).to.equal(undefined);
  });

  it('a port translated alone counts as translated; a line without two tuples is nothing', () => {
    const v = parseConntrackLine(
      'tcp 6 10 CLOSE src=1.1.1.1 dst=2.2.2.2 sport=1 dport=80 src=2.2.2.2 dst=1.1.1.1 sport=81 dport=1',
    );
    expect(v!.translated).to.equal(true);
    expect(parseConntrackLine('conntrack v1.4.7 (conntrack-tools): 0 flow entries have been shown.')).to.equal(
      undefined,
    );
    expect(parseConntrackLine('tcp 6 10 src=1.1.1.1 dst=2.2.2.2 sport=1 dport=80')).to.equal(undefined);
    expect(parseConntrackLine('')).to.equal(undefined);
  });
});

describe('check: an answered path whose entry is gone when read', () => {
  const entry: Entry = webEntry({ service: 'default/svc-a' });
  const view = {
    original: { src: '10.96.0.10', dst: '10.96.0.10', sport: 40000, dport: 80 },
    reply: { src: '10.244.2.5', dst: '172.18.0.1', sport: 8080, dport: 40000 },
    unreplied: false,
    translated: true,
    atSocket: true as const,
  };
  const answered: PathTry = { protocol: 'TCP', address: '192.0.2.10', port: 80, outcome: 'answered', ms: 1 };
  const tries = (results: PathTry[]) => {
    let n = 0;
    const one: typeof tryPath = () => Promise.resolve(results[Math.min(n++, results.length - 1)]!);
    return { one, count: () => n };
  };

  it('is tried once more; the second entry judges it, and the line says so', async () => {
    const t = tries([
      { ...answered, conntrackProblem: 'conntrack -G found no entry' },
      { ...answered, conntrack: view },
    ]);
    const [r] = await judgePaths([entry], [], undefined, 100, t.one);
    expect(t.count()).to.equal(2);
    expect(r!.ok).to.equal(true);
    expect(r!.detail).to.match(/translated at the socket .*; on a second try: the first entry was gone when read$/);
  });

  it('without an entry on the second try either, it stays not known; an entry read at once is tried once', async () => {
    const gone = tries([{ ...answered, conntrackProblem: 'conntrack -G found no entry' }]);
    const [r] = await judgePaths([entry], [], undefined, 100, gone.one);
    expect([gone.count(), r!.ok]).to.deep.equal([2, false]);
    expect(r!.detail).to.match(/^answered; whether it was translated is not known: conntrack -G found no entry$/);
    const first = tries([{ ...answered, conntrack: view }]);
    const [s] = await judgePaths([entry], [], undefined, 100, first.one);
    expect([first.count(), s!.ok, s!.detail?.includes('second try')]).to.deep.equal([1, true, false]);
  });
});

describe("check: IPVS's table", () => {
  const TABLE = [
    'IP Virtual Server version 1.2.1 (size=4096)',
    'Prot LocalAddress:Port Scheduler Flags',
    '  -> RemoteAddress:Port Forward Weight ActiveConn InActConn',
    'TCP  0A60000A:0050 rr',
    '  -> 0AF40205:1F90      Masq    1      0          0',
    '  -> 0AF40206:1F90      Masq    0      0          3',
    'UDP  0A60000A:0050 rr',
    'TCP  [fd00:0000:0000:0000:0000:0000:0000:0010]:0050 rr',
    '  -> [fd44:0000:0000:0002:0000:0000:0000:0005]:1F90      Masq    1      0          0',
    'FWM  00000001 rr',
    '  -> 0AF40205:1F90      Masq    1      0          0',
    '',
  ].join('\n');

  it('counts the real servers of each virtual service with a weight, by protocol, address and port', () => {
    expect([...parseIpvsTable(TABLE)]).to.deep.equal([
      ['TCP 10.96.0.10 80', 1],
      ['UDP 10.96.0.10 80', 0],
      ['TCP fd00::10 80', 1],
    ]);
  });
});

describe("check: kube-proxy's masquerade of the mark", () => {
  const M = 0x4000;
  it('kube-proxy 1.20 and later: RETURN for the unmarked, the xor, then MASQUERADE', () => {
    const rules = [
      '-m comment --comment "hairpin" -m set --match-set KUBE-LOOP-BACK dst,dst,src -j MASQUERADE',
      '-m mark ! --mark 0x4000/0x4000 -j RETURN',
      '-j MARK --xor-mark 0x4000',
      '-m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully',
    ];
    expect(walkMarked(rules, M)).to.equal('masquerade');
    // Another bit: the packet is returned before the masquerade.
    expect(walkMarked(rules, 0x8000)).to.equal('return');
    expect(walkMarked(rules.slice(0, 3), M)).to.equal('end');
  });

  it('before 1.20: one rule that masquerades the marked', () => {
    expect(walkMarked(['-m comment --comment "x" -m mark --mark 0x4000/0x4000 -j MASQUERADE'], M)).to.equal(
      'masquerade',
    );
    expect(walkMarked(['-m mark --mark 0x4000/0x4000 -j MASQUERADE'], 0x1)).to.equal('end');
    expect(walkMarked(['-j RETURN', '-j MASQUERADE'], M)).to.equal('return');
  });

  it('POSTROUTING must jump to it unconditionally', () => {
    expect(
      jumpsToKubePostrouting(['-m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING']),
    ).to.equal(true);
    expect(jumpsToKubePostrouting(['-s 10.0.0.0/8 -j KUBE-POSTROUTING'])).to.equal(false);
    expect(jumpsToKubePostrouting([])).to.equal(false);
  });
});

describe("check's flags", () => {
  const env = {};
  it("defaults: a sample of 5, 2 s, text, the controller's health address on loopback", () => {
    const { check } = parseCheckArgs([], env);
    expect(check).to.deep.equal({
      sample: 5,
      timeoutMs: 2000,
      output: 'text',
      controller: { host: '127.0.0.1', port: 9478 },
    });
    expect(parseCheckArgs(['--healthz-bind-address=[::]:9999'], env).check.controller).to.deep.equal({
      host: '::1',
      port: 9999,
    });
    expect(parseCheckArgs(['--controller-address='], env).check.controller).to.equal(undefined);
    // In the DaemonSet's pod: the node's address, as its health endpoint is bound.
    expect(parseCheckArgs([], { HOST_IP: '172.18.0.1' }).check.controller).to.deep.equal({
      host: '172.18.0.1',
      port: 9478,
    });
    expect(parseCheckArgs([], { HOST_IP: 'bogus' }).check.controller).to.deep.equal({ host: '127.0.0.1', port: 9478 });
  });

  it('refuses what it cannot bound or name', () => {
    for (const [args, message] of [
      [['--service=default'], /--service: 'default' is not namespace\/name/],
      [['--service=a/b/c'], /not namespace\/name/],
      [['--sample=51'], /--sample: at most 50/],
      [['--sample=0'], /--sample/],
      [['--timeout=31s'], /--timeout: at most 30s/],
      [['--output=yaml'], /--output/],
    ] as const) {
      expect(() => parseCheckArgs([...args], env), args.join(' ')).to.throw(UsageError, message);
    }
  });
});
