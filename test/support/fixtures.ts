// Fixtures shared by the tests: the model configuration of a default kube-proxy node, and a
// seeded random generator.

import type { ModelConfig } from '../../src/model/types.js';

/** kube-proxy's defaults: local pods by the node's podCIDRs, masquerade bit 14, every Service. */
export const CONFIG: Readonly<ModelConfig> = Object.freeze({
  detectLocalMode: 'NodeCIDR',
  clusterCidrs: [],
  masqueradeBit: 14,
  localTrafficPolicyOnly: false,
});

/**
 * A seeded generator of numbers in [0, 1), so that a failure can be replayed with its seed. A
 * linear congruential generator: the randomised tests were tuned to its sequences.
 */
export function seededRandom(seed: number): () => number {
  let state = seed;
  return () => {
    state = (state * 1103515245 + 12345) % 2147483648;
    return state / 2147483648;
  };
}
