// The controller's own requests to the API server (list pages for --dry-run, Events) go through
// one narrow HTTPS request built from the kubeconfig, not client-node's generated API: checked
// against the API stand-in, and in the sources and the bundle (only KubeConfig is used at
// runtime; watches stream through src/kube/watch.ts).

import { execFile } from 'node:child_process';
import { mkdtemp, readdir, readFile, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { KubeConfig } from '@kubernetes/client-node';
import { expect } from 'chai';
import { listAllJson } from '../../src/kube/cluster.js';
import { toServiceInfo } from '../../src/kube/objects.js';
import { apiRequest } from '../../src/kube/request.js';
import { ApiStandIn } from '../../testbed/api-server.js';

const run = promisify(execFile);
const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));
const SRC = fileURLToPath(new URL('../../../src/', import.meta.url));
const BUNDLE_META = fileURLToPath(new URL('../../bundle-meta.json', import.meta.url));

function service(i: number) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: `ns-${i % 7}`, name: `svc-${i}` },
    spec: { type: 'LoadBalancer', clusterIP: `10.96.${i >> 8}.${i & 255}`, ports: [{ protocol: 'TCP', port: 80 }] },
    status: { loadBalancer: { ingress: [{ ip: `198.18.${i >> 8}.${i & 255}` }] } },
  };
}

