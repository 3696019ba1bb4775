// The manifests of deploy/ as kustomize (built into kubectl) renders them: schema-valid against
// the Kubernetes OpenAPI models, least-privilege RBAC, a DaemonSet that runs the flags the CLI
// accepts with what each backend needs and nothing more, and the monitoring examples.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import YAML from 'yaml';
import { DaemonSet } from 'kubernetes-models/apps/v1';
import { ServiceAccount, Service } from 'kubernetes-models/v1';
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

const MODELS: Record<string, new (data: any) => { validate(): void }> = {
  'v1/ServiceAccount': ServiceAccount,
  'v1/Service': Service,
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
    assert.ok(Model, `unexpected kind ${o.apiVersion}/${o.kind}`);
    assert.ok(o.metadata?.name, `${o.kind} without a name`);
    try {
      new Model(o).validate();
    } catch (err) {
      throw new Error(`${o.kind}/${o.metadata.name}: ${(err as Error).message}`);
    }
  }
}

function only(objects: Json[], kind: string, name?: string): Json {
  const found = objects.filter((o) => o.kind === kind && (name === undefined || o.metadata.name === name));
  assert.equal(found.length, 1, `expected one ${kind}${name ? ` ${name}` : ''}, found ${found.length}`);
  return found[0]!;
}

function container(ds: Json): Json {
  assert.equal(ds.spec.template.spec.containers.length, 1);
  return ds.spec.template.spec.containers[0];
}

/** The container's flags as the CLI parses them, with the DaemonSet's NODE_NAME. */
function configOf(ds: Json): Config {
  const c = container(ds);
  assert.deepEqual(c.command, undefined, 'the image entrypoint runs the CLI');
  return parseConfig(c.args, { NODE_NAME: 'node-from-downward-api' });
}

