// Whether a variant can hold our rules: a test restore (parsed and built, not committed) of rules
// of our shape, for each family.

import type { ProbeResult } from '../../driver/driver.js';
import { FAMILIES, type Family, type FamilyState } from '../../model/types.js';
import type { IptablesCommands, IptablesVariant } from './executor.js';
import { emptyNatTable } from './parse.js';
import { renderFamilyRestore } from './render.js';

/**
 * A test restore of rules of our shape proves the tools, the nat table and the extensions used
 * (comment, addrtype, tcp, MARK, DNAT, goto, masks), a Service's source-range chains included
 * (RETURN, DNAT without a protocol).
 */
export async function probeVariant(
  variant: IptablesVariant,
  commands: (family: Family) => IptablesCommands,
): Promise<ProbeResult> {
  const sample: FamilyState = {
    entries: [],
    localPodMatch: { kind: 'interfacePrefix', prefix: 'veth' },
  };
  try {
    for (const family of FAMILIES) {
      const entry = {
        family,
        externalIp: family === 'ipv4' ? '192.0.2.1' : '2001:db8::1',
        protocol: 'TCP' as const,
        port: 80,
        clusterIp: family === 'ipv4' ? '192.0.2.2' : '2001:db8::2',
        service: 'probe/probe',
      };
      const ranged = {
        ...entry,
        port: 443,
        service: 'probe/ranged',
        sourceRanges: [family === 'ipv4' ? '192.0.2.0/24' : '2001:db8::/64'],
      };
      const rendered = renderFamilyRestore(family, { ...sample, entries: [entry, ranged] }, 0x4000, emptyNatTable());
      await commands(family).restore(rendered.text, { test: true });
    }
    return { ok: true, detail: `iptables via iptables-${variant}` };
  } catch (err) {
    return { ok: false, detail: `iptables-${variant} cannot be programmed: ${(err as Error).message}` };
  }
}
