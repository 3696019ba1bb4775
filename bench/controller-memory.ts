// Memory of the running controller (the real CLI against the API stand-in, nft backend) with N
// LoadBalancer Services: resident set after the first sync and a few full resyncs, and its peak.
// The figures behind the DaemonSet's memory request and limit (deploy/base/daemonset.yaml).
// Usage (root): node dist/bench/controller-memory.js [N ...]   (default 0 1000 10000)
// Runs itself in a private network and mount namespace: the machine's firewall is never touched.

import { spawn, spawnSync } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { ApiStandIn } from '../testbed/api-server.js';
import { shippedArgs } from '../testbed/shipped-controller.js';
import { httpGet, scrapeMetrics } from '../test/support/scrape.js';

const ISOLATED = 'IPVS_NODE_CONTROLLER_BENCH_ISOLATED';

if (process.env[ISOLATED] !== '1') {
  if (process.getuid?.() !== 0) {
    console.error('controller-memory: run as root (it programs nftables in a namespace of its own)');
    process.exit(2);
  }
  const self = fileURLToPath(import.meta.url);
  const r = spawnSync(
    'unshare',
    ['--net', '--mount', '--propagation', 'private', '--', process.execPath, self, ...process.argv.slice(2)],
    {
      stdio: 'inherit',
      env: { ...process.env, [ISOLATED]: '1' },
    },
  );
  process.exit(r.status ?? 1);
}

/** A Service as a real API server serves it, with the fields the controller strips. */
function service(i: number): Record<string, unknown> {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      name: `svc-${i}`,
      namespace: `ns-${i % 50}`,
      labels: { app: `app-${i}`, team: 'bench' },
      annotations: { 'kubectl.kubernetes.io/last-applied-configuration': 'x'.repeat(600) },
      managedFields: [{ manager: 'kubectl', operation: 'Apply', fieldsV1: { 'f:spec': { 'f:ports': {} } } }],
    },
    spec: {
      type: 'LoadBalancer',
      clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}`,
      clusterIPs: [`10.96.${(i >> 8) & 255}.${i & 255}`],
      selector: { app: `app-${i}` },
      externalTrafficPolicy: 'Local',
      ports: [
        { name: 'http', port: 80, protocol: 'TCP', targetPort: 8080 },
        { name: 'https', port: 443, protocol: 'TCP', targetPort: 8443 },
      ],
    },
    status: { loadBalancer: { ingress: [{ ip: `172.${16 + ((i >> 16) & 15)}.${(i >> 8) & 255}.${i & 255}` }] } },
  };
}

function statusKb(pid: number, field: string): number {
  const m = new RegExp(`^${field}:\\s+(\\d+) kB`, 'm').exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) : NaN;
}

async function until(what: string, check: () => Promise<boolean>): Promise<void> {
  const deadline = Date.now() + 120_000;
  while (!(await check().catch(() => false))) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

async function measure(n: number, dir: string): Promise<string> {
  const api = await ApiStandIn.start();
  api.apply({
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name: 'bench-node' },
    spec: { podCIDRs: ['10.244.0.0/24'] },
  });
  for (let i = 0; i < n; i++) api.apply(service(i));
  const kubeconfig = join(dir, `kubeconfig-${n}`);
  await api.writeKubeconfig(kubeconfig);
  const child = spawn(
    process.execPath,
    shippedArgs([
      `--kubeconfig=${kubeconfig}`,
      '--node-name=bench-node',
      '--sync-period=2s',
      '--metrics-bind-address=127.0.0.1:9477',
      '--healthz-bind-address=127.0.0.1:9478',
      ...(process.env.BENCH_ARGS?.split(' ').filter(Boolean) ?? []),
    ]),
    { stdio: ['ignore', 'ignore', 'inherit'] },
  );
  try {
    await until('ready', async () => (await httpGet('http://127.0.0.1:9478/readyz')).status === 200);
    const syncs = async () =>
      (await scrapeMetrics('http://127.0.0.1:9477')).sum('ipvs_node_controller_sync_duration_seconds_count');
    const first = await syncs();
    await until('three full resyncs', async () => (await syncs()) >= first + 3);
    const e = await scrapeMetrics('http://127.0.0.1:9477');
    const entries = e.sum('ipvs_node_controller_programmed_entries');
    const heap = (e.value('nodejs_heap_size_used_bytes') ?? NaN) / 2 ** 20;
    const rss = statusKb(child.pid!, 'VmRSS') / 1024;
    const peak = statusKb(child.pid!, 'VmHWM') / 1024;
    return `| ${n} | ${entries} | ${rss.toFixed(0)} | ${peak.toFixed(0)} | ${heap.toFixed(1)} |`;
  } finally {
    child.kill('SIGTERM');
    await once(child, 'exit');
    spawnSync(process.execPath, shippedArgs(['--cleanup']), { stdio: 'ignore' });
    await api.stop();
  }
}

spawnSync('ip', ['link', 'set', 'lo', 'up']);
const sizes = process.argv
  .slice(2)
  .map(Number)
  .filter((x) => x >= 0 && Number.isInteger(x));
const dir = mkdtempSync(join(tmpdir(), 'bench-memory-'));
try {
  console.log('| Services | entries | RSS after resyncs (MiB) | peak RSS (MiB) | V8 heap used (MiB) |');
  console.log('| ---: | ---: | ---: | ---: | ---: |');
  for (const n of sizes.length > 0 ? sizes : [0, 1000, 10_000]) console.log(await measure(n, dir));
} finally {
  rmSync(dir, { recursive: true, force: true });
}