describe('narrow requests to the API server', function () {
  this.timeout(60_000);
  let server: ApiStandIn;
  let dir: string;

  before(async () => {
    server = await ApiStandIn.start();
    dir = await mkdtemp(join(tmpdir(), 'kube-requests-'));
    for (let i = 0; i < 1203; i++) server.apply(service(i));
    for (const name of ['node-a', 'node-b']) {
      server.apply({
        apiVersion: 'v1',
        kind: 'Node',
        metadata: { name },
        spec: { podCIDR: name === 'node-a' ? '10.244.1.0/24' : '10.244.2.0/24' },
      });
    }
  });
  after(async () => {
    await server.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it('lists every page (limit/continue) and strips each item', async () => {
    const kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
    const lists = server.stats.lists.services ?? 0;
    const services = await listAllJson(kc, '/api/v1/services', {}, toServiceInfo);
    expect(services).to.have.length(1203);
    expect(new Set(services.map((s) => `${s.namespace}/${s.name}`)).size).to.equal(1203);
    expect((server.stats.lists.services ?? 0) - lists, 'pages of 500').to.equal(3);
  });

  it('keeps one connection for the pages of a list and the requests after it', async () => {
    // A server of its own: no connection to it is kept from an earlier test.
    const own = await ApiStandIn.start();
    try {
      for (let i = 0; i < 1203; i++) own.apply(service(i));
      const kc = new KubeConfig();
      kc.loadFromString(own.kubeconfig());
      await listAllJson(kc, '/api/v1/services', {}, toServiceInfo);
      expect((await apiRequest(kc, '/api/v1/namespaces/default')).status).to.equal(200);
      expect(own.stats.requests, 'three pages and a GET').to.equal(4);
      expect(own.stats.connections, 'TLS connections opened').to.equal(1);
    } finally {
      await own.stop();
    }
  });

  it('never lets a kept connection stand in for TLS settings it was not verified with', async () => {
    const other = await ApiStandIn.start();
    try {
      const trusted = new KubeConfig();
      trusted.loadFromString(server.kubeconfig());
      expect((await apiRequest(trusted, '/api/v1/nodes/node-a')).status).to.equal(200);
      // The same server, with the CA of another one: the kept connection must not serve it.
      const wrongCa = new KubeConfig();
      wrongCa.loadFromString(
        server
          .kubeconfig()
          .replace(Buffer.from(server.caPem).toString('base64'), Buffer.from(other.caPem).toString('base64')),
      );
      let error: Error | undefined;
      await apiRequest(wrongCa, '/api/v1/nodes/node-a').catch((err: Error) => (error = err));
      expect(error?.message).to.match(/self[- ]signed|unable to verify|certificate/i);
    } finally {
      await other.stop();
    }
  });

  it('reports an API error as its status and message', async () => {
    const kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
    const response = await apiRequest(kc, '/api/v1/namespaces/nope/services/missing');
    expect(response.status).to.equal(404);
    expect((response.json as { reason?: string }).reason).to.equal('NotFound');
  });

  it('--dry-run --kubeconfig reads every Service and this node from the API server', async () => {
    const kubeconfig = join(dir, 'kubeconfig');
    await server.writeKubeconfig(kubeconfig);
    const { stdout } = await run(
      process.execPath,
      [CLI, '--dry-run', '--kubeconfig', kubeconfig, '--node-name', 'node-b'],
      {
        maxBuffer: 64 << 20,
      },
    );
    expect(stdout).to.match(/^# 1203 Services read; 1203 IPv4 and 0 IPv6 entries/);
    expect(stdout).to.include('10.244.2.0/24');
    expect(stdout).not.to.include('10.244.1.0/24');
  });

  it('nothing at runtime uses client-node beyond KubeConfig, imported from its own module', async () => {
    const files = (await readdir(SRC, { recursive: true })).filter((f) => f.endsWith('.ts'));
    const used = new Set<string>();
    for (const file of files) {
      const text = await readFile(join(SRC, file), 'utf8');
      expect(text, file).not.to.match(/makeApiClient|CoreV1Api|ListWatch|makeInformer|new Watch\b/);
      const imports = text.matchAll(/import\s+(type\s+)?\{([^}]*)\}\s+from\s+'(@kubernetes\/client-node[^']*)'/g);
      for (const [, typeOnly, names, from] of imports) {
        for (const raw of names!.split(',')) {
          const name = raw.trim();
          if (name === '' || typeOnly || name.startsWith('type ')) continue;
          used.add(`${name} from ${from}`);
        }
      }
      expect(text, file).not.to.match(/import\(\s*'@kubernetes\/client-node/);
    }
    expect([...used].sort()).to.deep.equal(['KubeConfig from @kubernetes/client-node/dist/config.js']);
  });

  it("the bundle holds neither client-node's index, Watch nor generated API, nor what only they load", async () => {
    // Written by scripts/bundle.mjs (npm run build) beside dist/bundle.
    const meta = JSON.parse(await readFile(BUNDLE_META, 'utf8').catch(() => '{}')) as {
      outputs?: Record<string, { inputs: Record<string, unknown> }>;
    };
    expect(meta.outputs, `${BUNDLE_META}: run npm run build`).to.be.an('object');
    const inputs = new Set(Object.values(meta.outputs!).flatMap((o) => Object.keys(o.inputs)));
    const clientNode = [...inputs].filter((i) => i.includes('node_modules/@kubernetes/client-node/'));
    // KubeConfig is in: the check below looks at the real bundle, not an empty one.
    expect(clientNode).to.include('node_modules/@kubernetes/client-node/dist/config.js');
    const modules = clientNode.map((i) => i.replace(/.*node_modules\/@kubernetes\/client-node\/dist\//, ''));
    for (const module of ['index.js', 'watch.js', 'informer.js', 'cache.js', 'api.js', 'exec.js', 'attach.js']) {
      expect(modules, module).not.to.include(module);
    }
    // Nor what config.js imports for the two methods the controller never calls (makeApiClient,
    // applyToFetchOptions; see scripts/bundle-kubeconfig.mjs): the generated API and node-fetch.
    expect(modules.filter((m) => m.startsWith('gen/'))).to.deep.equal([]);
    // What only Watch, exec/attach, the generated API and node-fetch load.
    for (const pkg of ['node-fetch', 'whatwg-url', 'tr46', 'ws', 'isomorphic-ws', 'form-data', 'tar-fs']) {
      const bundled = [...inputs].filter((i) => i.includes(`node_modules/${pkg}/`));
      expect(bundled, pkg).to.deep.equal([]);
    }
  });
});