function portNamed(ds: Json, name: string): number {
  const port = container(ds).ports.find((p: Json) => p.name === name);
  assert.ok(port, `no container port named ${name}`);
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
        assert.deepEqual(
          objects()
            .map((o) => o.kind)
            .sort(),
          ['ClusterRole', 'ClusterRoleBinding', 'DaemonSet', 'ServiceAccount'],
        );
        validateSchemas(objects());
        for (const o of objects().filter((o) => o.kind === 'DaemonSet' || o.kind === 'ServiceAccount')) {
          assert.equal(o.metadata.namespace, 'kube-system', o.kind);
        }
      });

      it("grants Services list/watch and Nodes get/list/watch, nothing else, to the DaemonSet's account", () => {
        const role = only(objects(), 'ClusterRole');
        assert.deepEqual(role.rules, [
          { apiGroups: [''], resources: ['services'], verbs: ['list', 'watch'] },
          { apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch'] },
        ]);
        const binding = only(objects(), 'ClusterRoleBinding');
        assert.deepEqual(binding.roleRef, {
          apiGroup: 'rbac.authorization.k8s.io',
          kind: 'ClusterRole',
          name: role.metadata.name,
        });
        const account = only(objects(), 'ServiceAccount');
        assert.deepEqual(binding.subjects, [
          { kind: 'ServiceAccount', name: account.metadata.name, namespace: account.metadata.namespace },
        ]);
        assert.equal(ds().spec.template.spec.serviceAccountName, account.metadata.name);
      });

      it(`passes flags the CLI accepts: --backend=${backend}, NODE_NAME from the downward API`, () => {
        const config = configOf(ds());
        assert.equal(config.backend, backend);
        assert.equal(config.nodeName, 'node-from-downward-api');
        assert.equal(config.emitEvents, false, 'Events are off unless the component is included');
        const env = container(ds()).env.find((e: Json) => e.name === 'NODE_NAME');
        assert.deepEqual(env.valueFrom, { fieldRef: { fieldPath: 'spec.nodeName' } });
        assert.deepEqual(config.metricsBindAddress, { host: '0.0.0.0', port: portNamed(ds(), 'metrics') });
        assert.deepEqual(config.healthzBindAddress, { host: '0.0.0.0', port: portNamed(ds(), 'healthz') });
      });

      it('runs on every node at node-critical priority, probed on the health endpoints, scraped by annotation', () => {
        const spec = ds().spec;
        const pod = spec.template.spec;
        assert.deepEqual(spec.selector.matchLabels, { 'app.kubernetes.io/name': 'ipvs-node-controller' });
        for (const [k, v] of Object.entries(spec.selector.matchLabels))
          assert.equal(spec.template.metadata.labels[k], v);
        assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }]);
        assert.equal(pod.priorityClassName, 'system-node-critical');
        assert.equal(pod.hostNetwork, true);
        assert.equal(pod.dnsPolicy, 'ClusterFirstWithHostNet');
        assert.equal(spec.updateStrategy.rollingUpdate.maxSurge, undefined, 'two pods of a node would share its ports');
        const c = container(ds());
        assert.deepEqual(c.livenessProbe.httpGet, { path: '/healthz', port: 'healthz' });
        assert.deepEqual(c.readinessProbe.httpGet, { path: '/readyz', port: 'healthz' });
        const annotations = spec.template.metadata.annotations;
        assert.equal(annotations['prometheus.io/scrape'], 'true');
        assert.equal(annotations['prometheus.io/path'], '/metrics');
        assert.equal(Number(annotations['prometheus.io/port']), portNamed(ds(), 'metrics'));
        assert.ok(c.resources.requests.cpu && c.resources.requests.memory && c.resources.limits.memory);
        assert.equal(c.resources.limits.cpu, undefined, 'no CPU throttling of a node-critical agent');
      });

      it(`adds only ${expected.caps.join(' and ')} to a read-only, unprivileged container`, () => {
        const sc = container(ds()).securityContext;
        assert.deepEqual(sc.capabilities, { drop: ['ALL'], add: [...expected.caps] });
        assert.equal(sc.privileged, false);
        assert.equal(sc.allowPrivilegeEscalation, false);
        assert.equal(sc.readOnlyRootFilesystem, true);
        assert.deepEqual(sc.seccompProfile, { type: 'RuntimeDefault' });
      });

      it('mounts exactly the volumes the backend needs, each one defined', () => {
        const pod = ds().spec.template.spec;
        const volumes = new Map<string, Json>(pod.volumes.map((v: Json) => [v.name, v]));
        assert.deepEqual([...volumes.keys()].sort(), [...expected.volumes].sort());
        const mounts = new Map<string, Json>(container(ds()).volumeMounts.map((m: Json) => [m.name, m]));
        assert.deepEqual([...mounts.keys()].sort(), [...volumes.keys()].sort());
        assert.equal(mounts.get('tmp')!.mountPath, '/tmp', 'the nft CLI fallback writes transactions to the temp dir');
        const config = configOf(ds());
        // kube-proxy's ConfigMap, read-only and optional, in the namespace the DaemonSet runs in.
        assert.deepEqual(volumes.get('kube-proxy-config')!.configMap, {
          name: 'kube-proxy',
          optional: true,
          items: [{ key: 'config.conf', path: 'config.conf' }],
        });
        assert.equal(mounts.get('kube-proxy-config')!.readOnly, true);
        assert.equal(config.kubeProxyConfig, `${mounts.get('kube-proxy-config')!.mountPath}/config.conf`);
        assert.equal(ds().metadata.namespace, 'kube-system', 'a ConfigMap volume must be in the pod namespace');
        {
          assert.deepEqual(volumes.get('xtables-lock')!.hostPath, { path: '/run/xtables.lock', type: 'FileOrCreate' });
          assert.equal(mounts.get('xtables-lock')!.mountPath, '/run/xtables.lock');
        }
        if (backend === 'ebpf') {
          assert.equal(volumes.get('cgroup')!.hostPath.path, '/sys/fs/cgroup');
          assert.equal(config.cgroupPath, mounts.get('cgroup')!.mountPath, '--cgroup-path is the host cgroup mount');
          assert.equal(mounts.get('cgroup')!.readOnly, true);
        }
        // Pins (ebpf) and their removal (the others) on the node's bpffs, outside /sys in the
        // container (default AppArmor profiles refuse writes under /sys/fs/[^c]*).
        assert.equal(volumes.get('bpffs')!.hostPath.path, '/sys/fs/bpf');
        assert.ok(config.bpffsPath.startsWith(`${mounts.get('bpffs')!.mountPath}/`), 'pins land on the host bpffs');
        assert.ok(!mounts.get('bpffs')!.mountPath.startsWith('/sys/'));
        assert.equal(mounts.get('bpffs')!.mountPropagation, 'HostToContainer');
      });
    });
  }

  it('uses the image of this package version, labelled with it', async () => {
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
    for (const objects of rendered.values()) {
      const ds = only(objects, 'DaemonSet');
      assert.equal(container(ds).image, `ipvs-node-controller:${pkg.version}`);
      assert.equal(ds.metadata.labels['app.kubernetes.io/version'], pkg.version);
      assert.equal(ds.spec.template.metadata.labels['app.kubernetes.io/version'], pkg.version);
      assert.equal(ds.spec.selector.matchLabels['app.kubernetes.io/version'], undefined, 'selectors are immutable');
    }
  });

  it("uninstall: a cleanup DaemonSet on every node, with every backend's capabilities and the node bpffs", async () => {
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
    const objects = await kustomize(join(deploy, 'uninstall'));
    validateSchemas(objects);
    const ds = only(objects, 'DaemonSet', 'ipvs-node-controller-cleanup');
    const pod = ds.spec.template.spec;
    assert.equal(pod.hostNetwork, true);
    assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }]);
    const init = pod.initContainers[0];
    assert.equal(init.image, `ipvs-node-controller:${pkg.version}`);
    const config = parseConfig(init.args, { NODE_NAME: 'n' });
    assert.equal(config.cleanup, true);
    assert.deepEqual(init.securityContext.capabilities, { drop: ['ALL'], add: ['NET_ADMIN', 'NET_RAW', 'BPF'] });
    const bpffs = init.volumeMounts.find((m: Json) => m.name === 'bpffs');
    assert.ok(config.bpffsPath.startsWith(`${bpffs.mountPath}/`));
    assert.equal(pod.volumes.find((v: Json) => v.name === 'bpffs').hostPath.path, '/sys/fs/bpf');
    // The same --bpffs-path as the controller's, so the cleanup looks where the pins are.
    assert.equal(config.bpffsPath, configOf(only(rendered.get('ebpf')!, 'DaemonSet')).bpffsPath);
  });

  it('components/apparmor-unconfined runs the container without an AppArmor profile, and changes nothing else', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'overlay-apparmor-'));
    try {
      await writeFile(
        join(dir, 'kustomization.yaml'),
        YAML.stringify({
          apiVersion: 'kustomize.config.k8s.io/v1beta1',
          kind: 'Kustomization',
          resources: [relative(dir, join(deploy, 'overlays', 'ebpf'))],
          components: [relative(dir, join(deploy, 'components', 'apparmor-unconfined'))],
        }),
      );
      const objects = await kustomize(dir);
      validateSchemas(objects);
      const sc = container(only(objects, 'DaemonSet')).securityContext;
      assert.deepEqual(sc.appArmorProfile, { type: 'Unconfined' });
      delete sc.appArmorProfile;
      assert.deepEqual(sc, container(only(rendered.get('ebpf')!, 'DaemonSet')).securityContext);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('components/emit-events turns on --emit-events with create on events, and nothing more', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'overlay-events-'));
    try {
      // An overlay of a user's own, outside the repository, as the component's comment shows.
      await writeFile(
        join(dir, 'kustomization.yaml'),
        YAML.stringify({
          apiVersion: 'kustomize.config.k8s.io/v1beta1',
          kind: 'Kustomization',
          resources: [relative(dir, join(deploy, 'overlays', 'nft'))],
          components: [relative(dir, join(deploy, 'components', 'emit-events'))],
        }),
      );
      const objects = await kustomize(dir);
      validateSchemas(objects);
      assert.equal(configOf(only(objects, 'DaemonSet')).emitEvents, true);
      const role = only(objects, 'ClusterRole', 'ipvs-node-controller-events');
      assert.deepEqual(role.rules, [{ apiGroups: [''], resources: ['events'], verbs: ['create'] }]);
      const binding = only(objects, 'ClusterRoleBinding', 'ipvs-node-controller-events');
      assert.equal(binding.roleRef.name, role.metadata.name);
      assert.deepEqual(binding.subjects, [
        { kind: 'ServiceAccount', name: 'ipvs-node-controller', namespace: 'kube-system' },
      ]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });

  it('monitoring: the PodMonitor and the ServiceMonitor example select the pods and their metrics port', async () => {
    const ds = only(rendered.get('nft')!, 'DaemonSet');
    const podLabels = ds.spec.template.metadata.labels as Record<string, string>;
    const selects = (selector: Json, labels: Record<string, string>) =>
      Object.entries(selector.matchLabels as Record<string, string>).every(([k, v]) => labels[k] === v);

    const monitoring = await kustomize(join(deploy, 'monitoring'));
    validateSchemas(monitoring);
    const podMonitor = only(monitoring, 'PodMonitor');
    assert.ok(selects(podMonitor.spec.selector, podLabels));
    assert.deepEqual(podMonitor.spec.namespaceSelector.matchNames, [ds.metadata.namespace]);
    assert.equal(podMonitor.spec.podMetricsEndpoints[0].port, 'metrics');
    portNamed(ds, 'metrics');

    const alternative = YAML.parseAllDocuments(
      await readFile(join(deploy, 'monitoring', 'servicemonitor.yaml'), 'utf8'),
    ).map((d) => d.toJSON() as Json);
    validateSchemas(alternative);
    const service = only(alternative, 'Service');
    const serviceMonitor = only(alternative, 'ServiceMonitor');
    assert.equal(service.spec.clusterIP, 'None');
    assert.ok(selects({ matchLabels: service.spec.selector }, podLabels));
    assert.equal(service.spec.ports[0].targetPort, 'metrics');
    assert.ok(selects(serviceMonitor.spec.selector, service.metadata.labels));
    assert.equal(serviceMonitor.spec.endpoints[0].port, service.spec.ports[0].name);
  });
});
