// A Node.js process of a test's (the shipped controller, a helper program): stdin closed, what
// it prints on stdout and stderr handed over as it comes.

import { spawn, type ChildProcess } from 'node:child_process';

/** Runs `process.execPath` with `argv`; `onOutput` gets each chunk of its stdout and stderr. */
export function spawnNodeProcess(argv: readonly string[], onOutput: (text: string) => void): ChildProcess {
  const child = spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  child.stdout!.on('data', (d: Buffer) => onOutput(d.toString()));
  child.stderr!.on('data', (d: Buffer) => onOutput(d.toString()));
  return child;
}

/**
 * The controller's flags against the API stand-in: its kubeconfig, the node's name (node-1
 * unless given), and a sync every `syncPeriod`, none held back (--min-sync-period 0).
 */
export function standInFlags(kubeconfig: string, syncPeriod: string, nodeName = 'node-1'): string[] {
  return ['--kubeconfig', kubeconfig, '--node-name', nodeName, '--min-sync-period', '0', '--sync-period', syncPeriod];
}
