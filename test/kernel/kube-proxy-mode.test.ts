// The controller and kube-proxy's mode, with packets: the real CLI, the API stand-in, and a
// kube-proxy stand-in in the node namespace (test/support/kube-proxy-stand-in.ts) in IPVS,
// nftables and iptables mode, and switching between them while a pod keeps connecting. Its
// version (kubernetes_build_info on /metrics, v1.33.2) and, in nftables mode, its known bug
// (kubernetes#131765), as an operator sees them: the start line, /readyz, the metrics, the log,
// the Node Event, and their clearing when kube-proxy is upgraded.

import { expect } from 'chai';
import type { ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtempSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ApiStandIn } from '../../testbed/api-server.js';
import { NodeNetwork, probe, sh } from '../../testbed/node-network.js';
import { ENDPOINT, KubeProxyStandIn, type StandInMode } from '../support/kube-proxy-stand-in.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import { wireLbService, wireNode } from '../support/wire-objects.js';
import { spawnNodeProcess, standInFlags } from '../support/node-process.js';

const CLUSTER_IP = '10.96.0.10';
const LB = '192.0.2.10';
const PORT = 80;
const HEALTH_PORT = 19478;
const METRICS_PORT = 19477;
const POLL = '300ms';

const SERVICE = wireLbService('web', CLUSTER_IP, LB, {
  metadata: { uid: 'uid-web' },
  port: PORT,
  portName: 'http',
  spec: { externalTrafficPolicy: 'Local' },
});
const NODE_OBJECT = wireNode(['10.244.1.0/24']);

function get(port: number, path: string): Promise<string> {
  return new Promise((resolve) => {
    // below the floor: one request of a polling loop, to a server on loopback; a hung one is
    // retried by the loop (a refused one answers at once).
    const req = http.get({ host: '127.0.0.1', port, path, timeout: 30_000 }, (res) => {
      let body = '';
      res.on('data', (d: Buffer) => (body += d.toString()));
      res.on('end', () => resolve(body));
    });
    req.on('error', () => resolve(''));
    req.on('timeout', () => req.destroy());
  });
}

interface Readyz {
  status: string;
  detail: string;
  warnings: string[];
  kubeProxy?: {
    mode: string;
    modeSource: string;
    version: string | null;
    knownIssues: string[];
    steppedAside: boolean;
    reason?: string;
    settings: string[];
  };
}

async function readyz(): Promise<Readyz | undefined> {
  const text = await get(HEALTH_PORT, '/readyz');
  try {
    return JSON.parse(text) as Readyz;
  } catch {
    return undefined;
  }
}

async function until<T>(what: string, check: () => Promise<T | undefined | false>, tries = 150): Promise<T> {
  for (let i = 0; i < tries; i++) {
    const v = await check();
    if (v) return v;
    await sleep(100);
  }
  expect.fail(`timed out waiting for: ${what}`);
}

const ourNftTables = () => sh('nft', ['list', 'tables']).match(/table ip6? ipvs-node-controller/g) ?? [];
const ourIptablesChains = () =>
  [sh('iptables-save', ['-t', 'nat']), sh('iptables-legacy-save', ['-t', 'nat'])].join('').match(/IPVS_\w+/g) ?? [];

