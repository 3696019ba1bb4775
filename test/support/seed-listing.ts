// The original controller's README listing (test/golden/iptables-seed-listing.json) and the
// Services behind it, for the iptables renderer and kernel tests.

import { readFileSync } from 'node:fs';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { DesiredState, ModelConfig, ServiceInfo } from '../../src/model/types.js';
import { CONFIG as SEED_CONFIG } from './fixtures.js';

export type ListingRow = [target: string, source: string, destination: string, extras: string];

export interface SeedListing {
  podCidr: string;
  services: Array<{ name: string; clusterIP: string; externalIP: string; ports: number[] }>;
  IPVS_OUTPUT: ListingRow[];
  IPVS_PREROUTING: ListingRow[];
}

export const SEED = JSON.parse(
  readFileSync(new URL('../../../test/golden/iptables-seed-listing.json', import.meta.url), 'utf8'),
) as SeedListing;

/** The shared CONFIG (fixtures.ts), under the name the listing's tests know it by. */
export { SEED_CONFIG };

export function seedServices(): ServiceInfo[] {
  return SEED.services.map((s) => ({
    namespace: 'default',
    name: s.name,
    type: 'LoadBalancer',
    clusterIP: s.clusterIP,
    ports: s.ports.map((port) => ({ port, protocol: 'TCP' })),
    ingress: [{ ip: s.externalIP }],
  }));
}

/** The desired state of the seed's Services on a node with the seed's pod CIDR. */
export function seedDesired(config: ModelConfig = SEED_CONFIG): DesiredState {
  return buildDesiredState(seedServices(), { name: 'node-1', podCIDRs: [SEED.podCidr] }, config);
}

/**
 * The original's listing with the two differences the contract makes: pod traffic is not marked
 * (no KUBE-MARK-MASQ row in IPVS_PREROUTING), and only a destination local to the node is
 * translated (ADDRTYPE dst-type LOCAL on every rule).
 */
export function contractedSeedRows(chain: 'IPVS_OUTPUT' | 'IPVS_PREROUTING'): ListingRow[] {
  if (chain === 'IPVS_OUTPUT') {
    return SEED.IPVS_OUTPUT.map(([target, source, destination, extras]) => [
      target,
      source,
      destination,
      extras.replace('src-type LOCAL', 'src-type LOCAL dst-type LOCAL'),
    ]);
  }
  return SEED.IPVS_PREROUTING.filter(([target]) => target !== 'KUBE-MARK-MASQ').map(
    ([target, source, destination, extras]) => [
      target,
      source,
      destination,
      extras.replace(' to:', ' ADDRTYPE match dst-type LOCAL to:'),
    ],
  );
}
