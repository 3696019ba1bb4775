// A real Prometheus server (Debian's prometheus) for the tests of what it makes of the
// controller's metrics, alerts and dashboard: started on a free port of 127.0.0.1 with a
// configuration and rules of the test's, asked through its HTTP API.

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { writeFile } from 'node:fs/promises';
import { createServer, type AddressInfo } from 'node:net';
import { join } from 'node:path';
import YAML from 'yaml';
import { eventually } from './eventually.js';

type Json = Record<string, any>;

async function freePort(): Promise<number> {
  const s = createServer();
  s.listen(0, '127.0.0.1');
  await once(s, 'listening');
  const { port } = s.address() as AddressInfo;
  s.close();
  await once(s, 'close');
  return port;
}

export class PrometheusServer {
  private child?: ChildProcess;
  url = '';

  /**
   * Writes `config` (scrape_configs and the like; evaluation and scrape every second) and
   * `rules` under `dir`, starts the server and waits until it is ready.
   */
  async start(dir: string, config: Json, rules?: Json): Promise<void> {
    if (rules) await writeFile(join(dir, 'rules.yaml'), YAML.stringify(rules));
    await writeFile(
      join(dir, 'prometheus.yml'),
      YAML.stringify({
        global: { scrape_interval: '1s', evaluation_interval: '1s' },
        ...(rules ? { rule_files: [join(dir, 'rules.yaml')] } : {}),
        ...config,
      }),
    );
    const port = await freePort();
    this.url = `http://127.0.0.1:${port}`;
    const log: string[] = [];
    this.child = spawn(
      'prometheus',
      [
        `--config.file=${join(dir, 'prometheus.yml')}`,
        `--storage.tsdb.path=${join(dir, 'tsdb')}`,
        `--web.listen-address=127.0.0.1:${port}`,
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    this.child.stderr!.on('data', (b: Buffer) => log.push(b.toString()));
    await eventually(
      'Prometheus ready',
      async () => {
        if (this.child!.exitCode !== null) throw new Error(`prometheus exited: ${log.join('').slice(-2000)}`);
        return (await fetch(`${this.url}/-/ready`)).ok;
      },
      60_000,
      250,
    );
  }

  /** An instant query. */
  async query(q: string): Promise<Array<{ metric: Json; value: [number, string] }>> {
    const r = (await (await fetch(`${this.url}/api/v1/query?query=${encodeURIComponent(q)}`)).json()) as Json;
    if (r.status !== 'success') throw new Error(`${q}: ${JSON.stringify(r)}`);
    return r.data.result;
  }

  async alerts(): Promise<Array<{ labels: Json; annotations: Json; state: string }>> {
    return ((await (await fetch(`${this.url}/api/v1/alerts`)).json()) as Json).data.alerts;
  }

  async rules(): Promise<Json[]> {
    return ((await (await fetch(`${this.url}/api/v1/rules`)).json()) as Json).data.groups;
  }

  async stop(): Promise<void> {
    if (this.child && this.child.exitCode === null) {
      this.child.kill('SIGTERM');
      await once(this.child, 'exit');
    }
  }
}
