// A kubelet stand-in: the built image, run with podman exactly as the rendered DaemonSet of each
// overlay says (args, env with NODE_NAME from the downward API, capabilities, read-only root,
// no privilege escalation, the user, hostPath and emptyDir volumes, the host network, the
// in-cluster ServiceAccount), against the API stand-in over HTTPS. Then packets, probes, a stop,
// a rolling update (to a second tag, and from the previous release and back with its own
// manifests: npm run image:previous), switching overlays, and the uninstall DaemonSet.
//
// The node is this process's network namespace (test/run.mjs starts the suite under
// `unshare --net --mount`); the node's bpffs is one mounted for the test, its cgroup v2 root a
// cgroup created for the test, its other hostPaths under a scratch directory. All removed after.
// Needs the image: `npm run image` (CI builds it first; without it the suite is skipped, except
// when IPVS_NODE_CONTROLLER_REQUIRE_IMAGE=1, where that is a failure). The release's install
// (dist/release/install-nft.yaml, its image pulled by digest from the release archive) needs
// `npm run release`, under the same rule.

import { expect } from 'chai';
import { spawn, spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { once } from 'node:events';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, rmdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';
import { ApiStandIn } from '../../testbed/api-server.js';
import { httpGet } from '../support/scrape.js';
import { NODE, sh } from '../../testbed/node-network.js';
import { KUBE_PROXY_MASQUERADE, removeKubeProxyMasquerade } from '../../testbed/check-command.js';
import { Scenario, LB_V4, LB_PATH } from '../kernel/scenario.js';
import { defaultCgroupPath } from '../../src/backends/ebpf/ebpf-driver.js';

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const VERSION = (JSON.parse(readFileSync(join(repoRoot, 'package.json'), 'utf8')) as { version: string }).version;
const IMAGE = `localhost/ipvs-node-controller:${VERSION}`;
/** The rolling update's new image: a second tag, as a new release would be. */
const IMAGE_UPDATE = `localhost/ipvs-node-controller:${VERSION}-update`;
const PROBE_CLIENT = join(repoRoot, 'dist', 'testbed', 'probe-client.js');
/** What `npm run release` writes. */
const RELEASE_DIR = join(repoRoot, 'dist', 'release');
const PODMAN_ENV = { ...process.env, CONTAINERS_CONF: join(repoRoot, 'scripts', 'containers.conf') };
const TAG = `inc-test-${process.pid}`;
/** The node's address the kubelet probes a host-network pod on. */
const NODE_IP = NODE.podGateway4;

type Obj = Record<string, any>;

function podman(args: string[], allowFail = false): { code: number; out: string; err: string } {
  const r = spawnSync('podman', args, { env: PODMAN_ENV, encoding: 'utf8', timeout: 120_000 });
  const res = { code: r.status ?? -1, out: (r.stdout ?? '').trim(), err: (r.stderr ?? '').trim() };
  if (!allowFail && res.code !== 0) throw new Error(`podman ${args.join(' ')}: exit ${res.code}: ${res.err}`);
  return res;
}

/** podman without blocking the event loop: for a command that calls back into this process (the API stand-in). */
async function podmanAsync(args: string[]): Promise<{ code: number | null; out: string; err: string }> {
  const child = spawn('podman', args, { env: PODMAN_ENV, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  child.stderr.on('data', (d: Buffer) => (err += d.toString()));
  const [code] = (await once(child, 'exit')) as [number | null];
  return { code, out: out.trim(), err: err.trim() };
}

function run(cmd: string, args: string[], allowFail = false): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8' });
  if (!allowFail && r.status !== 0) {
    throw new Error(`${cmd} ${args.join(' ')}: exit ${r.status ?? r.signal}: ${r.stderr}`);
  }
  return r.stdout ?? '';
}

/**
 * A command of the image run in the node's network namespace: the node's own nft (1.0.6 on
 * bookworm) crashes listing tables that the image's newer libnftables wrote.
 */
function imageTool(args: string[]): string {
  const r = podman([
    'run',
    '--rm',
    '--pull',
    'never',
    '--network',
    `ns:/proc/${process.pid}/ns/net`,
    '--cap-drop',
    'all',
    '--cap-add',
    'net_admin',
    '--entrypoint',
    args[0]!,
    IMAGE,
    ...args.slice(1),
  ]);
  return r.out;
}

/** `kubectl kustomize DIR`, as YAML documents; with components, through an overlay of a user's own. */
function render(dir: string, components: string[] = []): Obj[] {
  let target = resolve(repoRoot, dir);
  let scratch: string | undefined;
  if (components.length > 0) {
    scratch = mkdtempSync(join(tmpdir(), `${TAG}-overlay-`));
    const kustomization = {
      apiVersion: 'kustomize.config.k8s.io/v1beta1',
      kind: 'Kustomization',
      resources: [relative(scratch, target)],
      components: components.map((c) => relative(scratch!, resolve(repoRoot, c))),
    };
    writeFileSync(join(scratch, 'kustomization.yaml'), YAML.stringify(kustomization));
    target = scratch;
  }
  try {
    const text = run('kubectl', ['kustomize', target]);
    return YAML.parseAllDocuments(text).map((d) => d.toJSON() as Obj);
  } finally {
    if (scratch) rmSync(scratch, { recursive: true, force: true });
  }
}

/**
 * Whether podman's default seccomp profile lets CAP_BPF call bpf(). Where it does not (the
 * containers-common profile of Debian bookworm), a user of such a runtime adds the component
 * deploy/components/ebpf-sys-admin to the ebpf overlay, and so does this stand-in.
 */
function seccompAllowsBpfWithCapBpf(): boolean {
  for (const path of ['/etc/containers/seccomp.json', '/usr/share/containers/seccomp.json']) {
    if (!existsSync(path)) continue;
    const profile = JSON.parse(readFileSync(path, 'utf8')) as { syscalls: Obj[] };
    return profile.syscalls.some(
      (s) =>
        s.names.includes('bpf') &&
        s.action === 'SCMP_ACT_ALLOW' &&
        (!s.includes?.caps || s.includes.caps.includes('CAP_BPF')),
    );
  }
  return true;
}

const OVERLAY_COMPONENTS: Record<string, string[]> = {
  ebpf: seccompAllowsBpfWithCapBpf() ? [] : ['deploy/components/ebpf-sys-admin'],
};

/** Each overlay with the objects it leaves on the node; in this order the suite switches them. */
const OVERLAY_OBJECTS = [
  ['iptables', ['iptables-legacy']],
  ['ebpf', ['ebpf']],
  ['nft', ['nft']],
] as const;

/**
 * The rules of our nft chains, other than the per-Service source-range chains, that match
 * `pattern`: what a rolled-back release still uses of the newer one's objects.
 */
function rulesNaming(listing: string, pattern: RegExp): string[] {
  let table = '';
  let block = '';
  const found: string[] = [];
  for (const line of listing.split('\n')) {
    const tableHead = /^table \S+ (\S+)/.exec(line);
    const head = /^\s*(chain|set|map|counter) (\S+)/.exec(line);
    if (tableHead) table = tableHead[1]!;
    else if (head) block = `${head[1]} ${head[2]}`;
    else if (
      table === 'ipvs-node-controller' &&
      block.startsWith('chain ') &&
      !block.startsWith('chain source-ranges-')
    ) {
      if (pattern.test(line)) found.push(`${block}: ${line.trim()}`);
    }
  }
  return found;
}

/** The previous release as `npm run image:previous` made it: its image and its source tree. */
interface PreviousRelease {
  version: string;
  image: string;
  dir: string;
}

function previousRelease(): PreviousRelease | { missing: string } {
  const r = spawnSync(process.execPath, [join(repoRoot, 'scripts', 'previous-image.mjs'), '--check'], {
    encoding: 'utf8',
    env: PODMAN_ENV,
  });
  if (r.status !== 0) return { missing: r.stderr.trim() || `previous-image.mjs --check: exit ${r.status}` };
  return JSON.parse(r.stdout) as PreviousRelease;
}

function daemonSetOf(dir: string, name: string, components: string[] = []): Obj {
  const ds = render(dir, components).find((o) => o.kind === 'DaemonSet' && o.metadata.name === name);
  if (!ds) throw new Error(`${dir} renders no DaemonSet ${name}`);
  return ds;
}

async function waitFor<T>(what: string, fn: () => Promise<T | undefined> | T | undefined, ms = 60_000): Promise<T> {
  const until = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v;
    } catch (err) {
      last = err;
    }
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}${last ? `: ${String(last)}` : ''}`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The node: its scratch root for hostPaths, its bpffs, its cgroup v2 root and the pods' cgroup. */
class Node {
  readonly root = mkdtempSync(join(tmpdir(), `${TAG}-root-`));
  readonly bpffs = join(this.root, 'sys', 'fs', 'bpf');
  readonly cgroup: string;
  readonly podCgroup: string;
  readonly hostCgroup: string;
  /** podman's cgroup parent for the containers: a subtree of ours, removed after. */
  readonly cgroupParent = `/${TAG}`;
  readonly saDir = join(this.root, 'serviceaccount');

  constructor() {
    const cgroupRoot = defaultCgroupPath();
    if (!cgroupRoot) throw new Error('no cgroup2 mount in /proc/mounts');
    this.cgroup = join(cgroupRoot, TAG);
    this.podCgroup = join(this.cgroup, 'pod');
    this.hostCgroup = join(this.cgroup, 'host-processes');
  }

  setUp(api: ApiStandIn): void {
    mkdirSync(this.bpffs, { recursive: true });
    run('mount', ['-t', 'bpf', 'bpf', this.bpffs]);
    for (const dir of [this.cgroup, this.podCgroup, this.hostCgroup]) mkdirSync(dir);
    // The projected ServiceAccount volume: token, CA, namespace.
    mkdirSync(this.saDir);
    const kubeconfig = YAML.parse(api.kubeconfig()) as Obj;
    writeFileSync(join(this.saDir, 'token'), kubeconfig.users[0].user.token);
    writeFileSync(join(this.saDir, 'ca.crt'), api.caPem);
    writeFileSync(join(this.saDir, 'namespace'), 'kube-system');
  }

  /**
   * The cluster's ConfigMaps in the pod's namespace, as the kubelet would fetch them: kubeadm's
   * kube-proxy configuration of an IPVS-mode cluster.
   */
  readonly configMaps: Record<string, Record<string, string>> = {
    'kube-proxy': {
      'config.conf': [
        'apiVersion: kubeproxy.config.k8s.io/v1alpha1',
        'kind: KubeProxyConfiguration',
        'mode: ipvs',
        'clusterCIDR: 10.244.0.0/16',
        'iptables:',
        '  masqueradeBit: 14',
        '',
      ].join('\n'),
    },
  };

  /** A configMap volume as the kubelet lays it out: one file per item (all keys without items). */
  configMapDir(volume: Obj): string {
    const { name, items, optional } = volume.configMap as {
      name: string;
      items?: Array<{ key: string; path: string }>;
      optional?: boolean;
    };
    const dir = join(this.root, 'configmaps', volume.name as string);
    mkdirSync(dir, { recursive: true });
    const data = this.configMaps[name];
    if (!data) {
      if (optional) return dir;
      throw new Error(`ConfigMap ${name} does not exist and the volume is not optional`);
    }
    for (const { key, path } of items ?? Object.keys(data).map((key) => ({ key, path: key }))) {
      const value = data[key];
      if (value === undefined) throw new Error(`ConfigMap ${name} has no key ${key}`);
      writeFileSync(join(dir, path), value);
    }
    return dir;
  }

  /** Where a hostPath of the pod spec is on this node. */
  hostPath(volume: Obj): string {
    const { path, type } = volume.hostPath as { path: string; type?: string };
    if (path === '/sys/fs/cgroup') return this.cgroup;
    const local = join(this.root, path);
    if (type === 'DirectoryOrCreate') mkdirSync(local, { recursive: true });
    if (type === 'FileOrCreate' && !existsSync(local)) {
      mkdirSync(dirname(local), { recursive: true });
      writeFileSync(local, '');
    }
    if (!existsSync(local)) throw new Error(`hostPath ${path} (${type}) does not exist on the node`);
    return local;
  }

  tearDown(): void {
    // Pins hold programs on the cgroup: remove them before the bpffs and the cgroups.
    rmSync(join(this.bpffs, 'ipvs-node-controller'), { recursive: true, force: true });
    run('umount', [this.bpffs], true);
    for (const dir of [this.podCgroup, this.hostCgroup, this.cgroup]) {
      if (existsSync(dir)) rmdirSync(dir);
    }
    // podman's cgroups for our containers, in each hierarchy (they are empty once the containers are gone).
    for (const line of readFileSync('/proc/mounts', 'utf8').split('\n')) {
      const [, mountPoint, fsType] = line.split(' ');
      if ((fsType === 'cgroup' || fsType === 'cgroup2') && mountPoint) {
        const dir = join(mountPoint, this.cgroupParent);
        if (existsSync(dir)) spawnSync('find', [dir, '-depth', '-type', 'd', '-exec', 'rmdir', '{}', ';']);
      }
    }
    rmSync(this.root, { recursive: true, force: true });
  }
}

interface Started {
  name: string;
  startedAt: number;
  pod: Obj;
}

/** The kubelet's part: one pod of a DaemonSet, its init containers to completion, then its container. */
class Kubelet {
  constructor(
    private readonly node: Node,
    private readonly api: ApiStandIn,
  ) {}

  private containerArgs(pod: Obj, container: Obj, name: string, image: string): string[] {
    const spec = pod.spec as Obj;
    const args = ['run', '-d', '--name', name, '--pull', 'never', '--cgroup-parent', this.node.cgroupParent];
    expect(spec.hostNetwork, 'every overlay runs in the node network namespace').to.equal(true);
    args.push('--network', `ns:/proc/${process.pid}/ns/net`);
    const sc = (container.securityContext ?? {}) as Obj;
    if (sc.runAsUser !== undefined) args.push('--user', String(sc.runAsUser));
    expect(sc.privileged ?? false).to.equal(false);
    for (const cap of sc.capabilities?.drop ?? []) args.push('--cap-drop', String(cap).toLowerCase());
    for (const cap of sc.capabilities?.add ?? []) args.push('--cap-add', String(cap).toLowerCase());
    if (sc.allowPrivilegeEscalation === false) args.push('--security-opt', 'no-new-privileges');
    // The kubelet adds no tmpfs of its own to a read-only root filesystem.
    if (sc.readOnlyRootFilesystem === true) args.push('--read-only', '--read-only-tmpfs=false');
    expect(sc.seccompProfile?.type ?? 'RuntimeDefault').to.equal('RuntimeDefault'); // podman's default profile
    // The downward API this stand-in resolves: the node's name and its address.
    const downward: Record<string, string> = { 'spec.nodeName': 'node-1', 'status.hostIP': NODE_IP };
    const environment: Record<string, string> = {};
    for (const env of container.env ?? []) {
      const value = env.value ?? downward[env.valueFrom?.fieldRef?.fieldPath as string];
      if (value === undefined) throw new Error(`the kubelet stand-in does not resolve env ${JSON.stringify(env)}`);
      environment[env.name as string] = value as string;
      args.push('--env', `${env.name}=${value}`);
    }
    if (spec.automountServiceAccountToken !== false) {
      const { hostname, port } = new URL(this.api.url);
      args.push('--env', `KUBERNETES_SERVICE_HOST=${hostname}`, '--env', `KUBERNETES_SERVICE_PORT=${port}`);
      args.push('-v', `${this.node.saDir}:/var/run/secrets/kubernetes.io/serviceaccount:ro`);
    }
    for (const mount of container.volumeMounts ?? []) {
      const volume = (spec.volumes ?? []).find((v: Obj) => v.name === mount.name);
      if (!volume) throw new Error(`volumeMount ${mount.name} has no volume`);
      if (volume.emptyDir) {
        const size = volume.emptyDir.sizeLimit
          ? `,tmpfs-size=${String(volume.emptyDir.sizeLimit).replace('Mi', 'm')}`
          : '';
        expect(volume.emptyDir.medium).to.equal('Memory');
        args.push('--mount', `type=tmpfs,destination=${mount.mountPath}${size}`);
        continue;
      }
      if (volume.configMap) {
        expect(mount.readOnly, 'a ConfigMap is mounted read-only').to.equal(true);
        args.push('-v', `${this.node.configMapDir(volume)}:${mount.mountPath}:ro`);
        continue;
      }
      if (!volume.hostPath) throw new Error(`the kubelet stand-in does not mount volume ${JSON.stringify(volume)}`);
      const options = [mount.readOnly ? 'ro' : 'rw'];
      if (mount.mountPropagation === 'HostToContainer') options.push('rslave');
      args.push('-v', `${this.node.hostPath(volume)}:${mount.mountPath}:${options.join(',')}`);
    }
    if (container.command) args.push('--entrypoint', JSON.stringify(container.command));
    // $(VAR) in args is the container's environment variable, as the kubelet expands it.
    const expand = (arg: string) =>
      arg.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (m, name: string) => environment[name] ?? m);
    args.push(image, ...((container.args ?? []) as string[]).map(expand));
    return args;
  }

  /** Images pulled by their exact reference (a release's, pinned by digest): the local image each is. */
  readonly pulled = new Map<string, string>();

  /** The image the spec names: one pulled by that reference, else as built here (the tag is checked against package.json). */
  /**
   * The local image for the one the manifest names: this version's, fully named; or, for a
   * previous release's manifests (`previous`), that release's image, however it named it.
   */
  private image(container: Obj, override?: string, previous?: string): string {
    const pulled = this.pulled.get(container.image as string);
    if (pulled) return pulled;
    if (previous !== undefined) {
      expect(container.image).to.match(new RegExp(`(^|/)ipvs-node-controller:${previous.replace(/\./g, '\\.')}$`));
    } else {
      expect(container.image).to.equal(`ghcr.io/ipvs-node-controller/ipvs-node-controller:${VERSION}`);
    }
    return override ?? IMAGE;
  }

  async runToCompletion(pod: Obj, container: Obj, name: string): Promise<{ code: number; log: string }> {
    podman(this.containerArgs(pod, container, name, this.image(container)));
    const code = Number(podman(['wait', name]).out);
    const log = podman(['logs', name], true);
    podman(['rm', '-f', name], true);
    return { code, log: `${log.out}\n${log.err}` };
  }

  start(pod: Obj, name: string, image?: string, previous?: string): Started {
    const container = pod.spec.containers[0] as Obj;
    const startedAt = Date.now();
    podman(this.containerArgs(pod, container, name, this.image(container, image, previous)));
    return { name, startedAt, pod };
  }

  /** The probe as the kubelet calls it: httpGet on the pod IP (the node's, host network) and the named port. */
  async probe(started: Started, kind: 'livenessProbe' | 'readinessProbe'): Promise<number> {
    const container = started.pod.spec.containers[0] as Obj;
    const get = container[kind].httpGet as Obj;
    const port =
      typeof get.port === 'number' ? get.port : container.ports.find((p: Obj) => p.name === get.port)?.containerPort;
    expect(port, `named port ${get.port}`).to.be.a('number');
    try {
      return (await httpGet(`http://${NODE_IP}:${port}${get.path}`)).status;
    } catch {
      return 0;
    }
  }

  async waitReady(started: Started): Promise<number> {
    await waitFor(`${started.name} ready`, async () => {
      const state = podman(['inspect', '--format', '{{.State.Status}}', started.name]).out;
      if (state !== 'running') throw new Error(`container ${state}: ${this.logs(started.name)}`);
      return (await this.probe(started, 'readinessProbe')) === 200;
    });
    return Date.now() - started.startedAt;
  }

  /** Stops as the kubelet does: SIGTERM, SIGKILL after terminationGracePeriodSeconds. */
  stop(started: Started): { exitCode: number; ms: number } {
    const grace = Number(started.pod.spec.terminationGracePeriodSeconds ?? 30);
    const t0 = Date.now();
    podman(['stop', '-t', String(grace), started.name]);
    const exitCode = Number(podman(['inspect', '--format', '{{.State.ExitCode}}', started.name]).out);
    const ms = Date.now() - t0;
    return { exitCode, ms };
  }

  logs(name: string): string {
    const r = podman(['logs', name], true);
    return `${r.out}\n${r.err}`.trim();
  }

  remove(name: string): void {
    podman(['rm', '-f', '-t', '0', name], true);
  }
}

