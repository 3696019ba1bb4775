// Fixtures shared by the tests: the model configuration of a default kube-proxy node, and a
// seeded random generator.

import { writeFileSync } from 'node:fs';
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

/** The nine watch lines that are valid JSON but no watch event (each once ended the process). */
export const MALFORMED_WATCH_LINES: readonly string[] = [
  '42',
  '"a string"',
  '[1, 2]',
  'true',
  '{}',
  '{"type": 42}',
  '{"type":"BOOKMARK","object":null}',
  '{"type":"ERROR","object":null}',
  '{"type":"ERROR"}',
];

/** A kubeconfig whose API server refuses every connection at once (nothing listens on port 1). */
export function writeUnreachableKubeconfig(path: string): void {
  writeFileSync(
    path,
    [
      'apiVersion: v1',
      'kind: Config',
      'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]',
      'users: [{name: u, user: {token: t}}]',
      'contexts: [{name: x, context: {cluster: c, user: u}}]',
      'current-context: x',
    ].join('\n'),
  );
}
