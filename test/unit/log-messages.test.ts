// Kubernetes structured logging: every message is a constant sentence (a capital first letter, no
// trailing punctuation), the values are fields. Checked twice: in the source, every logger call
// of src/ passes a string literal; at run time, the controller's skip, conflict and step-aside
// lines carry their values in fields only.

import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { expect } from 'chai';
import ts from 'typescript';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { FakeDriver } from '../doubles/fake-driver.js';
import { Controller } from '../../src/controller/controller.js';
import type { ClusterCaches } from '../../src/kube/cluster.js';
import type { NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { CONFIG } from '../support/fixtures.js';
import { linesLogger } from '../support/log-lines.js';

const REPO = fileURLToPath(new URL('../../../', import.meta.url));
const LEVELS = new Set(['trace', 'debug', 'info', 'warn', 'error', 'fatal']);
/** Kubernetes style: a capital first letter, no trailing punctuation. */
const STYLE = /^[A-Z][^\n]*[^.!?:;,\s]$/;

function sourceFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((d) =>
    d.isDirectory() ? sourceFiles(join(dir, d.name)) : d.name.endsWith('.ts') ? [join(dir, d.name)] : [],
  );
}

interface LogCall {
  where: string;
  /** The message's possible values, or undefined when it is not a constant. */
  messages: string[] | undefined;
}

/** The constant strings an expression can be: a literal, or a conditional between literals. */
function constants(node: ts.Expression): string[] | undefined {
  if (ts.isStringLiteral(node) || ts.isNoSubstitutionTemplateLiteral(node)) return [node.text];
  if (ts.isParenthesizedExpression(node)) return constants(node.expression);
  if (ts.isConditionalExpression(node)) {
    const a = constants(node.whenTrue);
    const b = constants(node.whenFalse);
    return a && b ? [...a, ...b] : undefined;
  }
  return undefined;
}

/** Every call of `<...>logger.<level>(...)` and `<...>logger?.<level>(...)` in src/. */
function logCalls(): LogCall[] {
  const calls: LogCall[] = [];
  for (const file of sourceFiles(join(REPO, 'src'))) {
    const source = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
    const visit = (node: ts.Node): void => {
      if (
        ts.isCallExpression(node) &&
        ts.isPropertyAccessExpression(node.expression) &&
        LEVELS.has(node.expression.name.text) &&
        /logger$/i.test(node.expression.expression.getText(source))
      ) {
        const { line } = source.getLineAndCharacterOfPosition(node.getStart(source));
        const where = `${relative(REPO, file)}:${line + 1}`;
        const args = node.arguments;
        const last = args[args.length - 1];
        // One argument: the message, or an object without one (which the rule below rejects).
        calls.push({ where, messages: last ? constants(last) : undefined });
      }
      ts.forEachChild(node, visit);
    };
    visit(source);
  }
  return calls;
}

describe('log messages: constant sentences', () => {
  const calls = logCalls();

  it('finds the logger calls of src/ (the scan itself works)', () => {
    expect(calls.length).to.be.greaterThan(30);
    expect(calls.some((c) => c.where.startsWith('src/controller/controller.ts'))).to.equal(true);
    expect(calls.some((c) => c.where.startsWith('src/cli/main.ts'))).to.equal(true);
  });

  it('every logger call passes a constant message: values go in fields, never into the message', () => {
    const bad = calls.filter((c) => c.messages === undefined).map((c) => c.where);
    expect(bad, 'messages that are not string literals').to.deep.equal([]);
  });

  it('every message starts with a capital letter and ends without punctuation', () => {
    const bad = calls.flatMap((c) => (c.messages ?? []).filter((m) => !STYLE.test(m)).map((m) => `${c.where}: ${m}`));
    expect(bad).to.deep.equal([]);
  });
});

// ---- the controller's main paths, at run time -------------------------------------------------

/** The caches, as the informers hold them after their first list. */
function cachesOf(services: ServiceInfo[], node: NodeInfo): ClusterCaches {
  const cache = <T>(items: T[]) =>
    ({
      start: () => undefined,
      stop: async () => undefined,
      waitForSync: async () => undefined,
      hasSynced: () => true,
      list: () => items,
      changes: { [Symbol.iterator]: () => items[Symbol.iterator]() },
    }) as unknown as ClusterCaches['services'];
  return {
    services: cache(services),
    node: cache([node]) as unknown as ClusterCaches['node'],
    onChange: () => undefined,
  };
}

