// The controller on a node with real kernel IPVS, as kube-proxy's IPVS mode (v1.31) leaves it:
// see ipvs-lab.ts for the node. Runs in the VM layer's guests (`npm run test:vm`), whose kernels
// have ip_vs; on a kernel without it the test fails and says so (it is never skipped).
//
// For every backend: before the controller, a pod and a host process are refused on the
// LoadBalancer IP (IPVS's virtual service without a real server answers with ICMP port
// unreachable) and answered on the ClusterIP; with the controller (the shipped bundle, against the
// API stand-in), both are answered by the endpoint on another node THROUGH IPVS (its connection
// table shows the connection to the ClusterIP and its real server), over TCP and UDP, IPv4 and
// IPv6; an ipMode Proxy ingress and traffic from outside the node are left alone; a deleted
// Service is no longer translated; --cleanup brings the refusal back.
//
// test/run.mjs runs it in network and mount namespaces of its own, with its own /run/netns and
// bpffs (the `vm` suite); started otherwise, it refuses (assertIsolatedNetns).

import { expect } from 'chai';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdirSync, mkdtempSync, rmSync, rmdirSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

import { defaultCgroupPath } from '../../src/backends/ebpf/ebpf-driver.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import { ADDR, Agent, IpvsLab, PORT, TARGET_PORT, missingIpvs, sh, type IptablesVariant } from './ipvs-lab.js';

/** Generous: in an emulated guest a Node.js process takes seconds to start. */
const STEP_TIMEOUT_MS = 600_000;

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

const SERVICE_A = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: { name: 'svc-a', namespace: 'default', creationTimestamp: '2024-01-01T00:00:00Z' },
  spec: {
    type: 'LoadBalancer',
    externalTrafficPolicy: 'Local',
    ipFamilyPolicy: 'RequireDualStack',
    ipFamilies: ['IPv4', 'IPv6'],
    clusterIP: ADDR.ipv4.clusterIp,
    clusterIPs: [ADDR.ipv4.clusterIp, ADDR.ipv6.clusterIp],
    ports: [
      { name: 'tcp', port: PORT, targetPort: TARGET_PORT, protocol: 'TCP' },
      { name: 'udp', port: PORT, targetPort: TARGET_PORT, protocol: 'UDP' },
    ],
  },
  status: { loadBalancer: { ingress: [{ ip: ADDR.ipv4.lb, ipMode: 'VIP' }, { ip: ADDR.ipv6.lb }] } },
};

const SERVICE_PROXY = {
  apiVersion: 'v1',
  kind: 'Service',
  metadata: { name: 'svc-proxy', namespace: 'default', creationTimestamp: '2024-01-02T00:00:00Z' },
  spec: {
    type: 'LoadBalancer',
    externalTrafficPolicy: 'Local',
    ipFamilyPolicy: 'RequireDualStack',
    ipFamilies: ['IPv4', 'IPv6'],
    clusterIP: ADDR.ipv4.proxyClusterIp,
    clusterIPs: [ADDR.ipv4.proxyClusterIp, ADDR.ipv6.proxyClusterIp],
    ports: [{ name: 'tcp', port: PORT, targetPort: TARGET_PORT, protocol: 'TCP' }],
  },
  status: {
    loadBalancer: {
      ingress: [
        { ip: ADDR.ipv4.proxyLb, ipMode: 'Proxy' },
        { ip: ADDR.ipv6.proxyLb, ipMode: 'Proxy' },
      ],
    },
  },
};

/** What the endpoint answers with: "endpoint <the client address it sees>". */
const fromEndpoint = (client: string) => `endpoint ${client}`;
const fromLoadBalancer = (client: string) => `load-balancer ${client}`;

function bracket(address: string): string {
  return address.includes(':') ? `[${address}]` : address;
}