describe('kube-proxy mode on the kernel (CLI + API stand-in + kube-proxy stand-in)', function () {
  this.timeout(120_000);
  const network = new NodeNetwork();
  const kubeProxy = new KubeProxyStandIn({
    clusterIp: CLUSTER_IP,
    lbIp: LB,
    port: PORT,
    clusterName: 'svc-web',
    lbName: 'lb-path',
  });
  let api: ApiStandIn;
  let dir: string;
  let kubeconfig: string;
  let kubeProxyConfig: string;
  let controller: ChildProcess | undefined;
  let output = '';
  const pod = () => network.pod.ns;

  /** kube-proxy's ConfigMap file, replaced the way the kubelet does (a rename). */
  function writeKubeProxyConfig(mode: StandInMode | undefined): void {
    const text = [
      'apiVersion: kubeproxy.config.k8s.io/v1alpha1',
      'kind: KubeProxyConfiguration',
      ...(mode ? [`mode: ${mode}`] : []),
      'clusterCIDR: 10.244.0.0/16',
      'iptables:',
      '  masqueradeBit: 14',
      '  masqueradeAll: false',
      'metricsBindAddress: 127.0.0.1:10249',
      '',
    ].join('\n');
    writeFileSync(`${kubeProxyConfig}.new`, text);
    renameSync(`${kubeProxyConfig}.new`, kubeProxyConfig);
  }

  function startController(...extra: string[]): void {
    output = '';
    controller = spawnNodeProcess(
      shippedArgs([
        '--backend=nft',
        ...standInFlags(kubeconfig, '5s'),
        ...[`--healthz-bind-address=127.0.0.1:${HEALTH_PORT}`, `--metrics-bind-address=127.0.0.1:${METRICS_PORT}`],
        ...[`--kube-proxy-config=${kubeProxyConfig}`, `--kube-proxy-mode-poll-interval=${POLL}`],
        ...extra,
      ]),
      (text) => (output += text),
    );
  }

  async function stopController(): Promise<void> {
    if (!controller || controller.exitCode !== null) return;
    controller.kill('SIGTERM');
    const [code] = (await once(controller, 'exit')) as [number | null];
    controller = undefined;
    expect(code, 'SIGTERM exits 0').to.equal(0);
  }

  before(async () => {
    network.setUp();
    sh('ip', ['link', 'del', 'kube-ipvs0']); // the stand-in kube-proxy owns it
    // A node has a default route: without one, a node process's connect to an address nobody
    // routes fails before the output hook where kube-proxy's DNAT would apply.
    sh('ip', ['route', 'add', 'default', 'via', '192.168.50.2']);
    await kubeProxy.start();
    api = await ApiStandIn.start({ bookmarkIntervalMs: 500 });
    dir = mkdtempSync(join(tmpdir(), 'kube-proxy-mode-'));
    kubeconfig = join(dir, 'kubeconfig');
    kubeProxyConfig = join(dir, 'config.conf');
    await api.writeKubeconfig(kubeconfig);
    api.apply(NODE_OBJECT);
    api.apply(SERVICE);
  });

  after(async () => {
    try {
      if (controller && controller.exitCode === null) controller.kill('SIGKILL');
      await kubeProxy.stop();
      await api?.stop();
      sh(process.execPath, shippedArgs(['--cleanup']));
    } finally {
      rmSync(dir, { recursive: true, force: true });
      network.tearDown();
    }
  });

  afterEach(async function () {
    if (this.currentTest?.state === 'failed') console.log(`controller output:\n${output}`);
    await stopController();
  });

  it('IPVS mode: translates as today; /readyz, the metric and the log say ipvs; settings come from the file', async () => {
    await kubeProxy.enter('ipvs');
    writeKubeProxyConfig('ipvs');
    startController();
    await until('pod -> LB IP translated', async () => (await probe(pod(), 'tcp', LB, PORT)) === 'svc-web');
    expect(await probe(undefined, 'tcp', LB, PORT), 'node -> LB IP translated').to.equal('svc-web');
    expect(await probe(network.outside.ns, 'tcp', LB, PORT), 'outside -> LB IP untouched').to.equal('lb-path');
    const ready = await until('ready', async () => {
      const r = await readyz();
      return r?.status === 'ok' && r;
    });
    expect(ready.kubeProxy?.mode).to.equal('ipvs');
    expect(ready.kubeProxy?.modeSource).to.equal('proxyMode');
    expect(ready.kubeProxy?.steppedAside).to.equal(false);
    expect(ready.kubeProxy?.settings, ready.kubeProxy?.settings.join()).to.include(
      'masqueradeBit=14 (kube-proxy-config)',
    );
    expect(ready.kubeProxy?.settings).to.include('clusterCidrs=10.244.0.0/16 (kube-proxy-config)');
    const metrics = await get(METRICS_PORT, '/metrics');
    expect(metrics).to.match(/ipvs_node_controller_kube_proxy_mode\{mode="ipvs"\} 1/);
    expect(metrics).to.match(/ipvs_node_controller_stepped_aside 0/);
    expect(output).to.match(/"mode":"ipvs",.*"msg":"Detected the kube-proxy mode"/);
    // kube-proxy's version, read from its /metrics: in the start line, on /readyz, in the metrics.
    expect(output).to.match(/"kubeProxyMode":"ipvs","kubeProxyVersion":"v1\.33\.2",.*"msg":"Starting"/);
    expect(output).to.match(/"mode":"ipvs","version":"v1\.33\.2",.*"msg":"Detected the kube-proxy mode"/);
    expect(ready.kubeProxy?.version).to.equal('v1.33.2');
    expect(ready.kubeProxy?.knownIssues, 'not in IPVS mode').to.deep.equal([]);
    expect(ready.warnings).to.deep.equal([]);
    expect(metrics).to.include('ipvs_node_controller_kube_proxy_info{mode="ipvs",version="v1.33.2"} 1');
    expect(metrics).to.include('ipvs_node_controller_kube_proxy_known_issue{issue="kubernetes#131765"} 0');
    expect(output).to.not.include('Known kube-proxy bug');
    await stopController();
    await kubeProxy.leave('ipvs');
  });

  for (const mode of ['nftables', 'iptables'] as const) {
    it(`${mode} mode: with stepping aside off, our rules stay inert (nothing is bound on the node): pod and node -> LB IP reach the endpoint through kube-proxy`, async () => {
      sh(process.execPath, shippedArgs(['--cleanup'])); // whatever an earlier test left
      await kubeProxy.enter(mode);
      writeKubeProxyConfig(mode);
      // kube-proxy alone serves the LoadBalancer IP from the pod and from the node.
      expect(await probe(pod(), 'tcp', LB, PORT), `kube-proxy (${mode}) serves pod -> LB IP`).to.equal(ENDPOINT.name);
      expect(await probe(undefined, 'tcp', LB, PORT), `kube-proxy (${mode}) serves node -> LB IP`).to.equal(
        ENDPOINT.name,
      );

      startController('--kube-proxy-step-aside=false');
      const ready = await until('ready and translating', async () => {
        const r = await readyz();
        return r?.status === 'ok' && ourNftTables().length > 0 && r;
      });
      expect(
        ready.warnings.some((w) => w.includes(`kube-proxy is in ${mode} mode`)),
        ready.warnings.join('; '),
      ).to.equal(true);
      // Our rules are in the kernel, but the LoadBalancer IP is local to no interface here: they
      // translate nothing, and kube-proxy's own DNAT answers (without the local-destination match,
      // our DNAT to the unbound ClusterIP pre-empted kube-proxy's and nothing answered).
      expect(await probe(pod(), 'tcp', LB, PORT), 'pod -> LB IP').to.equal(ENDPOINT.name);
      expect(await probe(undefined, 'tcp', LB, PORT), 'node -> LB IP').to.equal(ENDPOINT.name);
      expect(output).to.match(
        new RegExp(
          `"kubeProxyMode":"${mode}",.*"kubeProxyStepAside":false,"msg":"Translating although kube-proxy is not in IPVS mode"`,
        ),
      );
    });

    it(`${mode} mode: the controller steps aside (rules removed, ready, metric, log, Node Event); pod and node -> LB IP reach the endpoint`, async () => {
      // The previous run's rules are still in the kernel (SIGTERM leaves them): stepping aside removes them.
      expect(ourNftTables().length).to.be.above(0);
      const eventName = (e: unknown) => (e as { metadata: { name: string } }).metadata.name;
      const eventsBefore = new Set(api.list('Event').map(eventName));
      startController('--emit-events');
      await until('our rules removed', async () => ourNftTables().length === 0);
      await until(
        'pod -> LB IP answered by the endpoint',
        async () => (await probe(pod(), 'tcp', LB, PORT)) === ENDPOINT.name,
      );
      expect(await probe(undefined, 'tcp', LB, PORT), 'node -> LB IP').to.equal(ENDPOINT.name);
      expect(ourIptablesChains()).to.deep.equal([]);
      const ready = await until('ready', async () => {
        const r = await readyz();
        return r?.status === 'ok' && r;
      });
      expect(ready.detail).to.match(new RegExp(`stepped aside, nothing is programmed: kube-proxy is in ${mode} mode`));
      expect(ready.kubeProxy?.steppedAside).to.equal(true);
      expect((await get(HEALTH_PORT, '/healthz')).includes('"status":"ok"'), 'healthy').to.equal(true);
      const metrics = await get(METRICS_PORT, '/metrics');
      expect(metrics).to.match(new RegExp(`ipvs_node_controller_kube_proxy_mode\\{mode="${mode}"\\} 1`));
      expect(metrics).to.match(/ipvs_node_controller_stepped_aside 1/);
      expect(output).to.match(
        new RegExp(
          `"kubeProxyMode":"${mode}",.*"msg":"Stepped aside, our rules are removed and nothing is programmed"`,
        ),
      );
      const event = await until('a Node Event', async () =>
        api.list('Event').find((e) => (e as { reason?: string }).reason === 'SteppedAsideForKubeProxy'),
      );
      const involved = (event as { involvedObject: { kind: string; name: string } }).involvedObject;
      expect([involved.kind, involved.name]).to.deep.equal(['Node', 'node-1']);
      expect(ready.kubeProxy?.version).to.equal('v1.33.2');
      expect(metrics).to.include(`ipvs_node_controller_kube_proxy_info{mode="${mode}",version="v1.33.2"} 1`);
      const bugEvents = () =>
        api
          .list('Event')
          .filter((e) => !eventsBefore.has(eventName(e)))
          .filter((e) => (e as { reason?: string }).reason === 'KubeProxyKnownIssue') as Array<{
          type: string;
          message: string;
          involvedObject: { kind: string; name: string };
        }>;
      if (mode === 'nftables') {
        // kube-proxy v1.33.2 in nftables mode drops pods' traffic to eTP=Local external addresses itself.
        expect(ready.kubeProxy?.knownIssues).to.deep.equal(['kubernetes#131765']);
        expect(ready.warnings.join('\n')).to.match(
          /^kube-proxy v1\.33\.2 has a known bug \(kubernetes#131765\): in nftables mode kube-proxy drops traffic from pods .*v1\.33\.6 and v1\.34\.0 fix it/,
        );
        expect(metrics).to.include('ipvs_node_controller_kube_proxy_known_issue{issue="kubernetes#131765"} 1');
        expect(output).to.match(
          /"level":"warn",.*"issue":"kubernetes#131765","kubeProxyMode":"nftables","kubeProxyVersion":"v1\.33\.2",.*"msg":"Known kube-proxy bug breaks traffic to external addresses"/,
        );
        expect(output.match(/Known kube-proxy bug/g), 'logged once').to.have.lengthOf(1);
        const [bug, ...more] = await until(
          'the known bug on the Node',
          async () => bugEvents().length > 0 && bugEvents(),
        );
        expect(more).to.deep.equal([]);
        expect([bug!.type, bug!.involvedObject.kind, bug!.involvedObject.name]).to.deep.equal([
          'Warning',
          'Node',
          'node-1',
        ]);
        expect(bug!.message).to.match(/^kube-proxy v1\.33\.2 has a known bug \(kubernetes#131765\)/);

        // The operator upgrades kube-proxy (a restart as another build): all of it clears.
        await kubeProxy.restart('v1.33.6', 1000);
        const after = await until('readiness without the known bug', async () => {
          const r = await readyz();
          return r?.kubeProxy?.version === 'v1.33.6' && r;
        });
        expect(after.status).to.equal('ok');
        expect(after.kubeProxy?.knownIssues).to.deep.equal([]);
        expect(after.warnings).to.deep.equal([]);
        const upgraded = await get(METRICS_PORT, '/metrics');
        expect(upgraded).to.include('ipvs_node_controller_kube_proxy_info{mode="nftables",version="v1.33.6"} 1');
        expect(upgraded).to.include('ipvs_node_controller_kube_proxy_known_issue{issue="kubernetes#131765"} 0');
        expect(output).to.match(
          /"kubeProxyVersion":"v1\.33\.6",.*"msg":"No longer reporting the known kube-proxy bug"/,
        );
        expect(bugEvents(), 'no new Event for a fixed kube-proxy').to.have.lengthOf(1);
        expect(ourNftTables(), 'still stepped aside').to.deep.equal([]);
        kubeProxy.version = 'v1.33.2';
      } else {
        expect(ready.kubeProxy?.knownIssues, 'not in iptables mode').to.deep.equal([]);
        expect(metrics).to.include('ipvs_node_controller_kube_proxy_known_issue{issue="kubernetes#131765"} 0');
        expect(output).to.not.include('Known kube-proxy bug');
        expect(bugEvents()).to.deep.equal([]);
      }
      await stopController();
      await kubeProxy.leave(mode);
    });
  }

  for (const signals of ['/proxyMode, kube-ipvs0 and the configured mode', '/proxyMode and kube-ipvs0 only'])
    it(`IPVS -> nftables -> IPVS while running (${signals}): probes lost only while kube-proxy switches; no stale rule of ours`, async () => {
      const configured = (mode: StandInMode) => (signals.includes('configured') ? mode : undefined);
      await kubeProxy.enter('ipvs');
      writeKubeProxyConfig(configured('ipvs'));
      startController();
      await until('translated', async () => (await probe(pod(), 'tcp', LB, PORT)) === 'svc-web');

      const probes: Array<{ start: number; end: number; answer: string }> = [];
      let probing = true;
      const loop = (async () => {
        while (probing) {
          const start = Date.now();
          const answer = await probe(pod(), 'tcp', LB, PORT, 1000);
          probes.push({ start, end: Date.now(), answer });
        }
      })();
      const readyzSays = (steppedAside: boolean) =>
        until(`stepped aside: ${steppedAside}`, async () => (await readyz())?.kubeProxy?.steppedAside === steppedAside);

      /**
       * The operator changes kube-proxy's ConfigMap, then restarts kube-proxy in `mode`: when
       * that began, when kube-proxy was done, and when readyz said `steppedAside`.
       */
      const switchTo = async (mode: StandInMode, steppedAside: boolean) => {
        const began = Date.now();
        writeKubeProxyConfig(configured(mode));
        await kubeProxy.switchMode(mode, 1000);
        const done = Date.now();
        await readyzSays(steppedAside);
        return { began, done, followed: Date.now() };
      };

      let toNftables = { began: 0, done: 0, followed: 0 };
      let toIpvsAgain = toNftables;
      try {
        await sleep(1000);
        toNftables = await switchTo('nftables', true);
        await until('our tables gone', async () => ourNftTables().length === 0);
        expect(ourIptablesChains(), 'no iptables chains of ours either').to.deep.equal([]);
        await sleep(1500);

        toIpvsAgain = await switchTo('ipvs', false);
        await sleep(1500);
      } finally {
        probing = false;
        await loop;
      }
      const { began: toNft, done: toNftDone, followed: asideAt } = toNftables;
      const { began: toIpvs, done: toIpvsDone, followed: backAt } = toIpvsAgain;

      // Every probe outside a switch (from its start to the controller's change) is answered right.
      const within = (p: { start: number; end: number }, from: number, to: number) => p.end >= from && p.start <= to;
      const expected = (p: { start: number; end: number }) =>
        p.end < toNft
          ? 'svc-web'
          : p.start > asideAt && p.end < toIpvs
            ? ENDPOINT.name
            : p.start > backAt
              ? 'svc-web'
              : undefined;
      const wrong = probes.filter((p) => {
        const want = expected(p);
        return want !== undefined && p.answer !== want;
      });
      const timeline = { toNft, toNftDone, asideAt, toIpvs, toIpvsDone, backAt };
      expect(wrong, `a probe outside the switches went wrong (${JSON.stringify(timeline)})`).to.deep.equal([]);
      expect(
        probes.filter((p) => p.start > asideAt && p.end < toIpvs).length,
        'probed while stepped aside',
      ).to.be.at.least(2);
      expect(probes.filter((p) => p.start > backAt).length, 'probed after the return').to.be.at.least(2);

      // Lost probes, and how far they reach beyond the end of kube-proxy's own switch.
      const lost = probes.filter((p) => p.answer !== 'svc-web' && p.answer !== ENDPOINT.name);
      const beyond = (from: number, to: number, done: number) =>
        Math.max(0, ...lost.filter((p) => within(p, from, to)).map((p) => p.start - done));
      const stats = {
        probes: probes.length,
        lost: lost.length,
        kubeProxySwitchMs: [toNftDone - toNft, toIpvsDone - toIpvs],
        controllerFollowedMs: [asideAt - toNftDone, backAt - toIpvsDone],
        lostStartedAfterSwitchEndMs: [beyond(toNft, asideAt, toNftDone), beyond(toIpvs, backAt, toIpvsDone)],
      };
      console.log(`      switch figures (${signals}): ${JSON.stringify(stats)}`);
      for (const p of lost) {
        expect(
          within(p, toNft, asideAt) || within(p, toIpvs, backAt),
          `lost outside a switch: ${JSON.stringify(p)}`,
        ).to.equal(true);
      }
      // Generous: a lost probe starts at most two poll intervals and a sync after kube-proxy's switch ended.
      for (const ms of stats.lostStartedAfterSwitchEndMs)
        expect(ms, `lost ${ms}ms after kube-proxy's switch`).to.be.below(3000);

      // Back in IPVS mode: exactly our tables, programmed again; no leftover of kube-proxy's nftables mode interferes.
      expect(ourNftTables().filter((t) => t === 'table ip ipvs-node-controller')).to.have.lengthOf(1);
      expect(sh('nft', ['list', 'table', 'ip', 'ipvs-node-controller'])).to.match(/192\.0\.2\.10 \. tcp \. 80/);
      await stopController();
      sh(process.execPath, shippedArgs(['--cleanup']));
      expect(ourNftTables()).to.deep.equal([]);
      expect(ourIptablesChains()).to.deep.equal([]);
      await kubeProxy.leave('ipvs');
    });
});
