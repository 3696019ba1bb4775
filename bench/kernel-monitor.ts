// Watches the kernel, not the controller: `nft -j monitor new elements` prints every map element
// the kernel commits, and each line is timestamped when the benchmark reads it.

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { createInterface } from 'node:readline';

export class ElementMonitor {
  private readonly waiters = new Map<string, (at: number) => void>();
  private exited = false;

  private constructor(private readonly child: ChildProcess) {
    createInterface({ input: child.stdout! }).on('line', (line) => {
      const at = performance.now();
      if (this.waiters.size === 0) return;
      for (const [needle, resolve] of this.waiters) {
        if (line.includes(needle)) {
          this.waiters.delete(needle);
          resolve(at);
        }
      }
    });
    child.on('exit', () => {
      this.exited = true;
    });
  }

  /** Starts the monitor and waits until it listens (it prints nothing until an event comes). */
  static async start(): Promise<ElementMonitor> {
    const child = spawn('nft', ['-j', 'monitor', 'new', 'elements'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const monitor = new ElementMonitor(child);
    // nft reads the ruleset into its cache before it subscribes; give it that time.
    await new Promise((resolve) => setTimeout(resolve, 500));
    if (monitor.exited) throw new Error('`nft monitor` exited at once');
    return monitor;
  }

  /**
   * performance.now() at which an added element mentioning `address` (as a JSON string) was
   * seen. Register before causing the change.
   */
  elementAdded(address: string, timeoutMs: number): Promise<number> {
    const needle = `"${address}"`;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiters.delete(needle);
        reject(new Error(`no map element with ${address} reached the kernel within ${timeoutMs} ms`));
      }, timeoutMs);
      this.waiters.set(needle, (at) => {
        clearTimeout(timer);
        resolve(at);
      });
    });
  }

  async stop(): Promise<void> {
    if (this.exited) return;
    const exit = once(this.child, 'exit');
    this.child.kill('SIGTERM');
    await exit;
  }
}
