// The command line as users meet it: exit codes and one-line errors. No kernel access needed.

import assert from 'node:assert/strict';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { execa } from 'execa';

const CLI = fileURLToPath(new URL('../../src/cli/main.js', import.meta.url));

function cli(args: string[], input?: string) {
  return execa(process.execPath, [CLI, ...args], { reject: false, input: input ?? '', timeout: 20_000 });
}

describe('command line', function () {
  this.timeout(30_000);
  let dir: string;
  before(() => (dir = mkdtempSync(join(tmpdir(), 'cli-'))));
  after(() => rmSync(dir, { recursive: true, force: true }));

  it('--help lists every flag and exits 0', async () => {
    const r = await cli(['--help']);
    assert.equal(r.exitCode, 0);
    for (const flag of ['--kubeconfig', '--backend', '--detect-local-mode', '--dry-run', '--from-file', '--cleanup']) {
      assert.ok(r.stdout.includes(flag), flag);
    }
  });

  it('a bad flag value is one line on stderr and exit code 2', async () => {
    const r = await cli(['--min-sync-period', 'soon']);
    assert.equal(r.exitCode, 2);
    assert.equal(
      r.stderr.split('\n')[0],
      "ipvs-node-controller: --min-sync-period: 'soon' is not a duration (write it as 30s, 500ms, 1m)",
    );
    assert.equal(r.stdout, '');
  });

  it('--dry-run --from-file prints the ruleset with skips, without root or kernel', async () => {
    const r = await cli(['--dry-run', '--from-file', 'examples/services.yaml']);
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, /^# 4 Services read; 5 IPv4 and 2 IPv6 entries/);
    assert.match(r.stdout, /# skipped shop\/behind-proxy: ipModeProxy \(ingress 10\.19\.30\.5\)/);
    assert.match(r.stdout, /10\.19\.20\.201 \. tcp \. 9100 comment "monitoring\/metrics" : 10\.231\.7\.9/);
  });

  it('--from-file - reads kubectl JSON from stdin and picks the Node by --node-name', async () => {
    const list = {
      apiVersion: 'v1',
      kind: 'List',
      items: [
        { kind: 'Node', metadata: { name: 'a' }, spec: { podCIDRs: ['10.1.0.0/24'] } },
        { kind: 'Node', metadata: { name: 'b' }, spec: { podCIDRs: ['10.2.0.0/24'] } },
        {
          kind: 'Service',
          metadata: { name: 'web', namespace: 'shop' },
          spec: { type: 'LoadBalancer', clusterIP: '10.96.0.1', ports: [{ port: 443 }] },
          status: { loadBalancer: { ingress: [{ ip: '203.0.113.5' }] } },
        },
      ],
    };
    const r = await cli(['--dry-run', '--from-file', '-', '--node-name', 'b'], JSON.stringify(list));
    assert.equal(r.exitCode, 0, r.stderr);
    assert.match(r.stdout, /elements = \{ 10\.2\.0\.0\/24 \}/);
    assert.match(r.stdout, /203\.0\.113\.5 \. tcp \. 443 comment "shop\/web" : 10\.96\.0\.1/);
  });

  it('writes a large ruleset to a pipe completely before it exits', async () => {
    const items = Array.from({ length: 5000 }, (_, i) => ({
      kind: 'Service',
      metadata: { name: `s${i}`, namespace: 'big' },
      spec: { type: 'LoadBalancer', clusterIP: `10.96.${i >> 8}.${i & 255}`, ports: [{ port: 80 }] },
      status: { loadBalancer: { ingress: [{ ip: `172.16.${i >> 8}.${i & 255}` }] } },
    }));
    const r = await cli(['--dry-run', '--from-file', '-'], JSON.stringify({ kind: 'List', items }));
    assert.equal(r.exitCode, 0, r.stderr);
    assert.equal(r.stdout.match(/ comment "big\/s\d+" : /g)?.length, 5000);
    assert.match(r.stdout, /dnat ip6 to ip6 daddr/, 'the last table is there');
  });

  it('an unreadable or malformed file is one clear line and exit code 1', async () => {
    const bad = join(dir, 'bad.yaml');
    writeFileSync(bad, 'items: [unclosed');
    const r = await cli(['--dry-run', '--from-file', bad]);
    assert.equal(r.exitCode, 1);
    assert.match(r.stderr, /^ipvs-node-controller: --from-file: .*bad\.yaml: not valid YAML/);
    const missing = await cli(['--dry-run', '--from-file', join(dir, 'nope.json')]);
    assert.equal(missing.exitCode, 1);
    assert.match(missing.stderr, /ENOENT|no such file/);
  });

  it('an unreachable API server is one clear line and exit code 1', async () => {
    const kubeconfig = join(dir, 'kubeconfig');
    writeFileSync(
      kubeconfig,
      [
        'apiVersion: v1',
        'kind: Config',
        'clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]',
        'users: [{name: u, user: {token: t}}]',
        'contexts: [{name: x, context: {cluster: c, user: u}}]',
        'current-context: x',
      ].join('\n'),
    );
    const r = await cli(['--dry-run', '--kubeconfig', kubeconfig]);
    assert.equal(r.exitCode, 1);
    assert.match(r.stderr, /^ipvs-node-controller: cannot list Services from the API server: .*ECONNREFUSED/);
    assert.equal(r.stderr.trim().split('\n').length, 1);
  });
});