/** Connects from the pod (its network namespace and cgroup) or from a node process, once. */
async function connect(from: 'pod' | 'node', node: Node, podNs: string, address = LB_V4, port = 80): Promise<string> {
  const cgroupProcs = join(from === 'pod' ? node.podCgroup : node.hostCgroup, 'cgroup.procs');
  const client = [process.execPath, PROBE_CLIENT, 'tcp', address, String(port), '1500'];
  const inNs = from === 'pod' ? ['nsenter', `--net=/run/netns/${podNs}`, ...client] : client;
  const child = spawn('sh', ['-c', 'echo $$ > "$0" && exec "$@"', cgroupProcs, ...inNs], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  child.stdout.on('data', (d: Buffer) => (out += d.toString()));
  await once(child, 'close');
  return out.trim();
}

/** Which backends have objects of ours on the node. */
function inventory(node: Node): string[] {
  const found: string[] = [];
  const tables = imageTool(['nft', 'list', 'tables']);
  if (/table ip6? ipvs-node-controller/.test(tables)) found.push('nft');
  const ours = (save: string) => /^:IPVS_(PREROUTING|OUTPUT) /m.test(save);
  if (ours(run('iptables-nft-save', [], true) + run('ip6tables-nft-save', [], true))) found.push('iptables-nft');
  const legacyNat = (file: string) => existsSync(file) && readFileSync(file, 'utf8').split('\n').includes('nat');
  const legacy =
    (legacyNat('/proc/net/ip_tables_names') ? run('iptables-legacy-save', ['-t', 'nat'], true) : '') +
    (legacyNat('/proc/net/ip6_tables_names') ? run('ip6tables-legacy-save', ['-t', 'nat'], true) : '');
  if (ours(legacy)) found.push('iptables-legacy');
  const pins = existsSync(join(node.bpffs, 'ipvs-node-controller'));
  const programs = run('bpftool', ['-j', 'cgroup', 'show', node.cgroup], true).trim();
  if (pins || (programs !== '' && programs !== '[]')) found.push('ebpf');
  return found;
}

/** Resident memory of the container's main process (VmRSS), and the container cgroup's usage (podman stats). */
function rssOf(name: string): { rssMiB: number; cgroupMiB?: number } {
  const pid = podman(['inspect', '--format', '{{.State.Pid}}', name]).out;
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const rssKiB = Number(/^VmRSS:\s+(\d+)/m.exec(status)?.[1]);
  const stats = podman(['stats', '--no-stream', '--format', '{{.MemUsageBytes}}', name], true).out;
  return { rssMiB: rssKiB / 1024, cgroupMiB: stats ? Number.parseFloat(stats) : undefined };
}

const imageBuilt = () => podman(['image', 'exists', IMAGE], true).code === 0;

/** The names (repository:tag) of an image, by its ID; none when it does not exist. */
function imageTags(id: string): string[] {
  const r = podman(['image', 'inspect', '--format', '{{json .RepoTags}}', id.replace(/^sha256:/, '')], true);
  return r.code === 0 ? ((JSON.parse(r.out) as string[] | null) ?? []) : [];
}

describe('the image under the DaemonSet, as a kubelet runs it (podman)', function () {
  this.timeout(180_000);
  let scenario: Scenario;
  let api: ApiStandIn;
  let node: Node;
  let kubelet: Kubelet;
  let current: Started | undefined;
  const names: string[] = [];
  const pulledNames: string[] = [];
  const figures: string[] = [];

  const onlyObjects = (objects: readonly string[], what: string) =>
    waitFor(`only ${objects.join(', ')} on the node (${what})`, () =>
      JSON.stringify(inventory(node)) === JSON.stringify(objects) ? true : undefined,
    );

  /** One pod of the overlay's DaemonSet, as this tree renders it, or as a previous release's tree does with its image. */
  const startOverlay = async (
    overlay: string,
    image?: string,
    previous?: PreviousRelease,
  ): Promise<{ started: Started; readyMs: number }> => {
    const source = previous?.dir ?? repoRoot;
    const components = OVERLAY_COMPONENTS[overlay] ?? [];
    const ds = daemonSetOf(
      join(source, 'deploy', 'overlays', overlay),
      'ipvs-node-controller',
      components.map((c) => join(source, c)),
    );
    if (components.length > 0 && !figures.some((f) => f.includes(components[0]!))) {
      figures.push(
        `${overlay}: with ${components.join(', ')} (podman's default seccomp profile allows bpf() only to CAP_SYS_ADMIN)`,
      );
    }
    const name = `${TAG}-${overlay}-${names.length}`;
    names.push(name);
    const shown = previous?.image ?? image;
    const started = kubelet.start(ds.spec.template, name, shown, previous?.version);
    const readyMs = await kubelet.waitReady(started);
    figures.push(`${overlay}${shown ? ` (${shown})` : ''}: container start -> ready ${readyMs} ms`);
    return { started, readyMs };
  };

  before(async function () {
    if (!imageBuilt()) {
      if (process.env.IPVS_NODE_CONTROLLER_REQUIRE_IMAGE === '1') {
        throw new Error(`the image ${IMAGE} is not built (npm run image) and this run requires it`);
      }
      console.log(`    skipped: the image ${IMAGE} is not built: run \`npm run image\` first`);
      this.skip();
    }
    podman(['tag', IMAGE, IMAGE_UPDATE]);
    scenario = new Scenario();
    await scenario.setUp();
    // A kube-proxy-like rule in iptables-legacy: the iptables backend then uses the legacy variant,
    // and the other overlays must be able to read legacy tables to remove its leftovers.
    run('iptables-legacy', ['-t', 'nat', '-A', 'POSTROUTING', '-s', '10.99.0.0/16', '-j', 'RETURN']);
    api = await ApiStandIn.start({ host: '127.0.0.1' });
    node = new Node();
    node.setUp(api);
    kubelet = new Kubelet(node, api);
    api.apply({
      kind: 'Node',
      apiVersion: 'v1',
      metadata: { name: 'node-1' },
      spec: { podCIDRs: [NODE.podCidr4, NODE.podCidr6] },
    });
    api.apply({
      kind: 'Service',
      apiVersion: 'v1',
      metadata: { namespace: 'default', name: 'svc-a', creationTimestamp: '2024-01-01T00:00:00Z' },
      spec: {
        type: 'LoadBalancer',
        clusterIP: '10.96.0.10',
        clusterIPs: ['10.96.0.10'],
        externalTrafficPolicy: 'Local',
        ports: [{ port: 80, protocol: 'TCP' }],
      },
      status: { loadBalancer: { ingress: [{ ip: LB_V4 }] } },
    });
  });

  after(async function () {
    for (const name of names) kubelet?.remove(name);
    if (imageBuilt()) podman(['rmi', IMAGE_UPDATE], true);
    // The names the pull from the release archive added; the image itself is the one built here.
    for (const name of pulledNames) podman(['untag', IMAGE, name], true);
    if (figures.length > 0) console.log(`\n    figures:\n${figures.map((f) => `      ${f}`).join('\n')}`);
    await api?.stop();
    node?.tearDown();
    await scenario?.tearDown();
  });

  afterEach(function () {
    if (this.currentTest?.state === 'failed' && current) console.log(kubelet.logs(current.name));
  });

  it('the image carries what the controller runs and nothing more: no shell, apt or dpkg', () => {
    // Node.js is the one program of the image that can look at its files.
    const look = (paths: string[]) =>
      JSON.parse(
        podman([
          'run',
          '--rm',
          '--pull',
          'never',
          '--network',
          'none',
          '--entrypoint',
          'node',
          IMAGE,
          '-e',
          'const fs = require("fs"); console.log(JSON.stringify(process.argv.slice(1).map((p) => fs.existsSync(p))))',
          ...paths,
        ]).out,
      ) as boolean[];
    const present = ['/usr/sbin/nft', '/usr/sbin/iptables', '/usr/sbin/iptables-legacy', '/usr/sbin/ip6tables-nft'];
    present.push(
      '/usr/sbin/conntrack',
      '/usr/local/bin/ipvs-node-controller',
      '/var/lib/dpkg/status',
      '/etc/os-release',
    );
    expect(look(present), present.join(' ')).to.deep.equal(present.map(() => true));
    const absent = ['/bin/sh', '/usr/bin/bash', '/usr/bin/apt', '/usr/bin/apt-get', '/usr/bin/dpkg', '/usr/bin/ls'];
    absent.push('/usr/bin/perl', '/usr/local/bin/npm', '/usr/lib/node_modules', '/usr/local/lib/node_modules');
    expect(look(absent), absent.join(' ')).to.deep.equal(absent.map(() => false));
    const size = Number(podman(['image', 'inspect', '--format', '{{.Size}}', IMAGE]).out);
    figures.push(`image ${IMAGE}: ${(size / 1e6).toFixed(1)} MB uncompressed`);
  });

  it('before any controller: the LoadBalancer IP is not translated (the load balancer path answers)', async () => {
    expect(await connect('pod', node, scenario.network.pod.ns)).to.equal(LB_PATH);
    expect(await connect('node', node, scenario.network.pod.ns)).to.equal(LB_PATH);
    expect(inventory(node)).to.deep.equal([]);
  });

  it('nft overlay: ready, both probes answered on the named port, pod and node traffic translated', async () => {
    const { started } = await startOverlay('nft');
    current = started;
    expect(await kubelet.probe(started, 'livenessProbe')).to.equal(200);
    expect(await kubelet.probe(started, 'readinessProbe')).to.equal(200);
    expect(await connect('pod', node, scenario.network.pod.ns)).to.equal('svc-a');
    expect(await connect('node', node, scenario.network.pod.ns)).to.equal('svc-a');
    expect(inventory(node)).to.deep.equal(['nft']);
    // The first log line names the version; the in-cluster configuration was used.
    const first = JSON.parse(kubelet.logs(started.name).split('\n')[0]!) as Obj;
    expect(first.version).to.equal(VERSION);
    expect(first.node).to.equal('node-1');
    // The image's in-process libnftables addon programs the kernel, not the nft command.
    expect(kubelet.logs(started.name)).to.match(/programmed in process through libnftables/);
    // The check an operator execs in the container (docs: "Prove it works"), with kube-proxy's
    // masquerade of the mark on the node as IPVS mode writes it: it finds the running controller
    // at the node's address and proves the path with a connection of its own.
    sh('iptables-nft-restore', ['--noflush', '-w'], KUBE_PROXY_MASQUERADE);
    sh('ip6tables-nft-restore', ['--noflush', '-w'], KUBE_PROXY_MASQUERADE);
    let checked;
    try {
      // Asynchronously: the API stand-in answering the check lives in this process.
      checked = await podmanAsync([
        'exec',
        started.name,
        'ipvs-node-controller',
        'check',
        '--service=default/svc-a',
        '--output=json',
      ]);
    } finally {
      removeKubeProxyMasquerade('nft');
    }
    expect(checked.code, `${checked.out}\n${checked.err}`).to.equal(0);
    const report = JSON.parse(checked.out) as Obj;
    expect(report.ok).to.equal(true);
    expect(report.controller).to.include({ kind: 'running', address: `${NODE_IP}:9478` });
    expect(report.backend.name).to.equal('nft');
    expect(report.paths).to.have.length(1);
    expect(report.paths[0]).to.include({ address: LB_V4, protocol: 'TCP', port: 80, ok: true, outcome: 'answered' });
    expect(report.paths[0].conntrack.reply.src).to.equal('10.96.0.10');
    const metrics = await httpGet(`http://${NODE_IP}:9477/metrics`);
    expect(metrics.body).to.match(
      new RegExp(
        `^ipvs_node_controller_build_info\\{version="${VERSION.replace(/\./g, '\\.')}",revision="[^"]+",node_version="v24\\.`,
        'm',
      ),
    );
    await new Promise((r) => setTimeout(r, 5000));
    const { rssMiB, cgroupMiB } = rssOf(started.name);
    figures.push(
      `nft: idle resident memory ${rssMiB.toFixed(1)} MiB (VmRSS), container cgroup ${cgroupMiB ?? '?'} MB (podman stats)`,
    );
  });

  it('SIGTERM within terminationGracePeriodSeconds: exits 0 in time and leaves the rules', async () => {
    const { exitCode, ms } = kubelet.stop(current!);
    expect(exitCode, kubelet.logs(current!.name)).to.equal(0);
    figures.push(`nft: stop (SIGTERM) -> exit ${ms} ms`);
    expect(kubelet.logs(current!.name)).to.include('the programmed rules stay in place');
    expect(inventory(node)).to.deep.equal(['nft']);
    expect(await connect('pod', node, scenario.network.pod.ns)).to.equal('svc-a');
  });

  it('a rolling update to a second tag loses no connection to the LoadBalancer IP', async () => {
    const old = await startOverlay('nft');
    let stop = false;
    const answers: string[] = [];
    const loop = (async () => {
      while (!stop) {
        answers.push(await connect('pod', node, scenario.network.pod.ns));
        await new Promise((r) => setTimeout(r, 50));
      }
    })();
    try {
      kubelet.stop(old.started);
      const next = await startOverlay('nft', IMAGE_UPDATE);
      current = next.started;
      expect(podman(['inspect', '--format', '{{.ImageName}}', next.started.name]).out).to.equal(IMAGE_UPDATE);
      await new Promise((r) => setTimeout(r, 1000));
    } finally {
      stop = true;
      await loop;
    }
    expect(answers.length).to.be.greaterThan(5);
    expect(answers.filter((a) => a !== 'svc-a')).to.deep.equal([]);
    figures.push(`rolling update: ${answers.length} connections during stop old / start new, all answered`);
  });

  it('a rolling update from the previous release and back, with its own manifests (old -> new -> old -> new), on each overlay: no connection lost', async function () {
    const previous = previousRelease();
    if ('missing' in previous) {
      if (process.env.IPVS_NODE_CONTROLLER_REQUIRE_IMAGE === '1') throw new Error(previous.missing);
      console.log(`    skipped: ${previous.missing}`);
      this.skip();
    }
    // After the previous release: this one, the previous one again, this one.
    const steps = [undefined, previous, undefined];
    // A Service with loadBalancerSourceRanges, whose layout changed most between the two (0.4.0:
    // every source translated; this one: a chain of its own, only the pods' range translated).
    api.apply({
      kind: 'Service',
      apiVersion: 'v1',
      metadata: { namespace: 'default', name: 'svc-b', creationTimestamp: '2024-01-02T00:00:00Z' },
      spec: {
        type: 'LoadBalancer',
        clusterIP: '10.96.0.11',
        clusterIPs: ['10.96.0.11'],
        externalTrafficPolicy: 'Local',
        ports: [{ port: 8080, protocol: 'TCP' }],
        loadBalancerSourceRanges: [NODE.podCidr4],
      },
      status: { loadBalancer: { ingress: [{ ip: LB_V4 }] } },
    });
    const tries = [
      { from: 'pod', port: 80, answer: 'svc-a' },
      { from: 'node', port: 80, answer: 'svc-a' },
      { from: 'pod', port: 8080, answer: 'svc-b' },
    ] as const;
    for (const [overlay, objects] of OVERLAY_OBJECTS) {
      // The previous release on this overlay first (switching overlays is not what is counted).
      if (current) kubelet.stop(current);
      current = (await startOverlay(overlay, undefined, previous)).started;
      await onlyObjects(objects, `${previous.version} on ${overlay}`);
      // eBPF leaves a ranged Service to kube-proxy from 0.5.0 on (sourceRangesUnsupported: a socket
      // hook cannot know an unbound socket's source); here the load balancer path answers those.
      const ours = overlay === 'ebpf' ? tries.filter((t) => t.port === 80) : tries;
      let stop = false;
      let phase = `${overlay}: ${previous.version}`;
      const answers: string[] = [];
      const lost: string[] = [];
      const loop = (async () => {
        for (let i = 0; !stop; i++) {
          const t = ours[i % ours.length]!;
          const answer = await connect(t.from, node, scenario.network.pod.ns, LB_V4, t.port);
          answers.push(answer);
          if (answer !== t.answer) lost.push(`${phase}: ${t.from} -> ${LB_V4}:${t.port}: ${answer}`);
          await new Promise((r) => setTimeout(r, 50));
        }
      })();
      try {
        for (const release of steps) {
          kubelet.stop(current);
          phase = `${overlay}: ${release?.version ?? VERSION} starting`;
          current = (await startOverlay(overlay, undefined, release)).started;
          phase = `${overlay}: ${release?.version ?? VERSION} ready`;
          const image = release?.image ?? IMAGE;
          expect(podman(['inspect', '--format', '{{.ImageName}}', current.name]).out).to.equal(image);
          await onlyObjects(objects, `${image} on ${overlay}`);
          if (overlay === 'iptables') {
            // 0.5.0 goes from its entry chains to chains per bucket and per ranged Service; the
            // previous release's entry chains hold its rules, and go to none of those.
            const toChains = run('iptables-legacy-save', ['-t', 'nat'])
              .split('\n')
              .filter((l) => /^-A IPVS_(PREROUTING|OUTPUT) .* -[gj] IPVS_/.test(l));
            if (release) expect(toChains, `${release.version}'s entry chains`).to.deep.equal([]);
            else expect(toChains, `${VERSION}'s entry chains`).not.to.deep.equal([]);
          }
          if (overlay === 'nft') {
            // Each release's rules name only its own objects; the other's are inert where they stay.
            const listing = imageTool(['nft', 'list', 'ruleset']);
            if (release) {
              expect(rulesNaming(listing, /source-range/), `${release.version}'s rules`).to.deep.equal([]);
            } else {
              expect(rulesNaming(listing, /source-range/), `${VERSION}'s rules`).not.to.deep.equal([]);
              expect(listing).not.to.include('local-pod-cidrs');
            }
          }
          await new Promise((r) => setTimeout(r, 1000));
        }
      } finally {
        stop = true;
        await loop;
      }
      expect(answers.length).to.be.greaterThan(10);
      expect(lost).to.deep.equal([]);
      const to = ours.length === tries.length ? 'to a Service with and one without source ranges' : 'to svc-a';
      figures.push(
        `rolling update ${previous.version} -> ${VERSION} -> ${previous.version} -> ${VERSION} (${overlay}): ` +
          `${answers.length} connections from a pod and the node ${to}, all answered`,
      );
    }
    api.remove('Service', 'default', 'svc-b');
  });

  for (const [overlay, objects] of OVERLAY_OBJECTS) {
    it(`switching to the ${overlay} overlay leaves exactly its objects (${objects.join(', ')}) and translates`, async () => {
      kubelet.stop(current!);
      const { started } = await startOverlay(overlay);
      current = started;
      await onlyObjects(objects, overlay);
      expect(await connect('pod', node, scenario.network.pod.ns)).to.equal('svc-a');
      expect(await connect('node', node, scenario.network.pod.ns)).to.equal('svc-a');
      if (overlay === 'ebpf') {
        const { rssMiB } = rssOf(started.name);
        figures.push(`ebpf: resident memory after start ${rssMiB.toFixed(1)} MiB (VmRSS)`);
      }
    });
  }

  it('the release as a user installs it: install-nft.yaml, its image pulled by the digest it names from the release archive', async function () {
    if (!existsSync(join(RELEASE_DIR, 'release.json'))) {
      if (process.env.IPVS_NODE_CONTROLLER_REQUIRE_IMAGE === '1') {
        throw new Error('dist/release is not made (npm run release) and this run requires it');
      }
      console.log('    skipped: dist/release is not made: run `npm run release` first');
      this.skip();
    }
    // Every file is the one SHA256SUMS names.
    const sums = spawnSync('sha256sum', ['--check', '--strict', 'SHA256SUMS'], { cwd: RELEASE_DIR, encoding: 'utf8' });
    expect(sums.status, sums.stdout + sums.stderr).to.equal(0);
    const release = JSON.parse(readFileSync(join(RELEASE_DIR, 'release.json'), 'utf8')) as Obj;
    const archive = join(RELEASE_DIR, release.archive as string);
    // The archive's index, and the digest of its bytes: what a registry serves once the archive is copied there.
    const inArchive = (path: string) => {
      const r = spawnSync('tar', ['-xOf', archive, path], { maxBuffer: 64 * 1024 * 1024 });
      if (r.status !== 0) throw new Error(`${path} is not in ${archive}: ${String(r.stderr)}`);
      return r.stdout;
    };
    const layout = JSON.parse(inArchive('./index.json').toString('utf8')) as { manifests: Obj[] };
    const top = layout.manifests.find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === VERSION);
    expect(top?.mediaType).to.equal('application/vnd.oci.image.index.v1+json');
    const indexBytes = inArchive(`./blobs/sha256/${String(top!.digest).slice('sha256:'.length)}`);
    expect(`sha256:${createHash('sha256').update(indexBytes).digest('hex')}`).to.equal(top!.digest);
    const index = JSON.parse(indexBytes.toString('utf8')) as { manifests: Obj[] };
    const byArch = Object.fromEntries(index.manifests.map((m) => [m.platform.architecture as string, m.digest]));
    expect(Object.keys(byArch).sort(), 'both architectures under one index').to.deep.equal(['amd64', 'arm64']);

    // The manifest a user applies names the image by that digest.
    const objects = YAML.parseAllDocuments(readFileSync(join(RELEASE_DIR, 'install-nft.yaml'), 'utf8')).map(
      (d) => d.toJSON() as Obj,
    );
    expect(objects.map((o) => o.kind).sort()).to.deep.equal([
      'ClusterRole',
      'ClusterRoleBinding',
      'DaemonSet',
      'ServiceAccount',
    ]);
    const ds = objects.find((o) => o.kind === 'DaemonSet')!;
    const reference = ds.spec.template.spec.containers[0].image as string;
    expect(reference).to.equal(`${release.repository}:${VERSION}@${top!.digest}`);

    // The node pulls this node's platform out of the index, as a runtime does from a registry: the
    // image whose config the amd64 manifest names, reached through the index's digest.
    const amd64 = JSON.parse(
      inArchive(`./blobs/sha256/${String(byArch.amd64).slice('sha256:'.length)}`).toString('utf8'),
    ) as { config: { digest: string } };
    const tagsBefore = new Set(imageTags(amd64.config.digest));
    const pulled = podman(['pull', '--quiet', `oci-archive:${archive}:${VERSION}`])
      .out.split('\n')
      .at(-1)!;
    expect(`sha256:${podman(['image', 'inspect', '--format', '{{.Id}}', pulled]).out}`).to.equal(amd64.config.digest);
    // Names the pull added (from the archive's reference name): removed after, the image stays.
    pulledNames.push(...imageTags(amd64.config.digest).filter((t) => !tagsBefore.has(t)));
    const repoDigests = podman(['image', 'inspect', '--format', '{{json .RepoDigests}}', pulled]).out;
    expect(repoDigests, 'pulled by the index digest, as the amd64 manifest').to.include(`@${top!.digest}"`);
    expect(repoDigests).to.include(`@${byArch.amd64}"`);
    kubelet.pulled.set(reference, pulled);

    kubelet.stop(current!);
    const name = `${TAG}-release-${names.length}`;
    names.push(name);
    const started = kubelet.start(ds.spec.template, name);
    current = started;
    const readyMs = await kubelet.waitReady(started);
    figures.push(
      `release install-nft.yaml (${reference.replace(/@sha256:(.{12}).*$/, '@sha256:$1...')}): start -> ready ${readyMs} ms`,
    );
    expect(podman(['inspect', '--format', '{{.Image}}', name]).out).to.equal(
      podman(['image', 'inspect', '--format', '{{.Id}}', pulled]).out,
    );
    await waitFor('only nft on the node', () => (JSON.stringify(inventory(node)) === '["nft"]' ? true : undefined));
    expect(await connect('pod', node, scenario.network.pod.ns)).to.equal('svc-a');
    expect(await connect('node', node, scenario.network.pod.ns)).to.equal('svc-a');
    // The command on PATH that docs/operations.md tells an operator to exec.
    expect(podman(['exec', name, 'ipvs-node-controller', '--version']).out).to.equal(VERSION);
  });

  it('a cleanup that cannot see the node bpffs says so and fails', async () => {
    const ds = daemonSetOf('deploy/uninstall', 'ipvs-node-controller-cleanup');
    const pod = structuredClone(ds.spec.template) as Obj;
    const init = pod.spec.initContainers[0] as Obj;
    init.volumeMounts = init.volumeMounts.filter((m: Obj) => m.name !== 'bpffs');
    const name = `${TAG}-cleanup-nobpffs`;
    names.push(name);
    const { code, log } = await kubelet.runToCompletion(pod, init, name);
    expect(code).to.equal(1);
    expect(log).to.match(/is not on a bpffs mount/);
  });

  it('uninstall (deploy/uninstall): removes every object of ours; traffic goes the load balancer path again', async () => {
    // Objects of every backend: ebpf pins (a stopped ebpf controller leaves them), and, as an
    // older or crashed run could leave them, our nft table and our iptables-legacy chain.
    kubelet.stop(current!);
    const ebpf = await startOverlay('ebpf');
    await waitFor('ebpf alone', () => (JSON.stringify(inventory(node)) === '["ebpf"]' ? true : undefined));
    kubelet.stop(ebpf.started);
    imageTool(['nft', 'add', 'table', 'ip', 'ipvs-node-controller']);
    run('iptables-legacy', ['-t', 'nat', '-N', 'IPVS_OUTPUT']);
    run('iptables-legacy', ['-t', 'nat', '-I', 'OUTPUT', '1', '-j', 'IPVS_OUTPUT']);
    expect(inventory(node)).to.deep.equal(['nft', 'iptables-legacy', 'ebpf']);
    const ds = daemonSetOf('deploy/uninstall', 'ipvs-node-controller-cleanup');
    const pod = ds.spec.template as Obj;
    const init = pod.spec.initContainers[0] as Obj;
    const name = `${TAG}-cleanup`;
    names.push(name);
    const { code, log } = await kubelet.runToCompletion(pod, init, name);
    expect(code, log).to.equal(0);
    expect(inventory(node)).to.deep.equal([]);
    expect(await connect('pod', node, scenario.network.pod.ns)).to.equal(LB_PATH);
    expect(await connect('node', node, scenario.network.pod.ns)).to.equal(LB_PATH);
    // The idle container after it starts under its own securityContext and stays up.
    const done = kubelet.start(pod, `${TAG}-cleanup-done`);
    names.push(done.name);
    await waitFor('the done container logs', () =>
      kubelet.logs(done.name).includes('this node is clean') ? true : undefined,
    );
    const stopped = kubelet.stop(done);
    expect(stopped.exitCode).to.equal(0);
  });
});
