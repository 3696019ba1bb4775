// The controller as the image and package.json's bin run it (bin/ipvs-node-controller.mjs, the
// Dockerfile's ENTRYPOINT): Node with the flags of package.json's `ipvsNodeController.nodeFlags`,
// on the bundle (dist/bundle, made by `npm run build`). The kernel tests, the demo and the
// benchmark start that command line directly (the launcher's own process aside, it is the same
// process), so what they show is what ships; test/build/bundle-launcher.test.ts checks that the
// launcher runs exactly it, and test/build/deploy-image.test.ts that the image starts the launcher.

import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const packageJson = fileURLToPath(new URL('../../package.json', import.meta.url));

/**
 * dist/bundle/ipvs-node-controller.mjs; the benchmark may be pointed at another build's bundle
 * with IPVS_NODE_CONTROLLER_BUNDLE, to compare before and after.
 */
export const BUNDLE =
  process.env.IPVS_NODE_CONTROLLER_BUNDLE ??
  fileURLToPath(new URL('../bundle/ipvs-node-controller.mjs', import.meta.url));

/**
 * bin/ipvs-node-controller.mjs, package.json's bin and the image's ENTRYPOINT: it runs
 * `process.execPath` with NODE_FLAGS on BUNDLE (test/build/bundle-launcher.test.ts).
 */
export const LAUNCHER = fileURLToPath(new URL('../../bin/ipvs-node-controller.mjs', import.meta.url));

/** The Node flags the image runs the controller with. */
export const NODE_FLAGS: readonly string[] = (
  JSON.parse(readFileSync(packageJson, 'utf8')) as { ipvsNodeController: { nodeFlags: string[] } }
).ipvsNodeController.nodeFlags;

/** `process.execPath` arguments that run the shipped controller with `args`. */
export function shippedArgs(args: readonly string[], extraNodeFlags: readonly string[] = []): string[] {
  return [...NODE_FLAGS, ...extraNodeFlags, BUNDLE, ...args];
}
