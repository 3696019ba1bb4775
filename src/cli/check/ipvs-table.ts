// IPVS's virtual services as this node's kernel holds them (/proc/net/ip_vs): for each address,
// protocol and port, how many real servers it forwards to. kube-proxy makes one virtual service per
// ClusterIP and port with the Service's endpoints as real servers, so a ClusterIP's service with
// none is a Service without endpoints, as this node's kube-proxy sees it.

import { readFile } from 'node:fs/promises';
import { canonicalAddress } from '../../model/ip.js';

export const IPVS_TABLE = '/proc/net/ip_vs';

/** Real servers with a weight above 0, by `PROTO address port`. */
export type IpvsServices = Map<string, number>;

export function ipvsKey(protocol: string, address: string, port: number): string {
  return `${protocol.toUpperCase()} ${address} ${port}`;
}

/** The table read, or why not (no IPVS on this node: the module is not loaded). */
export async function readIpvsServices(path = IPVS_TABLE): Promise<IpvsServices | { problem: string }> {
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    return { problem: code === 'ENOENT' ? `${path} does not exist: IPVS is not loaded` : (err as Error).message };
  }
  return parseIpvsTable(text);
}

/**
 * The text of /proc/net/ip_vs: a virtual service line `TCP  0A60000A:0050 rr` (IPv6:
 * `TCP  [2001:0db8:...:0010]:0050 rr`), then its real servers `  -> 0AF40203:1F90 Masq 1 0 0`.
 * Firewall-mark services (`FWM`) are left out; a line that is neither is ignored.
 */
export function parseIpvsTable(text: string): IpvsServices {
  const services: IpvsServices = new Map();
  let current: string | undefined;
  for (const line of text.split('\n')) {
    const service = /^(TCP|UDP|SCTP)\s+(\S+)\s/.exec(line);
    if (service) {
      const at = hexAddressPort(service[2]!);
      current = at ? ipvsKey(service[1]!, at.address, at.port) : undefined;
      if (current) services.set(current, 0);
      continue;
    }
    const server = /^\s+->\s+(\S+)\s+\S+\s+(\d+)/.exec(line);
    if (server && current && hexAddressPort(server[1]!) && Number(server[2]) > 0) {
      services.set(current, services.get(current)! + 1);
      continue;
    }
    if (!server) current = undefined;
  }
  return services;
}

function hexAddressPort(text: string): { address: string; port: number } | undefined {
  const v6 = /^\[([0-9a-fA-F:]+)\]:([0-9A-Fa-f]{4})$/.exec(text);
  if (v6) {
    try {
      return { address: canonicalAddress(v6[1]!), port: parseInt(v6[2]!, 16) };
    } catch {
      return undefined;
    }
  }
  const v4 = /^([0-9A-Fa-f]{8}):([0-9A-Fa-f]{4})$/.exec(text);
  if (!v4) return undefined;
  const n = parseInt(v4[1]!, 16);
  const address = [n >>> 24, (n >>> 16) & 0xff, (n >>> 8) & 0xff, n & 0xff].join('.');
  return { address, port: parseInt(v4[2]!, 16) };
}
