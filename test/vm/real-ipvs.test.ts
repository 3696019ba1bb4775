// The controller on a node with real kernel IPVS, as kube-proxy's IPVS mode (v1.33) leaves it, and
// after kube-proxy moved the node to nftables mode: see ipvs-lab.ts for the node and what of kube-
// proxy it follows. Runs in the VM layer's guests (`npm run test:vm`), whose kernels have ip_vs; on a
// kernel without it the test fails and says so (it is never skipped).
//
// For every backend (nft, iptables with kube-proxy's rules in iptables-legacy and in iptables-nft,
// ebpf), on TCP and UDP, IPv4 and IPv6, three Services: svc-a (externalTrafficPolicy Local, its
// endpoint on another node), svc-local (eTP=Local, its endpoint a pod on this node), svc-proxy (its
// ingress ipMode Proxy):
// - before the controller, kube-proxy 1.24+: a pod reaches svc-a's LoadBalancer IP through IPVS
//   and the endpoint sees the pod's address; a node process times out (its source is the LB IP
//   itself, whose reply the endpoint's node keeps); svc-local answers both (the node's connection
//   from the LB IP). Before 1.24 (no real server for svc-a's LB IP): both refused.
// - with the controller (the shipped bundle, against the API stand-in): both answered by the endpoint
//   through the ClusterIP's virtual service (IPVS's connection table shows it), the pod with its own
//   address, the node with its own (masqueraded); the same before 1.24; ipMode Proxy and traffic
//   from outside the node left alone; a deleted Service no longer translated.
// - the controller SIGKILLed (its rules left behind), then kube-proxy in nftables mode (IPVS mode's
//   objects gone, table ip/ip6 kube-proxy written): the pod and the node still reach both
//   LoadBalancer IPs through kube-proxy's own DNAT; the leftovers are inert (or, eBPF, translate to a
//   ClusterIP kube-proxy answers). --cleanup removes them: back in IPVS mode, the "before" returns.
//
// A probe that expects no answer gives up after GIVE_UP_MS. Probes run concurrently, in agents
// started once for the whole file; the controller starts once per backend.
//
// test/run.mjs runs it in network and mount namespaces of its own, with its own /run/netns and
// bpffs (the `vm` suite); started otherwise, it refuses (assertIsolatedNetns).

import { expect } from 'chai';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, rmSync, rmdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { DEFAULT_BPFFS_PATH, EbpfDriver, defaultCgroupPath } from '../../src/backends/ebpf/ebpf-driver.js';
import { atLeast, kernelVersion, runningKernel } from '../../src/backends/ebpf/host-support.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import { checkedFinding, checkedPath, reportText, runCheck } from '../../testbed/check-command.js';
import { eventually } from '../support/eventually.js';
import { scrapeMetrics } from '../support/scrape.js';
import {
  ADDR,
  Agent,
  IpvsLab,
  PORT,
  TARGET_PORT,
  missingIpvs,
  sh,
  type Family,
  type IptablesVariant,
  type KubeProxyScenario,
  type ProbeAnswer,
  type Protocol,
} from './ipvs-lab.js';

/** Generous: in an emulated guest a Node.js process takes seconds to start. */
const STEP_TIMEOUT_MS = 600_000;

/**
 * How long a probe that expects no answer waits for one: the TCP SYN and its first retransmission
 * (after 1 s), or the UDP datagram, unanswered for 3 s. An answered connection takes milliseconds
 * here, also in the guest; a probe that expects an answer waits up to the agent's 15 s.
 */
const GIVE_UP_MS = 3_000;

interface Variant {
  title: string;
  backend: 'nft' | 'iptables' | 'ebpf';
  /** The iptables variant of kube-proxy's (and the kubelet's) rules on this node. */
  kubeProxyIptables: IptablesVariant;
}

// nft and ebpf: kube-proxy on iptables-nft, as on a current node. The iptables backend picks the
// variant the node uses (the kubelet's hint chain): kube-proxy's rules are put in each in turn.
const VARIANTS: Variant[] = [
  { title: 'nft', backend: 'nft', kubeProxyIptables: 'nft' },
  { title: 'iptables (kube-proxy on iptables-legacy)', backend: 'iptables', kubeProxyIptables: 'legacy' },
  { title: 'iptables (kube-proxy on iptables-nft)', backend: 'iptables', kubeProxyIptables: 'nft' },
  { title: 'ebpf', backend: 'ebpf', kubeProxyIptables: 'nft' },
];

