// Which rules another writer keeps above our jump can take packets away from it
// (src/backends/iptables/precedence.ts), judged on nat tables as `-save` prints them, and the
// jump repairs that follow from it.

import { expect } from 'chai';
import { parseNatSave } from '../../src/backends/iptables/parse.js';
import { ourJumpFirstInEffect, renderJumpRepairs, targetOf } from '../../src/backends/iptables/precedence.js';

/** A nat table with these extra chains and the given rules above ours in PREROUTING (OUTPUT: ours alone). */
function table(above: string[], chains: Record<string, string[]> = {}): string {
  const lines = [
    '*nat',
    ':PREROUTING ACCEPT [0:0]',
    ':OUTPUT ACCEPT [0:0]',
    ':IPVS_PREROUTING - [0:0]',
    ':IPVS_OUTPUT - [0:0]',
  ];
  for (const name of Object.keys(chains)) lines.push(`:${name} - [0:0]`);
  for (const spec of above) lines.push(`-A PREROUTING ${spec}`);
  lines.push('-A PREROUTING -j IPVS_PREROUTING', '-A OUTPUT -j IPVS_OUTPUT');
  for (const [name, specs] of Object.entries(chains)) for (const spec of specs) lines.push(`-A ${name} ${spec}`);
  lines.push('COMMIT', '');
  return lines.join('\n');
}

const inEffect = (save: string) => ourJumpFirstInEffect(parseNatSave(save), 'PREROUTING', 'IPVS_PREROUTING');

describe('iptables: rules above our jump', () => {
  it('reads a rule target past quoted comments', () => {
    expect(targetOf('-m comment --comment "x -j ACCEPT" -j MARK --set-xmark 0x1/0x1')).to.deep.equal({
      kind: 'jump',
      name: 'MARK',
    });
    expect(targetOf('-s 10.0.0.0/8 -g KUBE-X')).to.deep.equal({ kind: 'goto', name: 'KUBE-X' });
    expect(targetOf('-s 10.0.0.0/8')).to.equal(undefined);
  });

  it('our jump alone at rule 1 needs nothing', () => {
    expect(inEffect(table([]))).to.equal(true);
    expect(renderJumpRepairs(parseNatSave(table([])))).to.deep.equal([]);
  });

  it('leaves harmless rules above ours: marks, logs, counters, chains that only mark or return', () => {
    const calico = {
      'cali-PREROUTING': ['-m comment --comment "cali:6gwbT8clXdHdC1b1" -j cali-fip-dnat'],
      'cali-fip-dnat': [],
    };
    expect(inEffect(table(['-m comment --comment "cali:6gwbT8clXdHdC1b1" -j cali-PREROUTING'], calico))).to.equal(true);
    const marks = {
      'KUBE-MARK-MASQ': ['-j MARK --or-mark 0x4000'],
      'SOME-CHAIN': ['-s 10.0.0.0/8 -j RETURN', '-j KUBE-MARK-MASQ'],
    };
    expect(inEffect(table(['-j SOME-CHAIN', '-j LOG --log-prefix "x"', '-s 192.0.2.0/24'], marks))).to.equal(true);
    expect(renderJumpRepairs(parseNatSave(table(['-j SOME-CHAIN'], marks)))).to.deep.equal([]);
  });

  it('repairs for any rule above ours that can end the walk', () => {
    const harmful: Array<[string[], Record<string, string[]>]> = [
      // kube-proxy's IPVS mode: its chain ACCEPTs the Services' addresses.
      [
        ['-m comment --comment "kubernetes service portals" -j KUBE-SERVICES'],
        { 'KUBE-SERVICES': ['-m set --match-set KUBE-LOAD-BALANCER dst,dst -j ACCEPT'] },
      ],
      // A harmless-looking chain two jumps down DNATs.
      [
        ['-j A'],
        { A: ['-j MARK --or-mark 0x1', '-j B'], B: ['-d 192.0.2.1/32 -p tcp -j DNAT --to-destination 10.0.0.1'] },
      ],
      // RETURN in the hook's own chain: the policy decides.
      [['-s 10.0.0.0/8 -j RETURN'], {}],
      // A goto: RETURN there leaves PREROUTING.
      [['-g A'], { A: ['-j RETURN'] }],
      // A chain this view does not hold.
      [['-j UNLISTED'], {}],
      // A loop is never harmless.
      [['-j A'], { A: ['-j B'], B: ['-j A'] }],
      [['-j ACCEPT'], {}],
      [['-p tcp -j REDIRECT --to-ports 15001'], {}],
    ];
    for (const [above, chains] of harmful) {
      const save = table(above, chains);
      expect(inEffect(save), above.join(' | ')).to.equal(false);
      expect(renderJumpRepairs(parseNatSave(save)), above.join(' | ')).to.deep.equal([
        '-D PREROUTING -j IPVS_PREROUTING',
        '-I PREROUTING 1 -j IPVS_PREROUTING',
      ]);
    }
  });

  it('repairs a second jump to our chain, even below ours', () => {
    const save = table([]).replace(
      '-A OUTPUT -j IPVS_OUTPUT',
      '-A OUTPUT -j IPVS_OUTPUT\n-A PREROUTING -s 10.0.0.0/8 -j IPVS_PREROUTING',
    );
    expect(inEffect(save)).to.equal(false);
  });
});
