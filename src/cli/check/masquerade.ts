// Whether kube-proxy masquerades what our node rules mark: in IPVS mode it does so in nat
// KUBE-POSTROUTING, jumped to from POSTROUTING (kube-proxy v1.33 pkg/proxy/ipvs/proxier.go,
// writeIptablesRules):
//
//   -A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
//   -A KUBE-POSTROUTING -j MARK --xor-mark 0x4000
//   -A KUBE-POSTROUTING -m comment --comment "..." -j MASQUERADE --random-fully
//
// and, in releases before 1.20, with one rule `-m mark --mark 0x4000/0x4000 -j MASQUERADE`. A
// node's translated connection carries the mark; without the masquerade its source stays the
// LoadBalancer IP, and the endpoint's reply is lost on the endpoint's node.

/** What a packet carrying `mark` meets walking the chain: masqueraded, returned, or the end. */
export function walkMarked(rules: readonly string[], mark: number): 'masquerade' | 'return' | 'end' {
  for (const rule of rules) {
    const spec = withoutComments(rule);
    const target = /(?:^|\s)-j\s+(\S+)/.exec(spec)?.[1];
    const conditions = spec.replace(/(?:^|\s)-j\s+.*$/, '').trim();
    const matches = matchesMarked(conditions, mark);
    if (matches !== true) continue;
    if (target === 'MASQUERADE') return 'masquerade';
    if (target === 'RETURN' || target === 'ACCEPT') return 'return';
    if (target === 'MARK' && /--xor-mark\s/.test(spec)) continue;
  }
  return 'end';
}

function withoutComments(spec: string): string {
  return spec.replace(/-m comment --comment ("(?:[^"\\]|\\.)*"|\S+)/g, '').trim();
}

/**
 * Whether a rule's conditions certainly hold for a marked packet: none, or `-m mark [!] --mark
 * V/M` alone; anything else (sets, addresses) is not known to hold ('unknown').
 */
function matchesMarked(conditions: string, mark: number): boolean | 'unknown' {
  if (conditions === '') return true;
  const m = /^-m mark (!\s+)?--mark (0x[0-9a-fA-F]+|\d+)(?:\/(0x[0-9a-fA-F]+|\d+))?$/.exec(conditions);
  if (!m) return 'unknown';
  const value = Number(m[2]);
  const mask = m[3] === undefined ? 0xffffffff : Number(m[3]);
  const holds = (mark & mask) >>> 0 === (value & mask) >>> 0;
  return m[1] ? !holds : holds;
}

/** Whether POSTROUTING jumps to KUBE-POSTROUTING unconditionally (comments aside). */
export function jumpsToKubePostrouting(postrouting: readonly string[]): boolean {
  return postrouting.some((rule) => withoutComments(rule) === '-j KUBE-POSTROUTING');
}