const NODE_OBJECT = {
  apiVersion: 'v1',
  kind: 'Node',
  metadata: { name: 'node-1' },
  spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd44:0:0:1::/64'] },
  status: { addresses: [{ type: 'InternalIP', address: ADDR.ipv4.node }] },
};

function dualStackLoadBalancer(
  name: string,
  created: string,
  clusterIps: [string, string],
  protocols: Protocol[],
  ingress: Array<{ ip: string; ipMode?: string }>,
) {
  return {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { name, namespace: 'default', creationTimestamp: created },
    spec: {
      type: 'LoadBalancer',
      externalTrafficPolicy: 'Local',
      ipFamilyPolicy: 'RequireDualStack',
      ipFamilies: ['IPv4', 'IPv6'],
      clusterIP: clusterIps[0],
      clusterIPs: clusterIps,
      ports: protocols.map((p) => ({ name: p, port: PORT, targetPort: TARGET_PORT, protocol: p.toUpperCase() })),
    },
    status: { loadBalancer: { ingress } },
  };
}

const SERVICE_A = dualStackLoadBalancer(
  'svc-a',
  '2024-01-01T00:00:00Z',
  [ADDR.ipv4.clusterIp, ADDR.ipv6.clusterIp],
  ['tcp', 'udp'],
  [{ ip: ADDR.ipv4.lb, ipMode: 'VIP' }, { ip: ADDR.ipv6.lb }],
);
const SERVICE_LOCAL = dualStackLoadBalancer(
  'svc-local',
  '2024-01-01T00:00:01Z',
  [ADDR.ipv4.localClusterIp, ADDR.ipv6.localClusterIp],
  ['tcp', 'udp'],
  [{ ip: ADDR.ipv4.localLb }, { ip: ADDR.ipv6.localLb }],
);
const SERVICE_PROXY = dualStackLoadBalancer(
  'svc-proxy',
  '2024-01-02T00:00:00Z',
  [ADDR.ipv4.proxyClusterIp, ADDR.ipv6.proxyClusterIp],
  ['tcp'],
  [
    { ip: ADDR.ipv4.proxyLb, ipMode: 'Proxy' },
    { ip: ADDR.ipv6.proxyLb, ipMode: 'Proxy' },
  ],
);

/** What each server answers: "<tag> <the client address it sees>". */
const fromEndpoint = (client: string) => `endpoint ${client}`;
const fromLocalEndpoint = (client: string) => `local-endpoint ${client}`;
const fromLoadBalancer = (client: string) => `load-balancer ${client}`;

function bracket(address: string): string {
  return address.includes(':') ? `[${address}]` : address;
}

/** What a probe must see: the answer and, for a connection through IPVS, its virtual service and real server. */
interface Expected {
  answer: string;
  /** [virtual service address, real server address] in `ipvsadm -Lnc`. */
  via?: [string, string];
}

interface Check {
  what: string;
  agent: Agent;
  protocol: Protocol;
  to: string;
  expected: Expected;
}

