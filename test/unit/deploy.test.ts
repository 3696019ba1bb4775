// The manifests of deploy/ as kustomize (built into kubectl) renders them: schema-valid against
// the Kubernetes OpenAPI models, least-privilege RBAC, a DaemonSet that runs the flags the CLI
// accepts with what each backend needs and nothing more, and the monitoring examples.

import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import YAML from 'yaml';
import { DaemonSet } from 'kubernetes-models/apps/v1';
import { ConfigMap, ServiceAccount, Service } from 'kubernetes-models/v1';
import { ClusterRole, ClusterRoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import {
  PodMonitor,
  PrometheusRule,
  ServiceMonitor,
} from '@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1';
import { parseConfig, type Config } from '../../src/config/options.js';

const run = promisify(execFile);
const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const deploy = join(repoRoot, 'deploy');

type Json = Record<string, any>;

async function kustomize(dir: string): Promise<Json[]> {
  const { stdout } = await run('kubectl', ['kustomize', dir], { maxBuffer: 16 * 1024 * 1024 });
  return YAML.parseAllDocuments(stdout).map((d) => d.toJSON() as Json);
}

/**
 * An overlay of a user's own, outside the repository, as the components' comments show:
 * overlays/`overlay` with components/`component`, rendered, every object schema-valid.
 */
async function kustomizeWithComponent(overlay: string, component: string): Promise<Json[]> {
  const dir = await mkdtemp(join(tmpdir(), `overlay-${component}-`));
  try {
    await writeFile(
      join(dir, 'kustomization.yaml'),
      YAML.stringify({
        apiVersion: 'kustomize.config.k8s.io/v1beta1',
        kind: 'Kustomization',
        resources: [relative(dir, join(deploy, 'overlays', overlay))],
        components: [relative(dir, join(deploy, 'components', component))],
      }),
    );
    const objects = await kustomize(dir);
    validateSchemas(objects);
    return objects;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const MODELS: Record<string, new (data: any) => { validate(): void }> = {
  'v1/ServiceAccount': ServiceAccount,
  'v1/Service': Service,
  'v1/ConfigMap': ConfigMap,
  'apps/v1/DaemonSet': DaemonSet,
  'rbac.authorization.k8s.io/v1/ClusterRole': ClusterRole,
  'rbac.authorization.k8s.io/v1/ClusterRoleBinding': ClusterRoleBinding,
  'monitoring.coreos.com/v1/PodMonitor': PodMonitor,
  'monitoring.coreos.com/v1/ServiceMonitor': ServiceMonitor,
  'monitoring.coreos.com/v1/PrometheusRule': PrometheusRule,
};

/** Validates every object against its OpenAPI schema; throws with the object's name on failure. */
function validateSchemas(objects: Json[]): void {
  for (const o of objects) {
    const Model = MODELS[`${o.apiVersion}/${o.kind}`];
    if (!Model) expect.fail(`unexpected kind ${o.apiVersion}/${o.kind}`);
    expect(o.metadata?.name, `${o.kind} without a name`).to.be.a('string').and.not.equal('');
    try {
      new Model(o).validate();
    } catch (err) {
      throw new Error(`${o.kind}/${o.metadata.name}: ${(err as Error).message}`);
    }
  }
}

function only(objects: Json[], kind: string, name?: string): Json {
  const found = objects.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
  expect(found, `expected one ${kind}${name ? ` ${name}` : ''}, found ${found.length}`).to.have.lengthOf(1);
  return found[0]!;
}

function container(ds: Json): Json {
  expect(ds.spec.template.spec.containers.length).to.equal(1);
  return ds.spec.template.spec.containers[0];
}

/** The node's address the downward API gives (status.hostIP), in these tests. */
const HOST_IP = '192.0.2.7';

/** The container's flags as the CLI parses them, with the DaemonSet's NODE_NAME, $(VAR) expanded as the kubelet does. */
function configOf(ds: Json): Config {
  const c = container(ds);
  expect(c.command, 'the image entrypoint runs the CLI').to.deep.equal(undefined);
  const downward: Record<string, string> = { 'spec.nodeName': 'node-from-downward-api', 'status.hostIP': HOST_IP };
  const env: Record<string, string> = {};
  for (const e of c.env as Json[]) {
    const value = e.value ?? downward[e.valueFrom?.fieldRef?.fieldPath as string];
    expect(value, `env ${e.name} resolves`).to.be.a('string');
    env[e.name as string] = value as string;
  }
  const args = (c.args as string[]).map((a) =>
    a.replace(/\$\(([A-Z_]+)\)/g, (_m, name: string) => env[name] ?? `$(${name})`),
  );
  return parseConfig(args, env);
}

function portNamed(ds: Json, name: string): number {
  const port = container(ds).ports.find((p: Json) => p.name === name);
  expect(port, `no container port named ${name}`).to.be.an('object');
  return port.containerPort;
}

// Every overlay: the node's network namespace and bpffs, and CAP_NET_RAW, so that each can
// remove what another backend left (iptables-legacy reads need a raw socket) when switching.
const BACKENDS = {
  nft: { caps: ['NET_ADMIN', 'NET_RAW'], volumes: ['tmp', 'bpffs', 'xtables-lock', 'kube-proxy-config'] },
  iptables: { caps: ['NET_ADMIN', 'NET_RAW'], volumes: ['tmp', 'bpffs', 'xtables-lock', 'kube-proxy-config'] },
  ebpf: {
    caps: ['BPF', 'NET_ADMIN', 'NET_RAW'],
    volumes: ['tmp', 'bpffs', 'xtables-lock', 'cgroup', 'kube-proxy-config'],
  },
} as const;

describe('deploy/ manifests (kubectl kustomize)', function () {
  this.timeout(60_000);
  const rendered = new Map<string, Json[]>();

  before(async () => {
    for (const backend of Object.keys(BACKENDS))
      rendered.set(backend, await kustomize(join(deploy, 'overlays', backend)));
  });

  for (const [backend, expected] of Object.entries(BACKENDS)) {
    describe(`overlays/${backend}`, () => {
      const objects = () => rendered.get(backend)!;
      const ds = () => only(objects(), 'DaemonSet', 'ipvs-node-controller');

      it('renders exactly a ServiceAccount, a ClusterRole, its binding and a DaemonSet, schema-valid', () => {
        expect(
          objects()
            .map((o) => o.kind)
            .sort(),
        ).to.deep.equal(['ClusterRole', 'ClusterRoleBinding', 'DaemonSet', 'ServiceAccount']);
        validateSchemas(objects());
        for (const o of objects().filter((o) => o.kind === 'DaemonSet' || o.kind === 'ServiceAccount')) {
          expect(o.metadata.namespace, o.kind).to.equal('kube-system');
        }
      });

      it("grants Services list/watch and Nodes get/list/watch, nothing else, to the DaemonSet's account", () => {
        const role = only(objects(), 'ClusterRole');
        expect(role.rules).to.deep.equal([
          { apiGroups: [''], resources: ['services'], verbs: ['list', 'watch'] },
          { apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch'] },
        ]);
        const binding = only(objects(), 'ClusterRoleBinding');
        expect(binding.roleRef).to.deep.equal({
          apiGroup: 'rbac.authorization.k8s.io',
          kind: 'ClusterRole',
          name: role.metadata.name,
        });
        const account = only(objects(), 'ServiceAccount');
        expect(binding.subjects).to.deep.equal([
          { kind: 'ServiceAccount', name: account.metadata.name, namespace: account.metadata.namespace },
        ]);
        expect(ds().spec.template.spec.serviceAccountName).to.equal(account.metadata.name);
      });

      it(`passes flags the CLI accepts: --backend=${backend}, NODE_NAME from the downward API`, () => {
        const config = configOf(ds());
        expect(config.backend).to.equal(backend);
        expect(config.nodeName).to.equal('node-from-downward-api');
        expect(config.emitEvents, 'Events are off unless the component is included').to.equal(false);
        const env = container(ds()).env.find((e: Json) => e.name === 'NODE_NAME');
        expect(env.valueFrom).to.deep.equal({ fieldRef: { fieldPath: 'spec.nodeName' } });
        // The node's own address, from the downward API, where the probes and the PodMonitor reach a host-network pod.
        const hostIp = container(ds()).env.find((e: Json) => e.name === 'HOST_IP');
        expect(hostIp.valueFrom).to.deep.equal({ fieldRef: { fieldPath: 'status.hostIP' } });
        expect(config.metricsBindAddress).to.deep.equal({ host: HOST_IP, port: portNamed(ds(), 'metrics') });
        expect(config.healthzBindAddress).to.deep.equal({ host: HOST_IP, port: portNamed(ds(), 'healthz') });
        expect(container(ds()).livenessProbe.httpGet.host, 'probes go to the pod IP, the node address').to.equal(
          undefined,
        );
      });

      it('runs on every node at node-critical priority, probed on the health endpoints, scraped by annotation', () => {
        const spec = ds().spec;
        const pod = spec.template.spec;
        expect(spec.selector.matchLabels).to.deep.equal({ 'app.kubernetes.io/name': 'ipvs-node-controller' });
        for (const [k, v] of Object.entries(spec.selector.matchLabels))
          expect(spec.template.metadata.labels[k]).to.equal(v);
        expect(pod.tolerations).to.deep.equal([{ operator: 'Exists' }]);
        expect(pod.priorityClassName).to.equal('system-node-critical');
        expect(pod.hostNetwork).to.equal(true);
        expect(pod.dnsPolicy).to.equal('ClusterFirstWithHostNet');
        expect(spec.updateStrategy.rollingUpdate.maxSurge, 'two pods of a node would share its ports').to.equal(
          undefined,
        );
        const c = container(ds());
        expect(c.livenessProbe.httpGet).to.deep.equal({ path: '/healthz', port: 'healthz' });
        expect(c.readinessProbe.httpGet).to.deep.equal({ path: '/readyz', port: 'healthz' });
        const annotations = spec.template.metadata.annotations;
        expect(annotations['prometheus.io/scrape']).to.equal('true');
        expect(annotations['prometheus.io/path']).to.equal('/metrics');
        expect(Number(annotations['prometheus.io/port'])).to.equal(portNamed(ds(), 'metrics'));
        expect(c.resources.requests.cpu).to.be.a('string').and.not.equal('');
        expect(c.resources.requests.memory).to.be.a('string').and.not.equal('');
        expect(c.resources.limits.memory).to.be.a('string').and.not.equal('');
        expect(c.resources.limits.cpu, 'no CPU throttling of a node-critical agent').to.equal(undefined);
      });

      it(`adds only ${expected.caps.join(' and ')} to a read-only, unprivileged container`, () => {
        const sc = container(ds()).securityContext;
        expect(sc.capabilities).to.deep.equal({ drop: ['ALL'], add: [...expected.caps] });
        expect(sc.privileged).to.equal(false);
        expect(sc.allowPrivilegeEscalation).to.equal(false);
        expect(sc.readOnlyRootFilesystem).to.equal(true);
        expect(sc.seccompProfile).to.deep.equal({ type: 'RuntimeDefault' });
      });

      it('mounts exactly the volumes the backend needs, each one defined', () => {
        const pod = ds().spec.template.spec;
        const volumes = new Map<string, Json>(pod.volumes.map((v: Json) => [v.name, v]));
        expect([...volumes.keys()].sort()).to.deep.equal([...expected.volumes].sort());
        const mounts = new Map<string, Json>(container(ds()).volumeMounts.map((m: Json) => [m.name, m]));
        expect([...mounts.keys()].sort()).to.deep.equal([...volumes.keys()].sort());
        expect(mounts.get('tmp')!.mountPath, 'the nft CLI fallback writes transactions to the temp dir').to.equal(
          '/tmp',
        );
        const config = configOf(ds());
        // kube-proxy's ConfigMap, read-only and optional, in the namespace the DaemonSet runs in.
        expect(volumes.get('kube-proxy-config')!.configMap).to.deep.equal({
          name: 'kube-proxy',
          optional: true,
          items: [{ key: 'config.conf', path: 'config.conf' }],
        });
        expect(mounts.get('kube-proxy-config')!.readOnly).to.equal(true);
        expect(config.kubeProxyConfig).to.equal(`${mounts.get('kube-proxy-config')!.mountPath}/config.conf`);
        expect(ds().metadata.namespace, 'a ConfigMap volume must be in the pod namespace').to.equal('kube-system');
        {
          expect(volumes.get('xtables-lock')!.hostPath).to.deep.equal({
            path: '/run/xtables.lock',
            type: 'FileOrCreate',
          });
          expect(mounts.get('xtables-lock')!.mountPath).to.equal('/run/xtables.lock');
        }
        if (backend === 'ebpf') {
          expect(volumes.get('cgroup')!.hostPath.path).to.equal('/sys/fs/cgroup');
          expect(config.cgroupPath, '--cgroup-path is the host cgroup mount').to.equal(mounts.get('cgroup')!.mountPath);
          expect(mounts.get('cgroup')!.readOnly).to.equal(true);
        }
        // Pins (ebpf) and their removal (the others) on the node's bpffs, outside /sys in the
        // container (default AppArmor profiles refuse writes under /sys/fs/[^c]*).
        expect(volumes.get('bpffs')!.hostPath.path).to.equal('/sys/fs/bpf');
        expect(
          config.bpffsPath.startsWith(`${mounts.get('bpffs')!.mountPath}/`),
          'pins land on the host bpffs',
        ).to.equal(true);
        expect(!mounts.get('bpffs')!.mountPath.startsWith('/sys/')).to.equal(true);
        expect(mounts.get('bpffs')!.mountPropagation).to.equal('HostToContainer');
      });
    });
  }

  it('uses the image of this package version, labelled with it', async () => {
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
    for (const objects of rendered.values()) {
      const ds = only(objects, 'DaemonSet');
      expect(container(ds).image).to.equal(`ghcr.io/ipvs-node-controller/ipvs-node-controller:${pkg.version}`);
      expect(ds.metadata.labels['app.kubernetes.io/version']).to.equal(pkg.version);
      expect(ds.spec.template.metadata.labels['app.kubernetes.io/version']).to.equal(pkg.version);
      expect(ds.spec.selector.matchLabels['app.kubernetes.io/version'], 'selectors are immutable').to.equal(undefined);
    }
  });

  it("uninstall: a cleanup DaemonSet on every node, with every backend's capabilities and the node bpffs", async () => {
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
    const objects = await kustomize(join(deploy, 'uninstall'));
    validateSchemas(objects);
    const ds = only(objects, 'DaemonSet', 'ipvs-node-controller-cleanup');
    const pod = ds.spec.template.spec;
    expect(pod.hostNetwork).to.equal(true);
    expect(pod.tolerations).to.deep.equal([{ operator: 'Exists' }]);
    const init = pod.initContainers[0];
    expect(init.image).to.equal(`ghcr.io/ipvs-node-controller/ipvs-node-controller:${pkg.version}`);
    const config = parseConfig(init.args, { NODE_NAME: 'n' });
    expect(config.cleanup).to.equal(true);
    expect(init.securityContext.capabilities).to.deep.equal({ drop: ['ALL'], add: ['NET_ADMIN', 'NET_RAW', 'BPF'] });
    const bpffs = init.volumeMounts.find((m: Json) => m.name === 'bpffs');
    expect(config.bpffsPath.startsWith(`${bpffs.mountPath}/`)).to.equal(true);
    expect(pod.volumes.find((v: Json) => v.name === 'bpffs').hostPath.path).to.equal('/sys/fs/bpf');
    // The same --bpffs-path as the controller's, so the cleanup looks where the pins are.
    expect(config.bpffsPath).to.equal(configOf(only(rendered.get('ebpf')!, 'DaemonSet')).bpffsPath);
  });

  it('components/apparmor-unconfined runs the container without an AppArmor profile, and changes nothing else', async () => {
    const objects = await kustomizeWithComponent('ebpf', 'apparmor-unconfined');
    const sc = container(only(objects, 'DaemonSet')).securityContext;
    expect(sc.appArmorProfile).to.deep.equal({ type: 'Unconfined' });
    delete sc.appArmorProfile;
    expect(sc).to.deep.equal(container(only(rendered.get('ebpf')!, 'DaemonSet')).securityContext);
  });

  it('components/emit-events turns on --emit-events with create on events, and nothing more', async () => {
    const objects = await kustomizeWithComponent('nft', 'emit-events');
    expect(configOf(only(objects, 'DaemonSet')).emitEvents).to.equal(true);
    const role = only(objects, 'ClusterRole', 'ipvs-node-controller-events');
    expect(role.rules).to.deep.equal([{ apiGroups: [''], resources: ['events'], verbs: ['create'] }]);
    const binding = only(objects, 'ClusterRoleBinding', 'ipvs-node-controller-events');
    expect(binding.roleRef.name).to.equal(role.metadata.name);
    expect(binding.subjects).to.deep.equal([
      { kind: 'ServiceAccount', name: 'ipvs-node-controller', namespace: 'kube-system' },
    ]);
  });

  it('monitoring: the PodMonitor and the ServiceMonitor example select the pods and their metrics port', async () => {
    const ds = only(rendered.get('nft')!, 'DaemonSet');
    const podLabels = ds.spec.template.metadata.labels as Record<string, string>;
    const selects = (selector: Json, labels: Record<string, string>) =>
      Object.entries(selector.matchLabels as Record<string, string>).every(([k, v]) => labels[k] === v);

    const monitoring = await kustomize(join(deploy, 'monitoring'));
    validateSchemas(monitoring);
    const podMonitor = only(monitoring, 'PodMonitor');
    expect(selects(podMonitor.spec.selector, podLabels)).to.equal(true);
    expect(podMonitor.spec.namespaceSelector.matchNames).to.deep.equal([ds.metadata.namespace]);
    expect(podMonitor.spec.podMetricsEndpoints[0].port).to.equal('metrics');
    portNamed(ds, 'metrics');
    // job="ipvs-node-controller", which the alerts and the dashboard select on.
    expect(podLabels[podMonitor.spec.jobLabel as string]).to.equal('ipvs-node-controller');
    const dashboard = only(monitoring, 'ConfigMap', 'ipvs-node-controller-dashboard');
    expect(dashboard.metadata.labels.grafana_dashboard, "kube-prometheus-stack's dashboard sidecar").to.equal('1');
    const json = JSON.parse(dashboard.data['ipvs-node-controller.json'] as string) as Json;
    expect(json.uid).to.equal('ipvs-node-controller');

    const alternative = YAML.parseAllDocuments(
      await readFile(join(deploy, 'monitoring', 'servicemonitor.yaml'), 'utf8'),
    ).map((d) => d.toJSON() as Json);
    validateSchemas(alternative);
    const service = only(alternative, 'Service');
    const serviceMonitor = only(alternative, 'ServiceMonitor');
    expect(service.spec.clusterIP).to.equal('None');
    expect(selects({ matchLabels: service.spec.selector }, podLabels)).to.equal(true);
    expect(service.spec.ports[0].targetPort).to.equal('metrics');
    expect(selects(serviceMonitor.spec.selector, service.metadata.labels)).to.equal(true);
    expect(service.metadata.labels[serviceMonitor.spec.jobLabel as string]).to.equal('ipvs-node-controller');
    expect(serviceMonitor.spec.endpoints[0].port).to.equal(service.spec.ports[0].name);
  });
});
