// `ipvs-node-controller check [--service NS/NAME] [--output json]`: the report on stdout, and the
// exit code scripts read: 0 every checked path works, 1 something is broken, 2 a usage error, 3 the
// check could not be made (no privileges, no API server, nothing to try).

import { CommanderError } from 'commander';
import { readFileSync } from 'node:fs';
import { PROGRAM, writeStderr } from '../../log.js';
import { UsageError } from '../../config/options.js';
import { parseCheckArgs } from './check-options.js';
import { CannotCheck, runChecks } from './check.js';
import { renderText } from './report.js';

/** CAP_NET_ADMIN, which reading the nat table, nft tables and conntrack entries needs. */
const CAP_NET_ADMIN = 12n;

function hasNetAdmin(): boolean {
  try {
    const line = readFileSync('/proc/self/status', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('CapEff:'));
    return line !== undefined && ((BigInt(`0x${line.slice(7).trim()}`) >> CAP_NET_ADMIN) & 1n) === 1n;
  } catch {
    return process.getuid?.() === 0;
  }
}

export async function checkCommand(argv: string[]): Promise<number> {
  let parsed;
  try {
    parsed = parseCheckArgs(argv);
  } catch (err) {
    if (err instanceof CommanderError) return 0; // --help was shown
    if (err instanceof UsageError) {
      writeStderr(`${PROGRAM} check: ${err.message}\nRun '${PROGRAM} check --help' for the flags.\n`);
      return 2;
    }
    throw err;
  }
  const { config, check } = parsed;
  try {
    if (!hasNetAdmin()) {
      throw new CannotCheck(
        'needs CAP_NET_ADMIN to read the kernel (nft, iptables, conntrack): run it as root, or in the ' +
          "controller's container (kubectl exec -n kube-system ds/ipvs-node-controller -- ipvs-node-controller check)",
      );
    }
    const { loadKubeConfig } = await import('../../kube/cluster.js');
    let kc;
    try {
      kc = loadKubeConfig(config.kubeconfig);
    } catch (err) {
      throw new CannotCheck(`no way to reach the API server: ${(err as Error).message}`);
    }
    const report = await runChecks(config, check, kc);
    const text = check.output === 'json' ? JSON.stringify(report, null, 2) + '\n' : renderText(report);
    await new Promise<void>((resolve, reject) => process.stdout.write(text, (err) => (err ? reject(err) : resolve())));
    return report.ok ? 0 : 1;
  } catch (err) {
    if (err instanceof CannotCheck) {
      writeStderr(`${PROGRAM} check: cannot check: ${err.message}\n`);
      if (check.output === 'json') process.stdout.write(JSON.stringify({ ok: false, cannotCheck: err.message }) + '\n');
      return 3;
    }
    throw err;
  }
}