/** Runs the probes at once; returns one line per probe that saw something else than expected. */
async function mismatches(checks: Check[]): Promise<string[]> {
  const answers: ProbeAnswer[] = await Promise.all(
    checks.map(({ agent, protocol, to, expected }) => {
      const giveUp = expected.answer === 'timeout' ? GIVE_UP_MS : undefined;
      return protocol === 'tcp' ? agent.tcp(to, giveUp) : agent.udp(to, giveUp);
    }),
  );
  const connections = checks.some((c) => c.expected.via) ? sh('ipvsadm', ['-Lnc']).split('\n') : [];
  const out: string[] = [];
  checks.forEach((check, i) => {
    const got = answers[i]!;
    const seen: string[] = [got.answer];
    const wanted: string[] = [check.expected.answer];
    if (!['timeout', 'refused'].includes(check.expected.answer) && !check.expected.answer.startsWith('error:')) {
      // What the client sees of its peer: the address it connected to (a connected UDP socket
      // takes replies from that address only; TCP's getpeername()).
      seen.push(`peer ${(check.protocol === 'udp' ? got.from : got.peer) ?? '-'}`);
      wanted.push(`peer ${bracket(check.to)}:${PORT}`);
    }
    if (check.expected.via) {
      const [virtual, real] = check.expected.via;
      const line = connections.find((l) => got.local && l.includes(` ${got.local} `)) ?? '';
      const [, , , , virtualSeen = '-', realSeen = '-'] = line.trim().split(/\s+/);
      seen.push(`via ${virtualSeen} -> ${realSeen}`);
      wanted.push(`via ${bracket(virtual)}:${PORT} -> ${bracket(real)}:${TARGET_PORT}`);
    }
    if (seen.join(', ') !== wanted.join(', ')) {
      out.push(`${check.what}: saw ${seen.join(', ')}; expected ${wanted.join(', ')}`);
    }
  });
  return out;
}

async function expectChecks(checks: Check[]): Promise<void> {
  expect(await mismatches(checks), 'probes that saw something else').to.deep.equal([]);
}

/** Retries the probes until each sees what it should (the controller works asynchronously). */
async function eventuallyChecks(checks: Check[], tries: number): Promise<void> {
  let last: string[] = [];
  for (let i = 0; i < tries; i++) {
    last = await mismatches(checks);
    if (last.length === 0) return;
    await sleep(250);
  }
  expect(last, `probes that still saw something else after ${tries} rounds`).to.deep.equal([]);
}