const lb = (name: string, ip: string, created: string, ports = [80]): ServiceInfo => ({
  namespace: 'tenant',
  name,
  type: 'LoadBalancer',
  creationTimestamp: created,
  clusterIP: `10.96.0.${10 + name.length}`,
  ports: ports.map((port) => ({ port, protocol: 'TCP' })),
  ingress: [{ ip }],
});

async function until(what: string, ok: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !ok(); i++) await new Promise((r) => setTimeout(r, 10));
  if (!ok()) expect.fail(`timed out waiting for ${what}`);
}

describe('log messages: the controller writes values as fields', function () {
  it('skip, conflict and step-aside lines: a constant message, the Service as {namespace, name}', async () => {
    const raw: string[] = [];
    const logger = linesLogger(raw, 'debug');
    const services = [
      lb('alpha', '192.0.2.10', '2024-01-01T00:00:00Z'),
      lb('beta', '192.0.2.10', '2024-02-01T00:00:00Z'),
      lb('big', '192.0.2.20', '2024-01-01T00:00:00Z', [81, 82, 83]),
      { ...lb('behind-proxy', '192.0.2.30', '2024-01-01T00:00:00Z'), ingress: [{ ip: '192.0.2.30', ipMode: 'Proxy' }] },
    ];
    const controller = new Controller({
      caches: cachesOf(services, { name: 'node-1', podCIDRs: ['10.244.1.0/24'] }),
      reconciler: new Reconciler(new FakeDriver()),
      model: { ...CONFIG, maxEntriesPerService: 2 },
      nodeName: 'node-1',
      minSyncPeriodMs: 0,
      syncPeriodMs: 60_000,
      logger,
      kubeProxyMode: { mode: 'ipvs', source: 'proxyMode', detail: 'kube-proxy answers /proxyMode: ipvs' },
    });
    const lines = () => raw.map((l) => JSON.parse(l) as Record<string, unknown>);
    try {
      await controller.start();
      await until('the first sync', () => lines().some((l) => l.msg === 'Synced'));
      controller.onKubeProxyMode({
        mode: 'iptables',
        source: 'proxyMode',
        detail: 'kube-proxy answers /proxyMode: iptables',
      });
      await until('stepping aside', () => lines().some((l) => String(l.msg).startsWith('Stepped aside')));
    } finally {
      await controller.stop();
    }
    const all = lines();
    const skips = all.filter((l) => l.msg === 'Service address skipped');
    expect(skips.map((l) => [l.service, l.reason])).to.have.deep.members([
      [{ namespace: 'tenant', name: 'big' }, 'tooManyEntries'],
      [{ namespace: 'tenant', name: 'behind-proxy' }, 'ipModeProxy'],
    ]);
    for (const s of skips) expect(s.detail).to.be.a('string').and.not.equal('');
    const conflicts = all.filter((l) => l.msg === 'Service conflict, the older Service keeps the address');
    expect(conflicts).to.have.length(1);
    expect(conflicts[0]).to.deep.include({
      level: 30 + 10, // pino's number for warn (linesLogger keeps pino's numeric levels)
      service: { namespace: 'tenant', name: 'beta' },
      winner: { namespace: 'tenant', name: 'alpha' },
      externalIp: '192.0.2.10',
      protocol: 'TCP',
      port: 80,
      family: 'ipv4',
      entries: 1,
    });
    const aside = all.find((l) => String(l.msg).startsWith('Stepped aside'))!;
    expect(aside).to.include({
      msg: 'Stepped aside, our rules are removed and nothing is programmed',
      kubeProxyMode: 'iptables',
    });
    expect(aside.reason).to.match(/kube-proxy is in iptables mode/);

    // No message carries a value of its line: every value is in a field.
    const values = ['tenant', 'big', 'alpha', 'beta', '192.0.2', 'iptables', 'tooManyEntries', 'ipModeProxy', '80'];
    for (const l of all) {
      for (const v of values) expect(String(l.msg), `"${String(l.msg)}" has ${v}`).not.to.include(v);
      expect(String(l.msg)).to.match(STYLE);
    }
  });
});
