// Time of `ipvs-node-controller --dry-run --from-file` for N LoadBalancer Services (whole process:
// start, parse, model, render). Prints a table; no kernel, no root.
// Usage: node dist/bench/dry-run.js [N ...]   (default 1000 10000)

import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { shippedArgs } from '../testbed/shipped-controller.js';

const RUNS = 5;

function servicesList(n: number): string {
  const items: unknown[] = [{ kind: 'Node', metadata: { name: 'bench-node' }, spec: { podCIDRs: ['10.244.0.0/24'] } }];
  for (let i = 0; i < n; i++) {
    items.push({
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: `svc-${i}`, namespace: `ns-${i % 50}`, creationTimestamp: '2024-01-01T00:00:00Z' },
      spec: {
        type: 'LoadBalancer',
        clusterIP: `10.96.${(i >> 8) & 255}.${i & 255}`,
        ports: [
          { port: 80, protocol: 'TCP' },
          { port: 443, protocol: 'TCP' },
        ],
      },
      status: { loadBalancer: { ingress: [{ ip: `172.${16 + ((i >> 16) & 15)}.${(i >> 8) & 255}.${i & 255}` }] } },
    });
  }
  return JSON.stringify({ apiVersion: 'v1', kind: 'List', items });
}

const sizes = process.argv
  .slice(2)
  .map(Number)
  .filter((n) => n > 0);
const dir = mkdtempSync(join(tmpdir(), 'bench-dry-run-'));
try {
  console.log('| Services | entries | median wall time (ms) | min (ms) |');
  console.log('| ---: | ---: | ---: | ---: |');
  for (const n of sizes.length > 0 ? sizes : [1000, 10_000]) {
    const file = join(dir, `services-${n}.json`);
    writeFileSync(file, servicesList(n));
    const times: number[] = [];
    let entries = 0;
    for (let r = 0; r < RUNS; r++) {
      const start = performance.now();
      const out = execFileSync(process.execPath, shippedArgs(['--dry-run', '--from-file', file]), {
        maxBuffer: 1 << 30,
      });
      times.push(performance.now() - start);
      entries = (out.toString().match(/ comment "/g) ?? []).length;
    }
    times.sort((a, b) => a - b);
    console.log(`| ${n} | ${entries} | ${times[RUNS >> 1]!.toFixed(0)} | ${times[0]!.toFixed(0)} |`);
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