describe('controller on real IPVS', function () {
  this.timeout(STEP_TIMEOUT_MS);
  const lab = new IpvsLab();
  let api: ApiStandIn | undefined;
  let dir: string | undefined;
  let kubeconfig: string;
  let cgroupDir: string | undefined;
  let pod: Agent;
  let host: Agent;
  let outside: Agent;
  const agents: Agent[] = [];

  /** The pod's and the node's probes of svc-a and svc-local in `phase`, on both families and protocols. */
  function serviceChecks(phase: 'before' | 'after' | 'nftables mode', scenario: KubeProxyScenario): Check[] {
    const checks: Check[] = [];
    for (const family of ['ipv4', 'ipv6'] as Family[]) {
      const a = ADDR[family];
      for (const protocol of ['tcp', 'udp'] as Protocol[]) {
        const add = (who: 'pod' | 'host', to: string, expected: Expected) =>
          checks.push({
            what: `${who} -> ${to} ${protocol}`,
            agent: who === 'pod' ? pod : host,
            protocol,
            to,
            expected,
          });
        // IPVS's path: before, the LoadBalancer IP's virtual service; after, the ClusterIP's. In
        // nftables mode there is no IPVS: kube-proxy DNATs to the endpoint itself.
        const via = (lb: string, clusterIp: string, real: string): [string, string] | undefined =>
          phase === 'nftables mode' ? undefined : [phase === 'before' ? lb : clusterIp, real];
        const remote = via(a.lb, a.clusterIp, a.endpoint);
        const local = via(a.localLb, a.localClusterIp, a.localEndpoint);
        if (phase === 'before') {
          // 1.24+: pods reach svc-a through IPVS, unmasqueraded; the node's connection, from the LB IP
          // itself, is answered to the LB IP, which node2 keeps. Before 1.24: no real server, refused.
          add('pod', a.lb, scenario === '1.24+' ? { answer: fromEndpoint(a.pod), via: remote } : { answer: 'refused' });
          // Before 1.24 IPVS refuses the node's TCP connection (ICMP port unreachable) and drops its
          // datagram on the way out, which the send sees as EPERM.
          const refusedHost = protocol === 'tcp' ? 'refused' : 'error:EPERM';
          add('host', a.lb, { answer: scenario === '1.24+' ? 'timeout' : refusedHost });
          // svc-local's endpoint is on this node: its reply to the LB IP comes back here.
          add('pod', a.localLb, { answer: fromLocalEndpoint(a.pod), via: local });
          add('host', a.localLb, { answer: fromLocalEndpoint(a.localLb), via: local });
          // The ClusterIP: pods keep their source, the node's (the ClusterIP itself) is masqueraded.
          add('pod', a.clusterIp, { answer: fromEndpoint(a.pod), via: [a.clusterIp, a.endpoint] });
          add('host', a.clusterIp, { answer: fromEndpoint(a.node), via: [a.clusterIp, a.endpoint] });
        } else {
          // The pod keeps its address; the node's traffic is masqueraded to its address toward the
          // endpoint (172.18.0.1 / fd18::1 to node2, 10.244.1.1 / fd44:0:0:1::1 to the local pod).
          add('pod', a.lb, { answer: fromEndpoint(a.pod), via: remote });
          add('host', a.lb, { answer: fromEndpoint(a.node), via: remote });
          add('pod', a.localLb, { answer: fromLocalEndpoint(a.pod), via: local });
          add('host', a.localLb, { answer: fromLocalEndpoint(a.podGateway), via: local });
        }
      }
    }
    return checks;
  }

  before(async function () {
    assertIsolatedNetns();
    const missing = missingIpvs();
    if (missing) {
      throw new Error(
        `this kernel has no usable IPVS (${missing}): run this test in the VM layer's guests (npm run test:vm), ` +
          'whose Debian kernels have ip_vs',
      );
    }
    lab.setUp();
    const root = defaultCgroupPath();
    if (!root) throw new Error('no cgroup2 mount in /proc/mounts: the ebpf backend needs one');
    cgroupDir = join(root, `ipvs-node-controller-vm-${process.pid}`);
    mkdirSync(cgroupDir);
    // The pod and the host process sit in the cgroup the ebpf backend is given (its hooks are per
    // cgroup); for the other backends the cgroup has no program.
    pod = new Agent('pod', lab.pod, cgroupDir);
    host = new Agent('host', undefined, cgroupDir);
    outside = new Agent('outside', lab.outside);
    const endpoint = new Agent('endpoint', lab.endpoint);
    const localEndpoint = new Agent('local endpoint', lab.localEndpoint);
    agents.push(pod, host, outside, endpoint, localEndpoint);
    api = await ApiStandIn.start({ bookmarkIntervalMs: 1000 });
    dir = mkdtempSync(join(tmpdir(), 'real-ipvs-'));
    kubeconfig = join(dir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    for (const object of [NODE_OBJECT, SERVICE_A, SERVICE_LOCAL, SERVICE_PROXY]) api.apply(object);
    await Promise.all(agents.map((a) => a.started()));
    for (const family of ['ipv4', 'ipv6'] as const) {
      const a = ADDR[family];
      const servers: Array<[Agent, string, number, string]> = [
        [endpoint, a.endpoint, TARGET_PORT, 'endpoint'],
        [localEndpoint, a.localEndpoint, TARGET_PORT, 'local-endpoint'],
        [outside, a.proxyLb, PORT, 'load-balancer'],
      ];
      for (const [agent, address, port, tag] of servers) {
        expect(await agent.request('serve', address, port, { tag }), `${tag} on ${address}`).to.include({
          answer: 'listening',
        });
      }
    }
  });

  after(async () => {
    const errors: string[] = [];
    const step = async (what: string, fn: () => unknown) => {
      try {
        await fn();
      } catch (err) {
        errors.push(`${what}: ${(err as Error).message}`);
      }
    };
    await step('stopping the probes', () => Promise.all(agents.splice(0).map((a) => a.stop())));
    await step('stopping the API stand-in', () => api?.stop());
    if (dir) rmSync(dir, { recursive: true, force: true });
    lab.tearDown();
    const cgroup = cgroupDir;
    if (cgroup) await step('removing the cgroup', () => rmdirSync(cgroup));
    expect(errors, 'cleaning up after the test').to.deep.equal([]);
  });

  for (const variant of VARIANTS) describeVariant(variant);

  function describeVariant(variant: Variant): void {
    describe(`--backend=${variant.title}`, () => {
      let controller: ChildProcess | undefined;
      let output = '';
      let cleanedUp = false;
      const v4 = ADDR.ipv4;
      const v6 = ADDR.ipv6;

      function backendArgs(): string[] {
        return [`--backend=${variant.backend}`, ...(variant.backend === 'ebpf' ? ['--cgroup-path', cgroupDir!] : [])];
      }

      /** `more`: extra flags. `inCgroup`: started in the cgroup the eBPF backend hooks, as a DaemonSet's container is under the root. */
      function startController(more: string[] = [], inCgroup = false): void {
        output = '';
        cleanedUp = false;
        const argv = shippedArgs([
          ...backendArgs(),
          ...['--kubeconfig', kubeconfig, '--node-name', 'node-1'],
          ...['--min-sync-period', '0', '--sync-period', '10s'],
          ...more,
        ]);
        controller =
          inCgroup && cgroupDir
            ? spawn('sh', ['-c', 'echo $$ > "$0/cgroup.procs" && exec "$@"', cgroupDir, process.execPath, ...argv], {
                stdio: ['ignore', 'pipe', 'pipe'],
              })
            : spawn(process.execPath, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
        controller.stdout!.on('data', (d: Buffer) => (output += d.toString()));
        controller.stderr!.on('data', (d: Buffer) => (output += d.toString()));
      }

      /** SIGKILL: the controller ends without a chance to touch its rules (a crash, a deleted DaemonSet). */
      async function killController(): Promise<NodeJS.Signals | number | null> {
        const child = controller;
        controller = undefined;
        if (!child || child.exitCode !== null || child.signalCode !== null) return child?.exitCode ?? null;
        const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
        child.kill('SIGKILL');
        const [code, signal] = await exited;
        return signal ?? code;
      }

      function cleanup(): void {
        sh(process.execPath, shippedArgs(['--cleanup', ...backendArgs()]));
        cleanedUp = true;
      }

      /** The controller's objects on the node, as --cleanup would find them. */
      function leftovers(): boolean {
        switch (variant.backend) {
          case 'nft':
            return sh('nft', ['list', 'tables']).includes('ipvs-node-controller');
          case 'iptables':
            return sh(`iptables-${variant.kubeProxyIptables}`, ['-w', '-t', 'nat', '-S']).includes('IPVS_OUTPUT');
          case 'ebpf':
            return existsSync(DEFAULT_BPFFS_PATH);
        }
      }

      /**
       * Waits until a pod's TCP connection to `lb` goes through the virtual service `virtual` (IPVS's
       * connection table): the controller has programmed (the ClusterIP) or removed (the LB IP) its
       * translation. Waits on the path only; what the endpoint answers is asserted afterwards.
       */
      async function waitForPodPath(lb: string, virtual: string, what: string): Promise<void> {
        let last = '';
        for (let i = 0; i < 400; i++) {
          const tcp = await pod.tcp(lb);
          const line = sh('ipvsadm', ['-Lnc'])
            .split('\n')
            .find((l) => tcp.local && l.includes(` ${tcp.local} `));
          last = `${tcp.answer} via ${line?.trim().split(/\s+/)[4] ?? '-'}`;
          if (last.endsWith(` via ${bracket(virtual)}:${PORT}`)) return;
          await sleep(250);
        }
        expect.fail(`${what}: pod -> ${lb} never went through ${virtual}; last: ${last}`);
      }

      before(() => {
        lab.resetNode();
        lab.ipvsMode(variant.kubeProxyIptables, '1.24+');
      });

      after(async () => {
        // Every step is tried, so that the next backend starts from an empty node whatever failed here.
        const errors: string[] = [];
        const step = async (what: string, fn: () => unknown) => {
          try {
            await fn();
          } catch (err) {
            errors.push(`${what}: ${(err as Error).message}`);
          }
        };
        await step('stopping the controller', killController);
        if (!cleanedUp) await step('--cleanup', cleanup);
        await step('resetting the node', () => lab.resetNode());
        expect(errors, 'cleaning up after the backend').to.deep.equal([]);
      });

      afterEach(function () {
        if (this.currentTest?.state === 'failed') {
          console.log(`controller output:\n${output}`);
          console.log(`ipvsadm -Ln:\n${sh('ipvsadm', ['-Ln'])}`);
        }
      });

      it('before the controller, kube-proxy 1.24+: pods are answered with their own address, the node times out', async () => {
        await expectChecks(serviceChecks('before', '1.24+'));
      });

      it('before the controller, kube-proxy before 1.24: pods and the node are refused', async () => {
        lab.setScenario('before 1.24');
        try {
          await expectChecks(serviceChecks('before', 'before 1.24'));
        } finally {
          lab.setScenario('1.24+');
        }
      });

      it('with the controller, kube-proxy 1.24+: both answered through the ClusterIP, the pod keeps its address, the node is masqueraded', async () => {
        startController();
        for (const a of [v4, v6]) await waitForPodPath(a.lb, a.clusterIp, 'after the start');
        await eventuallyChecks(serviceChecks('after', '1.24+'), 20);
      });

      it('with the controller, kube-proxy before 1.24: the same', async () => {
        lab.setScenario('before 1.24');
        try {
          await expectChecks(serviceChecks('after', 'before 1.24'));
        } finally {
          lab.setScenario('1.24+');
        }
      });

      it("check from the node: svc-a's paths answered and translated; kube-proxy's masquerade gone, and no real server, broken with their causes", async () => {
        // Against the running controller (its /status on the default health address), from the
        // cgroup the eBPF backend hooks, as the DaemonSet's container would run it.
        const check = (...more: string[]) =>
          runCheck(
            ['--kubeconfig', kubeconfig, '--node-name', 'node-1', '--service=default/svc-a', ...more],
            cgroupDir,
          );
        const working = await check();
        expect(working.code, working.stderr + reportText(working.report)).to.equal(0);
        expect(working.report.controller.kind).to.equal('running');
        for (const a of [v4, v6]) {
          for (const protocol of ['TCP', 'UDP']) {
            const p = checkedPath(working.report, a.lb, protocol, PORT);
            expect(p, `${a.lb} ${protocol}`).to.include({ ok: true, outcome: 'answered' });
            // IPVS's real server answers: the reply tuple's source is the endpoint on node2.
            expect(p.conntrack.reply.src, `${a.lb} ${protocol}`).to.equal(a.endpoint);
          }
        }
        const variantTool = (family: 'ipv4' | 'ipv6') =>
          `${family === 'ipv6' ? 'ip6tables' : 'iptables'}-${variant.kubeProxyIptables}`;
        const masquerade = sh(variantTool('ipv4'), ['-w', '-t', 'nat', '-S', 'KUBE-POSTROUTING'])
          .split('\n')
          .find((l) => l.includes('-j MASQUERADE') && !l.includes('--match-set'))!;
        sh(
          `${variantTool('ipv4')}-restore`,
          ['--noflush', '-w'],
          `*nat\n${masquerade.replace('-A ', '-D ')}\nCOMMIT\n`,
        );
        try {
          const broken = await check('--timeout=1s');
          expect(broken.code, reportText(broken.report)).to.equal(1);
          expect(checkedFinding(broken.report, 'masquerade', 'ipv4')).to.include({ ok: false });
          expect(checkedFinding(broken.report, 'masquerade', 'ipv6')).to.include({ ok: true });
          // The reply goes to the LoadBalancer IP on node2, which keeps it: the connect times out.
          const p = checkedPath(broken.report, v4.lb, 'TCP', PORT);
          expect(p, reportText(broken.report)).to.include({ ok: false, outcome: 'timed out' });
          expect(p.detail).to.match(/kube-proxy does not masquerade/);
        } finally {
          sh(`${variantTool('ipv4')}-restore`, ['--noflush', '-w'], `*nat\n${masquerade}\nCOMMIT\n`);
        }
        // kube-proxy's syncEndpoint with no endpoint left: the ClusterIP's virtual service has no real server.
        const real = `-t ${v4.clusterIp}:${PORT} -r ${v4.endpoint}:${TARGET_PORT}`;
        sh('ipvsadm', ['-R'], `-d ${real}\n`);
        try {
          const none = await check('--timeout=1s');
          expect(none.code, reportText(none.report)).to.equal(1);
          const p = checkedPath(none.report, v4.lb, 'TCP', PORT);
          expect(p, reportText(none.report)).to.include({ ok: false });
          expect(p.detail).to.match(/no endpoints: IPVS's virtual service 10\.96\.0\.10:80\/TCP has no real server/);
          expect(checkedPath(none.report, v6.lb, 'TCP', PORT)).to.include({ ok: true });
        } finally {
          sh('ipvsadm', ['-R'], `-a ${real} -m -w 1\n`);
        }
      });

      it("the continuous probe from the node: svc-a answered through IPVS's real server; without it, failing on the probe's metrics", async () => {
        await killController();
        startController(['--probe-service=default/svc-a', '--probe-interval=5s', '--probe-timeout=1s'], true);
        try {
          const success = async () => {
            const e = await scrapeMetrics('http://127.0.0.1:9477');
            return {
              e,
              ok: e.value('ipvs_node_controller_probe_success', { service: 'default/svc-a', origin: 'flag' }),
            };
          };
          const working = await eventually(
            'the probe of svc-a answering',
            async () => (await success()).ok === 1 && (await success()).e,
            60_000,
          );
          // TCP and UDP over both families: four paths a round, every one answered.
          expect(
            working.sum('ipvs_node_controller_probes_total', { service: 'default/svc-a', outcome: 'answered' }),
          ).to.be.at.least(4);
          const real = `-t ${v4.clusterIp}:${PORT} -r ${v4.endpoint}:${TARGET_PORT}`;
          sh('ipvsadm', ['-R'], `-d ${real}\n`);
          try {
            const failing = await eventually(
              'the probe of svc-a failing',
              async () => (await success()).ok === 0 && (await success()).e,
              60_000,
            );
            expect(
              failing.sum('ipvs_node_controller_probes_total', { service: 'default/svc-a', outcome: 'answered' }),
            ).to.be.above(0);
            expect(output).to.match(/"msg":"Probe failing"/);
          } finally {
            sh('ipvsadm', ['-R'], `-a ${real} -m -w 1\n`);
          }
          await eventually('the probe of svc-a answering again', async () => (await success()).ok === 1, 60_000);
        } finally {
          await killController();
          startController();
          for (const a of [v4, v6]) await waitForPodPath(a.lb, a.clusterIp, 'after the restart without the probe');
        }
      });

      if (variant.backend === 'ebpf') {
        it("counts each translation by family and source, read from the programs' pinned counters", async () => {
          const counts = async () =>
            Object.fromEntries(
              (
                await new EbpfDriver({ cgroupPath: cgroupDir!, bpffsPath: DEFAULT_BPFFS_PATH }).translatedConnections()
              ).map((r) => [`${r.family} ${r.source}`, r.connections]),
            );
          const before = await counts();
          const answers = [
            await pod.tcp(v4.lb),
            await pod.tcp(v4.lb),
            await pod.udp(v4.lb), // a connected UDP socket: its connect() counts
            await host.tcp(v4.lb),
            await pod.tcp(v6.lb),
            await host.udp(v6.lb),
          ];
          expect(answers.map((a) => a.answer.split(' ')[0])).to.deep.equal(Array(6).fill('endpoint'));
          // Not translated: an ipMode Proxy ingress, a client outside the cgroup.
          expect((await pod.tcp(v4.proxyLb)).answer).to.equal(fromLoadBalancer(v4.pod));
          expect((await outside.tcp(v4.localLb)).answer).to.equal(fromLocalEndpoint(v4.outside));
          const after = await counts();
          const moved = Object.fromEntries(Object.keys(after).map((k) => [k, after[k]! - (before[k] ?? 0)]));
          // The node is the controller's network namespace (this test's); before Linux 5.14 the
          // kernel cannot tell it, and the node is the initial namespace: the host agent counts as a pod.
          const told = atLeast(kernelVersion(runningKernel()) ?? [0, 0], [5, 14]);
          expect(moved).to.deep.equal(
            told
              ? { 'ipv4 pods': 3, 'ipv4 node': 1, 'ipv6 pods': 1, 'ipv6 node': 1 }
              : { 'ipv4 pods': 4, 'ipv4 node': 0, 'ipv6 pods': 2, 'ipv6 node': 0 },
          );
        });
      }

      it('leaves an ipMode Proxy ingress and traffic from outside the node alone', async () => {
        const checks: Check[] = [];
        for (const a of [v4, v6]) {
          // ipMode Proxy: the connection goes out to the load balancer, which sees the pod's own
          // address and the node's outgoing one (routed, neither translated nor masqueraded).
          checks.push({
            what: `pod -> ${a.proxyLb}`,
            agent: pod,
            protocol: 'tcp',
            to: a.proxyLb,
            expected: { answer: fromLoadBalancer(a.pod) },
          });
          checks.push({
            what: `host -> ${a.proxyLb}`,
            agent: host,
            protocol: 'tcp',
            to: a.proxyLb,
            expected: { answer: fromLoadBalancer(a.outsideGateway) },
          });
          for (const protocol of ['tcp', 'udp'] as Protocol[]) {
            // Outside -> svc-a: IPVS forwards to node2's endpoint with the client's address, whose
            // reply leaves by node2's own way (here: none): lost, as without the controller.
            checks.push({
              what: `outside -> ${a.lb} ${protocol}`,
              agent: outside,
              protocol,
              to: a.lb,
              expected: { answer: 'timeout' },
            });
            // Outside -> svc-local: the local endpoint, through the LB IP's virtual service, source kept.
            checks.push({
              what: `outside -> ${a.localLb} ${protocol}`,
              agent: outside,
              protocol,
              to: a.localLb,
              expected: { answer: fromLocalEndpoint(a.outside), via: [a.localLb, a.localEndpoint] },
            });
          }
        }
        await expectChecks(checks);
        // Before 1.24 the outside client is refused by the LB IP's empty virtual service (translated
        // to the ClusterIP, it would be forwarded to the endpoint instead).
        lab.setScenario('before 1.24');
        try {
          await expectChecks(
            [v4, v6].flatMap((a) =>
              (['tcp', 'udp'] as Protocol[]).map((protocol) => ({
                what: `outside -> ${a.lb} ${protocol} (before 1.24)`,
                agent: outside,
                protocol,
                to: a.lb,
                expected: { answer: 'refused' },
              })),
            ),
          );
        } finally {
          lab.setScenario('1.24+');
        }
      });

      it('stops translating a deleted Service, and translates it again when it returns', async () => {
        expect(api!.remove('Service', 'default', 'svc-a')).to.equal(true);
        for (const a of [v4, v6]) await waitForPodPath(a.lb, a.lb, 'after the delete');
        // svc-a untranslated again: the pod through the LB IP's virtual service, the node timing out.
        await expectChecks(serviceChecks('before', '1.24+').filter((c) => c.to === v4.lb || c.to === v6.lb));
        api!.apply(SERVICE_A);
        for (const a of [v4, v6]) await waitForPodPath(a.lb, a.clusterIp, 'after the re-creation');
        await expectChecks(serviceChecks('after', '1.24+').filter((c) => c.to === v4.lb || c.to === v6.lb));
      });

      it('SIGKILLed, then kube-proxy moves the node to nftables mode: the leftovers are inert, pod and node reach the LoadBalancer IPs through kube-proxy', async () => {
        expect(await killController(), 'the controller was running').to.equal('SIGKILL');
        expect(leftovers(), 'the rules stay after SIGKILL').to.equal(true);
        // Still in IPVS mode, the rules left behind translate as before.
        await waitForPodPath(v4.lb, v4.clusterIp, 'after SIGKILL');
        await expectChecks(serviceChecks('after', '1.24+').filter((c) => c.to === v4.lb && c.agent === host));
        const failed = lab.nftablesMode(variant.kubeProxyIptables);
        if (failed.length > 0)
          console.log(`      kube-proxy's IPVS clean-up, failed steps:\n        ${failed.join('\n        ')}`);
        expect(sh('ipvsadm', ['-Sn']).trim(), 'IPVS mode is gone').to.equal('');
        expect(leftovers(), 'the rules are still there').to.equal(true);
        await expectChecks(serviceChecks('nftables mode', '1.24+'));
      });

      it('--cleanup removes the leftovers: back in IPVS mode, the node times out again and pods keep going through IPVS', async () => {
        cleanup();
        expect(leftovers(), 'nothing of the controller left').to.equal(false);
        lab.ipvsMode(variant.kubeProxyIptables, '1.24+');
        await expectChecks(serviceChecks('before', '1.24+'));
      });
    });
  }
});