/** Retries `check` until it returns `expected` (the controller works asynchronously). */
async function eventually(check: () => Promise<string>, expected: string, what: string): Promise<void> {
  let last = '';
  for (let i = 0; i < 400; i++) {
    last = await check();
    if (last === expected) return;
    await sleep(250);
  }
  expect.fail(`${what}: expected '${expected}', last answer '${last}'`);
}

for (const variant of VARIANTS) describeVariant(variant);

function describeVariant(variant: Variant): void {
  describe(`controller on real IPVS, --backend=${variant.title}`, function () {
    this.timeout(STEP_TIMEOUT_MS);
    const lab = new IpvsLab();
    let api: ApiStandIn | undefined;
    let dir: string;
    let kubeconfig: string;
    let controller: ChildProcess | undefined;
    let output = '';
    let cgroupDir: string | undefined;
    let pod: Agent;
    let host: Agent;
    let outside: Agent;
    let endpoint: Agent;
    const agents: Agent[] = [];
    const v4 = ADDR.ipv4;
    const v6 = ADDR.ipv6;
    const ebpf = variant.backend === 'ebpf';
    /** What the endpoint sees of a pod's translated connection (see the ebpf case below). */
    const podSeenAs = (family: 'ipv4' | 'ipv6') => (ebpf ? ADDR[family].pod : ADDR[family].node);

    function backendArgs(): string[] {
      return [`--backend=${variant.backend}`, ...(cgroupDir ? ['--cgroup-path', cgroupDir] : [])];
    }

    function startController(): void {
      output = '';
      controller = spawn(
        process.execPath,
        shippedArgs([
          ...backendArgs(),
          ...['--kubeconfig', kubeconfig, '--node-name', 'node-1'],
          ...['--min-sync-period', '0', '--sync-period', '10s'],
        ]),
        { stdio: ['ignore', 'pipe', 'pipe'] },
      );
      controller.stdout!.on('data', (d: Buffer) => (output += d.toString()));
      controller.stderr!.on('data', (d: Buffer) => (output += d.toString()));
    }

    async function stopController(): Promise<number | string | null> {
      const child = controller;
      controller = undefined;
      if (!child || child.exitCode !== null) return child?.exitCode ?? null;
      const exited = once(child, 'exit') as Promise<[number | null, NodeJS.Signals | null]>;
      child.kill('SIGTERM');
      const [code, signal] = await exited;
      return code ?? signal;
    }

    /** `ipvsadm -Lnc`: the line of a connection from `client` to `virtual`, or ''. */
    function ipvsConnection(client: string, virtual: string): string {
      return (
        sh('ipvsadm', ['-Lnc'])
          .split('\n')
          .find((l) => l.includes(` ${client} `) && l.includes(` ${virtual} `)) ?? ''
      );
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
      lab.setUp(variant.kubeProxyIptables);
      if (ebpf) {
        const root = defaultCgroupPath();
        if (!root) throw new Error('no cgroup2 mount in /proc/mounts: the ebpf backend needs one');
        cgroupDir = join(root, `ipvs-node-controller-vm-${process.pid}`);
        mkdirSync(cgroupDir);
      }
      // The pod and the host process: in the controller's cgroup for ebpf (its hooks are per cgroup).
      pod = new Agent('pod', lab.pod, cgroupDir);
      host = new Agent('host', undefined, cgroupDir);
      outside = new Agent('outside', lab.outside);
      endpoint = new Agent('endpoint', lab.remote);
      agents.push(pod, host, outside, endpoint);
      api = await ApiStandIn.start({ bookmarkIntervalMs: 1000 });
      dir = mkdtempSync(join(tmpdir(), 'real-ipvs-'));
      kubeconfig = join(dir, 'kubeconfig');
      await api.writeKubeconfig(kubeconfig);
      api.apply(NODE_OBJECT);
      api.apply(SERVICE_A);
      api.apply(SERVICE_PROXY);
      await Promise.all(agents.map((a) => a.started()));
      for (const family of ['ipv4', 'ipv6'] as const) {
        expect(await endpoint.request('serve', ADDR[family].endpoint, TARGET_PORT, 'endpoint')).to.include({
          answer: 'listening',
        });
        expect(await outside.request('serve', ADDR[family].proxyLb, PORT, 'load-balancer')).to.include({
          answer: 'listening',
        });
      }
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
      await step('stopping the controller', stopController);
      if (api) await step('--cleanup', () => sh(process.execPath, shippedArgs(['--cleanup', ...backendArgs()])));
      await step('stopping the probes', () => Promise.all(agents.splice(0).map((a) => a.stop())));
      await step('stopping the API stand-in', () => api?.stop());
      if (dir) rmSync(dir, { recursive: true, force: true });
      lab.tearDown();
      await step('nft flush ruleset', () => sh('nft', ['flush', 'ruleset']));
      const cgroup = cgroupDir;
      if (cgroup) await step('removing the cgroup', () => rmdirSync(cgroup));
      expect(errors, 'cleaning up after the test').to.deep.equal([]);
    });

    afterEach(function () {
      if (this.currentTest?.state === 'failed') {
        console.log(`controller output:\n${output}`);
        console.log(`ipvsadm -Ln:\n${sh('ipvsadm', ['-Ln'])}`);
      }
    });

    it('without the controller: refused on the LoadBalancer IP, answered on the ClusterIP (pod and host)', async () => {
      for (const family of ['ipv4', 'ipv6'] as const) {
        const a = ADDR[family];
        expect((await pod.tcp(a.lb)).answer, `pod -> ${a.lb} tcp`).to.equal('refused');
        expect((await host.tcp(a.lb)).answer, `host -> ${a.lb} tcp`).to.equal('refused');
        expect((await pod.udp(a.lb)).answer, `pod -> ${a.lb} udp`).to.equal('refused');
        // Pods are not masqueraded on their way to a ClusterIP (their source is in the cluster
        // CIDR); a host process's source is the ClusterIP itself, which kube-proxy masquerades.
        expect((await pod.tcp(a.clusterIp)).answer, `pod -> ${a.clusterIp}`).to.equal(fromEndpoint(a.pod));
        expect((await host.tcp(a.clusterIp)).answer, `host -> ${a.clusterIp}`).to.equal(fromEndpoint(a.node));
        expect((await pod.udp(a.clusterIp)).answer, `pod -> ${a.clusterIp} udp`).to.equal(fromEndpoint(a.pod));
      }
    });

    it('with the controller: a pod reaches the endpoint through IPVS on the LoadBalancer IP, TCP and UDP, IPv4 and IPv6', async () => {
      startController();
      await eventually(async () => (await pod.tcp(v4.lb)).answer, fromEndpoint(podSeenAs('ipv4')), 'pod -> LB IP');
      for (const family of ['ipv4', 'ipv6'] as const) {
        const a = ADDR[family];
        // nft / iptables: our mark makes kube-proxy's KUBE-POSTROUTING masquerade the connection, so
        // the endpoint sees the node's address. ebpf translates the socket's connect(): the
        // connection is an ordinary pod -> ClusterIP one, which kube-proxy does not masquerade, so
        // the endpoint sees the pod's own address.
        const seen = podSeenAs(family);
        await eventually(async () => (await pod.tcp(a.lb)).answer, fromEndpoint(seen), `pod -> ${a.lb} tcp`);
        const tcp = await pod.tcp(a.lb);
        expect(tcp.answer).to.equal(fromEndpoint(seen));
        expect(
          ipvsConnection(tcp.local!, `${bracket(a.clusterIp)}:${PORT}`),
          `ipvsadm -Lnc: ${tcp.local} -> ClusterIP`,
        ).to.include(`${bracket(a.endpoint)}:${TARGET_PORT}`);
        // A connected UDP socket only takes replies from the address it sent to: the reply comes from the LB IP.
        const udp = await pod.udp(a.lb);
        expect(udp.answer, `pod -> ${a.lb} udp`).to.equal(fromEndpoint(seen));
        expect(udp.from).to.equal(`${bracket(a.lb)}:${PORT}`);
        expect(
          ipvsConnection(udp.local!, `${bracket(a.clusterIp)}:${PORT}`),
          `ipvsadm -Lnc: ${udp.local} -> ClusterIP (udp)`,
        ).to.include(`${bracket(a.endpoint)}:${TARGET_PORT}`);
      }
    });

    it('with the controller: a host process reaches the endpoint through IPVS on the LoadBalancer IP', async () => {
      for (const family of ['ipv4', 'ipv6'] as const) {
        const a = ADDR[family];
        // Whatever the backend, the host's connection is masqueraded: by our mark (nft, iptables) or,
        // the source being the ClusterIP itself (ebpf), by kube-proxy's KUBE-CLUSTER-IP rule.
        await eventually(async () => (await host.tcp(a.lb)).answer, fromEndpoint(a.node), `host -> ${a.lb} tcp`);
        const tcp = await host.tcp(a.lb);
        expect(tcp.answer).to.equal(fromEndpoint(a.node));
        expect(tcp.peer, 'the peer the host process sees').to.equal(`${bracket(a.lb)}:${PORT}`);
        expect(ipvsConnection(tcp.local!, `${bracket(a.clusterIp)}:${PORT}`), `ipvsadm -Lnc: ${tcp.local}`).to.include(
          `${bracket(a.endpoint)}:${TARGET_PORT}`,
        );
        const udp = await host.udp(a.lb);
        expect(udp.answer, `host -> ${a.lb} udp`).to.equal(fromEndpoint(a.node));
        expect(udp.from).to.equal(`${bracket(a.lb)}:${PORT}`);
      }
    });

    it('leaves an ipMode Proxy ingress and traffic from outside the node alone', async () => {
      for (const family of ['ipv4', 'ipv6'] as const) {
        const a = ADDR[family];
        // ipMode Proxy: the connection goes out to the load balancer, which sees the pod's own
        // address (routed, neither translated nor masqueraded).
        expect((await pod.tcp(a.proxyLb)).answer, `pod -> ${a.proxyLb}`).to.equal(fromLoadBalancer(a.pod));
        expect((await outside.tcp(a.lb)).answer, `outside -> ${a.lb} tcp`).to.equal('refused');
        expect((await outside.udp(a.lb)).answer, `outside -> ${a.lb} udp`).to.equal('refused');
      }
    });

    it('stops translating a deleted Service, and translates it again when it returns', async () => {
      expect(api!.remove('Service', 'default', 'svc-a')).to.equal(true);
      for (const family of ['ipv4', 'ipv6'] as const) {
        const a = ADDR[family];
        await eventually(async () => (await pod.tcp(a.lb)).answer, 'refused', `pod -> ${a.lb} after the delete`);
        expect((await host.tcp(a.lb)).answer, `host -> ${a.lb} after the delete`).to.equal('refused');
      }
      api!.apply(SERVICE_A);
      await eventually(async () => (await pod.tcp(v6.lb)).answer, fromEndpoint(podSeenAs('ipv6')), 'after re-creation');
    });

    it('--cleanup brings the refusal back', async () => {
      expect(await stopController(), 'SIGTERM exits 0').to.equal(0);
      expect((await pod.tcp(v4.lb)).answer, 'SIGTERM leaves the rules').to.equal(fromEndpoint(podSeenAs('ipv4')));
      sh(process.execPath, shippedArgs(['--cleanup', ...backendArgs()]));
      for (const family of ['ipv4', 'ipv6'] as const) {
        const a = ADDR[family];
        expect((await pod.tcp(a.lb)).answer, `pod -> ${a.lb} after --cleanup`).to.equal('refused');
        expect((await host.tcp(a.lb)).answer, `host -> ${a.lb} after --cleanup`).to.equal('refused');
        expect((await pod.tcp(a.clusterIp)).answer, 'ClusterIP still answered').to.equal(fromEndpoint(a.pod));
      }
    });
  });
}
