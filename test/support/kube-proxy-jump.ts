// What a restarting kube-proxy does to our iptables jumps: its IPVS-mode chain, which ACCEPTs the
// LoadBalancer IP (so our DNAT behind it never runs), jumped to from rule 1 of nat PREROUTING and
// OUTPUT, in front of ours. For the kernel tests of the iptables backend's jump guard.

import type { IptablesVariant } from '../../src/backends/iptables/executor.js';
import { sh } from '../../testbed/node-network.js';

/** kube-proxy's chain. */
export const WRITER_CHAIN = 'KUBE-SERVICES';

export function natSave(variant: IptablesVariant, counters = false): string {
  return sh(`iptables-${variant}-save`, ['-t', 'nat', ...(counters ? ['-c'] : [])]);
}

export function natRestore(variant: IptablesVariant, input: string): void {
  sh(`iptables-${variant}-restore`, ['--noflush', '-w'], input);
}

/** kube-proxy's shape: a chain that ACCEPTs `lb`, and (masquerade) its masquerade rule; not jumped to yet. */
export function installWriterChain(variant: IptablesVariant, lb: string, masquerade = true): void {
  natRestore(
    variant,
    [
      '*nat',
      `:${WRITER_CHAIN} - [0:0]`,
      `-A ${WRITER_CHAIN} -d ${lb}/32 -j ACCEPT`,
      ...(masquerade ? ['-A POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE'] : []),
      'COMMIT',
      '',
    ].join('\n'),
  );
}

/** What a restarting kube-proxy does: its jump goes to rule 1 of both hooks. */
export function prependWriterJumps(variant: IptablesVariant): void {
  natRestore(
    variant,
    ['*nat', `-I PREROUTING 1 -j ${WRITER_CHAIN}`, `-I OUTPUT 1 -j ${WRITER_CHAIN}`, 'COMMIT', ''].join('\n'),
  );
}

/** Removes the writer's jumps, masquerade rule and chain, whichever of them are there. */
export function removeWriterObjects(variant: IptablesVariant): void {
  const save = natSave(variant);
  const lines = ['*nat'];
  for (const line of save.split('\n')) {
    if (/^-A (PREROUTING|OUTPUT) .*-j KUBE-SERVICES/.test(line) || /^-A POSTROUTING .*MASQUERADE/.test(line)) {
      lines.push(line.replace(/^-A /, '-D '));
    }
  }
  if (save.includes(`:${WRITER_CHAIN} `)) lines.push(`:${WRITER_CHAIN} - [0:0]`, `-X ${WRITER_CHAIN}`);
  if (lines.length > 1) natRestore(variant, `${lines.join('\n')}\nCOMMIT\n`);
}
