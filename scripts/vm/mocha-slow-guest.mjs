// Loaded by test/run.mjs into mocha (--require) when IPVS_NODE_CONTROLLER_TEST_TIMEOUT_FACTOR is
// set, as the VM layer sets it: in a QEMU guest without hardware virtualisation a process costs
// seconds, so every mocha timeout (a generous wait, never a measure) is multiplied by the factor.
// Only the value a test or hook is checked against changes; what suites set and pass down does not.

import Mocha from 'mocha';

const factor = Number(process.env.IPVS_NODE_CONTROLLER_TEST_TIMEOUT_FACTOR ?? '1');
if (!Number.isFinite(factor) || factor < 1) {
  throw new Error(
    `IPVS_NODE_CONTROLLER_TEST_TIMEOUT_FACTOR=${process.env.IPVS_NODE_CONTROLLER_TEST_TIMEOUT_FACTOR}: expected a number >= 1`,
  );
}
const setOrGet = Mocha.Runnable.prototype.timeout;
Mocha.Runnable.prototype.timeout = function timeout(...args) {
  if (args.length > 0) return setOrGet.apply(this, args);
  const ms = setOrGet.call(this);
  return ms === 0 ? 0 : Math.min(ms * factor, 2 ** 31 - 1);
};
