// The Kubernetes API stand-in of the react and probe-cost benchmarks in a process of its own, as
// a real API server is: dist/testbed/api-server-main.js, speaking TLS with the kubeconfig it
// writes. The benchmark is one more client of it: it creates the Services through the API and
// moves a Service's ingress address with a PATCH of its status, as a load-balancer controller
// does, timing the write's answer (the watch event is out by then: the stand-in sends it before
// it answers).

import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { readFileSync } from 'node:fs';
import https from 'node:https';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createInterface } from 'node:readline';
import YAML from 'yaml';

interface Kubeconfig {
  clusters: Array<{ cluster: { server: string; 'certificate-authority-data': string } }>;
  users: Array<{ user: { token: string } }>;
}

export interface Answer {
  status: number;
  body: string;
  /** process.hrtime.bigint() when the whole answer was read. */
  answeredNs: bigint;
}

export class StandInProcess {
  private readonly agent: https.Agent;
  private readonly url: URL;
  private readonly token: string;
  private exited = false;

  private constructor(
    private readonly child: ChildProcess,
    /** The kubeconfig the stand-in wrote: the controller's. */
    readonly kubeconfig: string,
  ) {
    child.on('exit', () => {
      this.exited = true;
    });
    const config = YAML.parse(readFileSync(kubeconfig, 'utf8')) as Kubeconfig;
    const cluster = config.clusters[0]!.cluster;
    this.url = new URL(cluster.server);
    this.token = config.users[0]!.user.token;
    this.agent = new https.Agent({
      keepAlive: true,
      maxSockets: 16,
      ca: Buffer.from(cluster['certificate-authority-data'], 'base64').toString(),
    });
  }

  /** Starts this tree's dist/testbed/api-server-main.js on an ephemeral port of 127.0.0.1 and waits until it listens. */
  static async start(dir: string, name: string): Promise<StandInProcess> {
    const kubeconfig = join(dir, `${name}.kubeconfig`);
    const main = fileURLToPath(new URL('../testbed/api-server-main.js', import.meta.url));
    const child = spawn(process.execPath, [main, '--port', '0', '--kubeconfig-out', kubeconfig], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const lines = createInterface({ input: child.stdout! });
    const listening = new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`the API stand-in ${name} did not start in 30 s`)), 30_000);
      lines.on('line', (line) => {
        if (line.includes('listening on')) {
          clearTimeout(timer);
          resolve();
        }
      });
      child.once('exit', (code) => {
        clearTimeout(timer);
        reject(new Error(`the API stand-in ${name} exited (${code}) before it listened`));
      });
    });
    try {
      await listening;
    } catch (err) {
      child.kill('SIGKILL');
      throw err;
    }
    return new StandInProcess(child, kubeconfig);
  }

  request(method: string, path: string, body?: unknown, contentType = 'application/json'): Promise<Answer> {
    const payload = body === undefined ? undefined : JSON.stringify(body);
    return new Promise<Answer>((resolve, reject) => {
      const { hostname: host, port } = this.url;
      const sized =
        payload === undefined ? {} : { 'content-type': contentType, 'content-length': Buffer.byteLength(payload) };
      const headers = { authorization: `Bearer ${this.token}`, accept: 'application/json', ...sized };
      const req = https.request({ host, port, method, path, agent: this.agent, headers }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({
            status: res.statusCode ?? 0,
            body: Buffer.concat(chunks).toString(),
            answeredNs: process.hrtime.bigint(),
          }),
        );
        res.on('error', reject);
      });
      req.on('error', reject);
      req.end(payload);
    });
  }

  /** Creates the objects through the API, `concurrency` requests at a time. */
  async create(objects: Array<Record<string, unknown>>, concurrency = 8): Promise<void> {
    let next = 0;
    const worker = async () => {
      while (next < objects.length) {
        const object = objects[next++]!;
        const meta = object.metadata as { namespace?: string };
        const path =
          object.kind === 'Node' ? '/api/v1/nodes' : `/api/v1/namespaces/${meta.namespace ?? 'default'}/services`;
        const answer = await this.request('POST', path, object);
        if (answer.status !== 201) throw new Error(`POST ${path}: ${answer.status} ${answer.body.slice(0, 200)}`);
      }
    };
    await Promise.all(Array.from({ length: concurrency }, worker));
  }

  /** Lists every Service once: the stand-in's list path is compiled before the first measure. */
  async warmUp(): Promise<void> {
    for (const path of ['/api/v1/services', '/api/v1/services?limit=500']) {
      const answer = await this.request('GET', path);
      if (answer.status !== 200) throw new Error(`GET ${path}: ${answer.status}`);
    }
  }

  /** Moves the Service's ingress to `ip` (a merge patch of its status); resolves at the answer. */
  async moveIngress(namespace: string, name: string, ip: string): Promise<bigint> {
    const path = `/api/v1/namespaces/${namespace}/services/${name}/status`;
    const patch = { status: { loadBalancer: { ingress: [{ ip, ipMode: 'VIP' }] } } };
    const answer = await this.request('PATCH', path, patch, 'application/merge-patch+json');
    if (answer.status !== 200) throw new Error(`PATCH ${path}: ${answer.status} ${answer.body.slice(0, 200)}`);
    return answer.answeredNs;
  }

  async stop(): Promise<void> {
    this.agent.destroy();
    if (this.exited) return;
    const exit = once(this.child, 'exit');
    this.child.kill('SIGTERM');
    const timer = setTimeout(() => this.child.kill('SIGKILL'), 5_000);
    await exit;
    clearTimeout(timer);
  }
}
