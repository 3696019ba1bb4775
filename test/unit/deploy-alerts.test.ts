// The alerts of deploy/monitoring/prometheusrule.yaml: their shape (for, severity, runbook_url) and
// their behaviour, with `promtool test rules` on deploy/monitoring/alerts.promtool-test.yaml.

import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { copyFile, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import YAML from 'yaml';

const run = promisify(execFile);
const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const monitoring = join(repoRoot, 'deploy', 'monitoring');

interface Rule {
  alert?: string;
  expr: string;
  for?: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
}

describe('deploy/monitoring alerts (PrometheusRule)', function () {
  this.timeout(60_000);
  let rule: { kind: string; spec: { groups: Array<{ name: string; rules: Rule[] }> } };
  let dir: string;

  before(async () => {
    rule = YAML.parse(await readFile(join(monitoring, 'prometheusrule.yaml'), 'utf8'));
    dir = await mkdtemp(join(tmpdir(), 'ipvs-node-controller-alerts-'));
    await writeFile(join(dir, 'rules.yaml'), YAML.stringify({ groups: rule.spec.groups }));
    await copyFile(join(monitoring, 'alerts.promtool-test.yaml'), join(dir, 'alerts.promtool-test.yaml'));
  });

  after(async () => {
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('is a PrometheusRule that kubectl kustomize deploy/monitoring includes', async () => {
    expect(rule.kind).to.equal('PrometheusRule');
    const { stdout } = await run('kubectl', ['kustomize', monitoring]);
    const kinds = YAML.parseAllDocuments(stdout).map((d) => (d.toJSON() as { kind: string }).kind);
    expect(kinds).to.include('PrometheusRule');
  });

  it('gives every alert a for:, a severity, a fixed summary, a description and its runbook in docs/alerts.md', async () => {
    const alerts = rule.spec.groups.flatMap((g) => g.rules).filter((r) => r.alert);
    expect(alerts.length).to.be.greaterThan(0);
    const doc = await readFile(join(repoRoot, 'docs', 'alerts.md'), 'utf8');
    // GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes.
    const anchors = [...doc.matchAll(/^#{2,3} (.+)$/gm)].map((m) =>
      m[1]!
        .trim()
        .toLowerCase()
        .replace(/[^a-z0-9 -]/g, '')
        .replace(/ /g, '-'),
    );
    for (const a of alerts) {
      expect(a.for, `${a.alert} for`).to.match(/^\d+[smh]$/);
      expect(a.labels?.severity, `${a.alert} severity`).to.be.oneOf(['critical', 'warning', 'info']);
      // As the mixins write them: the summary is the same for every instance of the alert (it
      // groups well in Alertmanager), the values go into the description.
      expect(a.annotations?.summary, `${a.alert} summary`).to.be.a('string').and.not.equal('');
      expect(a.annotations?.summary, `${a.alert} summary is fixed`).to.not.include('{{');
      expect(a.annotations?.description, `${a.alert} description`).to.be.a('string').and.not.equal('');
      // A checkout does not know where it is hosted: the runbook is named by its path in the
      // repository, which a release turns into the URL of its tag (scripts/release.mjs).
      expect(a.annotations?.runbook_url, `${a.alert} runbook_url`).to.equal(`docs/alerts.md#${a.alert!.toLowerCase()}`);
      expect(anchors, `docs/alerts.md has a section ${a.alert}`).to.include(a.alert!.toLowerCase());
    }
  });

  it('severities follow the harm: critical only where traffic is blackholed now', () => {
    const severity = new Map(
      rule.spec.groups.flatMap((g) => g.rules).map((r) => [r.alert, r.labels?.severity] as const),
    );
    // A node without any controller: its in-cluster traffic to the LoadBalancer IPs is refused.
    expect(severity.get('IpvsNodeControllerMissing')).to.equal('critical');
    // One node's controller down or stuck keeps its rules in place: changes wait, nothing breaks.
    for (const keepsRules of ['IpvsNodeControllerDown', 'IpvsNodeControllerNotSyncing', 'IpvsNodeControllerSyncErrors'])
      expect(severity.get(keepsRules), keepsRules).to.equal('warning');
    const critical = [...severity].filter(([, s]) => s === 'critical').map(([a]) => a);
    expect(critical).to.deep.equal(['IpvsNodeControllerMissing']);
  });

  it('facts of the whole cluster are aggregated by cluster, not kept per node', () => {
    const alerts = new Map(rule.spec.groups.flatMap((g) => g.rules).map((r) => [r.alert, r]));
    for (const name of ['IpvsNodeControllerConflicts', 'IpvsNodeControllerVersionsDiffer']) {
      const expr = alerts.get(name)!.expr;
      expect(expr, name).to.match(/^(max|count) by \(cluster\)/);
      expect(expr, name).to.not.match(/[({,]\s*(node|pod|instance)\b/);
    }
    // No rule needs the node label on the controllers' own series: Missing takes it from
    // kube-state-metrics, the others keep whatever labels the scrape gives.
    for (const [name, r] of alerts) {
      if (name === 'IpvsNodeControllerMissing') continue;
      expect(r.expr, `${name} does not select or group by node`).to.not.match(/[({,]\s*node\b/);
    }
  });

  it('covers what an operator fears: down, missing, conntrack clean-up errors, stepped aside for long', () => {
    const alerts = new Map(rule.spec.groups.flatMap((g) => g.rules).map((r) => [r.alert, r]));
    expect(alerts.get('IpvsNodeControllerDown')?.expr).to.match(/up\{job="ipvs-node-controller"\} == 0/);
    // The nodes the DaemonSet runs on (no Windows, no virtual-kubelet nodes), without a pod of it.
    const missing = alerts.get('IpvsNodeControllerMissing')?.expr as string;
    expect(missing).to.match(/^\(\s*kube_node_info\s+unless on \(cluster, node\)/);
    expect(missing).to.match(/\)\s*unless on \(cluster, node\)\s*kube_pod_info\{/);
    expect(missing).to.include('kube_node_spec_taint{key="virtual-kubelet.io/provider"}');
    expect(alerts.get('IpvsNodeControllerConntrackCleanupErrors')?.expr).to.include('conntrack_cleanup_errors_total');
    const steppedAside = alerts.get('IpvsNodeControllerSteppedAside');
    expect(steppedAside?.labels?.severity).to.equal('info');
    expect(steppedAside?.for).to.equal('24h');
  });

  it('IpvsNodeControllerMissing leaves out the nodes the DaemonSet leaves out, and no others', async () => {
    const ds = YAML.parse(await readFile(join(repoRoot, 'deploy', 'base', 'daemonset.yaml'), 'utf8'));
    const pod = ds.spec.template.spec;
    // Linux only (the alert: os_image, or the kubernetes.io/os label where exported) ...
    expect(pod.nodeSelector).to.deep.equal({ 'kubernetes.io/os': 'linux' });
    // ... no virtual-kubelet (the alert: its taint, or the type label where exported) ...
    expect(pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms).to.deep.equal([
      { matchExpressions: [{ key: 'type', operator: 'NotIn', values: ['virtual-kubelet'] }] },
    ]);
    // ... and every taint tolerated: no other taint leaves a node out.
    expect(pod.tolerations).to.deep.equal([{ operator: 'Exists' }]);
    const missing = rule.spec.groups.flatMap((g) => g.rules).find((r) => r.alert === 'IpvsNodeControllerMissing')!;
    const excluded = [...missing.expr.matchAll(/unless on \(cluster, node\)\s+(\w+\{[^}]*\})/g)].map((m) => m[1]);
    expect(excluded).to.deep.equal([
      'kube_node_info{os_image=~"(?i)windows.*"}',
      'kube_node_labels{label_kubernetes_io_os!~"linux|"}',
      'kube_node_spec_taint{key="virtual-kubelet.io/provider"}',
      'kube_node_labels{label_type="virtual-kubelet"}',
      'kube_pod_info{created_by_kind="DaemonSet", created_by_name="ipvs-node-controller"}',
    ]);
  });

  it('promtool check rules accepts them', async () => {
    const { stdout } = await run('promtool', ['check', 'rules', join(dir, 'rules.yaml')]);
    expect(stdout).to.include('SUCCESS');
  });

  it('promtool test rules: each alert fires when it should, and "not syncing" not on a container that has just started', async () => {
    const result = await run('promtool', ['test', 'rules', 'alerts.promtool-test.yaml'], { cwd: dir }).catch(
      (err: { stdout?: string; stderr?: string }) => {
        throw new Error(`promtool test rules failed:\n${err.stdout ?? ''}${err.stderr ?? ''}`);
      },
    );
    expect(result.stdout).to.include('SUCCESS');
    // Every alert is exercised by the promtool tests.
    const tested = await readFile(join(dir, 'alerts.promtool-test.yaml'), 'utf8');
    for (const a of rule.spec.groups.flatMap((g) => g.rules).filter((r) => r.alert)) {
      expect(tested, `a promtool test for ${a.alert}`).to.include(`alertname: ${a.alert}`);
    }
  });
});
