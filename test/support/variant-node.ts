// The backends a kernel test of the shipped controller runs on, iptables in both variants, and
// the hooks each describe() of such a test has around its node (test/kernel/tenant-node.ts).

import { expect } from 'chai';
import { sh } from '../../testbed/node-network.js';

export interface BackendVariant {
  name: string;
  backend: 'nft' | 'iptables' | 'ebpf';
  /** iptables-legacy: the kubelet's hint chain in mangle makes the controller take it. */
  legacy?: boolean;
}

/** Every backend, iptables in both variants. */
export const BACKEND_VARIANTS: readonly BackendVariant[] = [
  { name: 'nft', backend: 'nft' },
  { name: 'iptables (nft)', backend: 'iptables' },
  { name: 'iptables (legacy)', backend: 'iptables', legacy: true },
  { name: 'ebpf', backend: 'ebpf' },
];

/** What of a node the hooks use. */
interface VariantNode {
  setUp(): Promise<void>;
  tearDown(): Promise<void>;
  /** The end of the controller's output. */
  tail(): string;
  /** The controller's output so far. */
  readonly output: string;
}

const HINT = ['-w', '-t', 'mangle'];
const HINT_CHAIN = 'KUBE-IPTABLES-HINT';

/**
 * Registers, in the calling describe(): the node set up before its other hooks (with the
 * kubelet's hint chain for iptables-legacy) and torn down after them, the tail of the
 * controller's output printed for a failed test, and, on iptables, a test that the controller
 * took the variant.
 */
export function variantNodeHooks(variant: BackendVariant, node: VariantNode): void {
  before(async () => {
    await node.setUp();
    if (variant.legacy) sh('iptables-legacy', [...HINT, '-N', HINT_CHAIN]);
  });

  after(async () => {
    if (variant.legacy) {
      try {
        sh('iptables-legacy', [...HINT, '-X', HINT_CHAIN]);
      } catch {
        // already gone
      }
    }
    await node.tearDown();
  });

  afterEach(function () {
    if (this.currentTest?.state === 'failed') console.log(node.tail());
  });

  if (variant.backend === 'iptables') {
    const taken = `iptables-${variant.legacy ? 'legacy' : 'nft'}`;
    it(`runs on ${taken}`, () => {
      expect(node.output).to.include(taken);
    });
  }
}
