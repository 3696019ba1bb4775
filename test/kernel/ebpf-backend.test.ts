// The eBPF backend on the real kernel, with real sockets.
//
// The lab: a "node" network namespace with the ClusterIP and the external IP bound on a bridge
// with no ports (the kube-ipvs0 stand-in: this kernel has no IPVS), a server answering "cluster"
// on the ClusterIP and one answering "external" on the external IP; a "pod" namespace linked to
// it by a veth pair; a cgroup the test creates under the cgroup2 mount (never the root cgroup);
// and a bpffs instance mounted for the test, so the pins are the test's own. All of it is removed
// afterwards, also when a test fails.

import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmdirSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';

import { EbpfDriver, defaultCgroupPath } from '../../src/backends/ebpf/ebpf-driver.js';
import { KEY_SIZE, VALUE_SIZE, decodeElements, encodeKeys, encodeValues } from '../../src/backends/ebpf/map-codec.js';
import { loadEbpfAddon, type PinnedMap } from '../../src/backends/ebpf/native.js';
import { DesiredStateModel } from '../../src/model/desired-state.js';
import type { DesiredState, Entry, Family, NodeInfo, ServiceInfo } from '../../src/model/types.js';
import { assertIsolatedNetns } from '../../testbed/node-network.js';
import { rejectionOf } from '../support/assertions.js';
import { CONFIG, churnedSyncs } from '../support/fixtures.js';

const PEER = fileURLToPath(new URL('./ebpf-peer.js', import.meta.url));
const TAG = `inc${process.pid}`;
const NODE_NS = `${TAG}-node`;
const POD_NS = `${TAG}-pod`;

const ADDR = {
  ipv4: { cluster: '10.96.0.10', external: '192.0.2.10', pod: '10.244.0.2', nodeSide: '10.244.0.1', prefix: 24 },
  ipv6: { cluster: 'fd00:96::10', external: '2001:db8::10', pod: 'fd00:244::2', nodeSide: 'fd00:244::1', prefix: 64 },
} as const;
const PORT = 8080;
/** An external port with no entry: must never be translated. */
const OTHER_PORT = 8081;

function entry(family: Family, protocol: 'TCP' | 'UDP', port = PORT): Entry {
  return {
    family,
    externalIp: ADDR[family].external,
    protocol,
    port,
    clusterIp: ADDR[family].cluster,
    service: 'default/web',
  };
}

function desiredOf(entries: Entry[]): DesiredState {
  return {
    ipv4: { entries: entries.filter((e) => e.family === 'ipv4'), localPodMatch: { kind: 'cidrs', cidrs: [] } },
    ipv6: { entries: entries.filter((e) => e.family === 'ipv6'), localPodMatch: { kind: 'cidrs', cidrs: [] } },
    masqueradeMark: 0x4000,
    skips: [],
    conflicts: [],
  };
}

const NODE: NodeInfo = { name: 'n1', podCIDRs: ['10.244.0.0/24', 'fd00:244::/64'] };

/** A map's elements as `externalIp protocol port -> clusterIp clusterPort`, sorted. */
async function mapElements(bpffsPath: string, family: Family): Promise<string[]> {
  const load = loadEbpfAddon();
  if (!load.ok) expect.fail(load.reason);
  const map = new load.addon.PinnedMap(join(bpffsPath, 'maps', family === 'ipv4' ? 'entries_v4' : 'entries_v6'));
  try {
    const dump = await map.dump();
    return decodeElements(family, dump.keys, dump.values)
      .map((e) => `${e.externalIp} ${e.protocol} ${e.port} -> ${e.clusterIp} ${e.clusterPort}`)
      .sort();
  } finally {
    map.close();
  }
}

/** What a map holding exactly `entries` dumps as (see mapElements). */
function elementsOf(entries: readonly Entry[]): string[] {
  return entries.map((e) => `${e.externalIp} ${e.protocol} ${e.port} -> ${e.clusterIp} ${e.port}`).sort();
}

const ALL_ENTRIES: Entry[] = [entry('ipv4', 'TCP'), entry('ipv4', 'UDP'), entry('ipv6', 'TCP'), entry('ipv6', 'UDP')];

function run(cmd: string, args: string[]): string {
  return execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

function tryRun(cmd: string, args: string[]): void {
  try {
    run(cmd, args);
  } catch {
    // teardown of something that may not exist
  }
}

interface Where {
  ns: string;
  inCgroup: boolean;
  /**
   * Enter the network namespace only (nsenter): `ip netns exec` mounts a /sys of its own, which
   * hides the cgroup2 mount a controller attaches to.
   */
  netOnly?: boolean;
}

class Lab {
  readonly cgroupRoot = defaultCgroupPath();
  readonly cgroupPath: string;
  readonly bpffsMount = mkdtempSync(join(tmpdir(), `${TAG}-bpffs-`));
  readonly bpffsPath = join(this.bpffsMount, 'ipvs-node-controller');
  readonly scratch = mkdtempSync(join(tmpdir(), `${TAG}-scratch-`));
  private readonly children = new Set<ChildProcess>();

  constructor() {
    if (!this.cgroupRoot) expect.fail('no cgroup2 mount in /proc/mounts');
    this.cgroupPath = join(this.cgroupRoot, `ipvs-node-controller-test-${process.pid}`);
  }

  setup(): void {
    assertIsolatedNetns();
    run('mount', ['-t', 'bpf', 'bpf', this.bpffsMount]);
    mkdirSync(this.cgroupPath);
    for (const ns of [NODE_NS, POD_NS]) {
      run('ip', ['netns', 'add', ns]);
      run('ip', ['-n', ns, 'link', 'set', 'lo', 'up']);
    }
    run('ip', ['-n', NODE_NS, 'link', 'add', 'kube-ipvs0', 'type', 'bridge']);
    run('ip', ['-n', NODE_NS, 'link', 'set', 'kube-ipvs0', 'up']);
    run('ip', ['-n', NODE_NS, 'link', 'add', 'veth-pod', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', POD_NS]);
    run('ip', ['-n', NODE_NS, 'link', 'set', 'veth-pod', 'up']);
    run('ip', ['-n', POD_NS, 'link', 'set', 'eth0', 'up']);
    for (const family of ['ipv4', 'ipv6'] as const) {
      const a = ADDR[family];
      const v = family === 'ipv4' ? '-4' : '-6';
      const nodad = family === 'ipv6' ? ['nodad'] : [];
      const host = family === 'ipv4' ? 32 : 128;
      run('ip', [v, '-n', NODE_NS, 'addr', 'add', `${a.cluster}/${host}`, 'dev', 'kube-ipvs0', ...nodad]);
      run('ip', [v, '-n', NODE_NS, 'addr', 'add', `${a.external}/${host}`, 'dev', 'kube-ipvs0', ...nodad]);
      run('ip', [v, '-n', NODE_NS, 'addr', 'add', `${a.nodeSide}/${a.prefix}`, 'dev', 'veth-pod', ...nodad]);
      run('ip', [v, '-n', POD_NS, 'addr', 'add', `${a.pod}/${a.prefix}`, 'dev', 'eth0', ...nodad]);
      run('ip', [v, '-n', POD_NS, 'route', 'add', 'default', 'via', a.nodeSide]);
    }
  }

  teardown(): void {
    for (const child of this.children) child.kill('SIGKILL');
    this.children.clear();
    // A pinned link would keep programs attached to the cgroup: remove the pins first.
    if (existsSync(this.bpffsPath)) rmSync(this.bpffsPath, { recursive: true, force: true });
    tryRun('umount', [this.bpffsMount]);
    tryRun('rmdir', [this.bpffsMount]);
    for (const ns of [POD_NS, NODE_NS]) tryRun('ip', ['netns', 'del', ns]);
    rmSync(this.scratch, { recursive: true, force: true });
    // rmdir fails while a process is still in the cgroup; the killed ones leave it shortly.
    for (let i = 0; i < 50 && existsSync(this.cgroupPath); i++) {
      try {
        rmdirSync(this.cgroupPath);
      } catch {
        execFileSync('sleep', ['0.1']);
      }
    }
  }

  /** Starts the peer script; resolves with the process and its first JSON line. */
  start(where: Where | undefined, args: string[]): { child: ChildProcess; first: Promise<Record<string, unknown>> } {
    const peer = [process.execPath, PEER, ...args];
    const enter = !where
      ? []
      : where.netOnly
        ? ['nsenter', `--net=/run/netns/${where.ns}`]
        : ['ip', 'netns', 'exec', where.ns];
    const inNs = [...enter, ...peer];
    // Joining the cgroup before exec: everything the client creates is under the cgroup.
    const child =
      where?.inCgroup === true
        ? spawn('sh', ['-c', 'echo $$ > "$0" && exec "$@"', join(this.cgroupPath, 'cgroup.procs'), ...inNs], {
            stdio: ['ignore', 'pipe', 'inherit'],
          })
        : spawn(inNs[0]!, inNs.slice(1), { stdio: ['ignore', 'pipe', 'inherit'] });
    this.children.add(child);
    child.on('exit', () => this.children.delete(child));
    const lines = createInterface({ input: child.stdout! });
    const first = new Promise<Record<string, unknown>>((resolve, reject) => {
      lines.once('line', (line) => resolve(JSON.parse(line) as Record<string, unknown>));
      child.once('exit', (code) => reject(new Error(`${args.join(' ')} exited with ${code} before printing`)));
    });
    return { child, first };
  }

  async client(where: Where, args: string[]): Promise<Record<string, unknown>> {
    return this.start(where, args).first;
  }
}

function bpftoolJson(args: string[]): unknown {
  const out = run('bpftool', ['-j', ...args]).trim();
  // bpftool prints nothing at all for a cgroup without programs.
  return out === '' ? [] : JSON.parse(out);
}

function cgroupPrograms(cgroupPath: string): Array<{ id: number; attach_type: string; name: string }> {
  return bpftoolJson(['cgroup', 'show', cgroupPath]) as Array<{ id: number; attach_type: string; name: string }>;
}

function objectExists(kind: 'prog' | 'link', id: number): boolean {
  try {
    run('bpftool', [kind, 'show', 'id', String(id)]);
    return true;
  } catch {
    return false;
  }
}

async function waitUntil(what: string, check: () => boolean): Promise<void> {
  // Freeing BPF objects is deferred by the kernel (RCU): give it a bounded while.
  for (let i = 0; i < 100; i++) {
    if (check()) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  expect.fail(`still not true after 5 s: ${what}`);
}

describe('ebpf backend on the kernel', function () {
  this.timeout(60_000);
  const lab = new Lab();
  let backend: Reconciler;
  const inCgroup = (ns: string): Where => ({ ns, inCgroup: true });
  const outside = (ns: string): Where => ({ ns, inCgroup: false });

  before(async function () {
    if (process.getuid?.() !== 0) throw new Error('kernel tests run as root (test/run.mjs)');
    lab.setup();
    const servers: Array<Promise<unknown>> = [];
    for (const family of ['ipv4', 'ipv6'] as const) {
      servers.push(lab.start(outside(NODE_NS), ['server', ADDR[family].cluster, String(PORT), 'cluster']).first);
      servers.push(lab.start(outside(NODE_NS), ['server', ADDR[family].external, String(PORT), 'external']).first);
      servers.push(
        lab.start(outside(NODE_NS), ['server', ADDR[family].external, String(OTHER_PORT), 'external']).first,
      );
    }
    await Promise.all(servers);
    backend = new Reconciler(new EbpfDriver({ cgroupPath: lab.cgroupPath, bpffsPath: lab.bpffsPath }));
  });

  after(async function () {
    await backend?.close();
    lab.teardown();
  });

  it('probe finds everything it needs on this kernel', async function () {
    const probe = await backend.driver.probe();
    expect(probe.ok, probe.detail).to.equal(true);
    expect(probe.detail).to.match(/libbpf/);
    expect(probe.detail).to.match(/is not the root cgroup: only processes below it are translated/);
  });

  it('probe names a missing cgroup v2 directory and a path that is not on bpffs', async function () {
    const wrong = new Reconciler(new EbpfDriver({ cgroupPath: lab.scratch, bpffsPath: join(lab.scratch, 'pins') }));
    const probe = await wrong.driver.probe();
    expect(probe.ok).to.equal(false);
    expect(probe.detail).to.match(/is not a cgroup v2 directory/);
    expect(probe.detail).to.match(/is not on a bpffs mount/);
  });

  it('a sync that cannot attach rejects with the reason, and leaves nothing attached', async function () {
    const notCgroup = new Reconciler(new EbpfDriver({ cgroupPath: lab.scratch, bpffsPath: lab.bpffsPath }));
    expect(await rejectionOf(notCgroup.sync(desiredOf(ALL_ENTRIES), { full: true })))
      .to.include({ name: 'BackendError' })
      .and.to.have.property('message')
      .that.matches(new RegExp(`^ebpf attach failed: ${lab.scratch} is not a cgroup v2 directory`));
    const noObject = new Reconciler(
      new EbpfDriver({
        cgroupPath: lab.cgroupPath,
        bpffsPath: lab.bpffsPath,
        objectPath: join(lab.scratch, 'absent.bpf.o'),
      }),
    );
    expect(await rejectionOf(noObject.sync(desiredOf(ALL_ENTRIES), { full: true })))
      .to.have.property('message')
      .that.matches(/^ebpf attach failed: open BPF object .*absent\.bpf\.o: No such file or directory/);
    expect(cgroupPrograms(lab.cgroupPath)).to.deep.equal([]);
    await noObject.cleanup();
  });

  it('before any sync, a client in the cgroup reaches the external IP itself', async function () {
    const r = await lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(PORT)]);
    expect(String(r.reply)).to.match(/^external /);
  });

  it('attaches the eight programs to the cgroup and pins links, programs and maps', async function () {
    const result = await backend.sync(desiredOf(ALL_ENTRIES), { full: true });
    expect(result).to.deep.equal({ mode: 'full', entries: { ipv4: 2, ipv6: 2 }, rejected: [] });
    const attached = cgroupPrograms(lab.cgroupPath);
    expect(attached.map((p) => p.attach_type).sort()).to.deep.equal([
      'cgroup_inet4_connect',
      'cgroup_inet4_getpeername',
      'cgroup_inet6_connect',
      'cgroup_inet6_getpeername',
      'cgroup_udp4_recvmsg',
      'cgroup_udp4_sendmsg',
      'cgroup_udp6_recvmsg',
      'cgroup_udp6_sendmsg',
    ]);
    expect(readdirSync(join(lab.bpffsPath, 'maps')).sort()).to.deep.equal([
      'entries_v4',
      'entries_v6',
      'node_netns',
      'socket_origins',
      'translated',
    ]);
    expect(readdirSync(join(lab.bpffsPath, 'links'))).to.have.lengthOf(8);
    expect(readdirSync(join(lab.bpffsPath, 'programs'))).to.have.lengthOf(8);
  });

  for (const family of ['ipv4', 'ipv6'] as const) {
    for (const ns of [POD_NS, NODE_NS]) {
      const where = ns === POD_NS ? 'a pod namespace' : 'the node namespace';
      it(`${family} TCP from ${where}: answered by the ClusterIP, getpeername shows the external IP`, async function () {
        const r = await lab.client(inCgroup(ns), ['tcp', ADDR[family].external, String(PORT)]);
        expect(r.error).to.equal(undefined);
        expect(r.peer).to.equal(ADDR[family].external);
        expect(r.peerPort).to.equal(PORT);
        const [tag, seenSource] = String(r.reply).split(' ');
        expect(tag).to.equal('cluster');
        // Nothing is NATed: the server sees the client's own address.
        if (ns === POD_NS) expect(seenSource).to.equal(ADDR[family].pod);
      });

      it(`${family} unconnected UDP from ${where}: the reply comes from the external IP`, async function () {
        const r = await lab.client(inCgroup(ns), ['udp', ADDR[family].external, String(PORT)]);
        expect(r.error).to.equal(undefined);
        expect(String(r.reply)).to.match(/^cluster /);
        expect(r.from).to.equal(ADDR[family].external);
        expect(r.fromPort).to.equal(PORT);
      });
    }

    it(`${family} connected UDP from a pod namespace: peer and reply source are the external IP`, async function () {
      const r = await lab.client(inCgroup(POD_NS), ['udp-connected', ADDR[family].external, String(PORT)]);
      expect(r.error).to.equal(undefined);
      expect(String(r.reply)).to.match(/^cluster /);
      expect(r.peer).to.equal(ADDR[family].external);
      expect(r.from).to.equal(ADDR[family].external);
    });

    it(`${family}: a port of the external IP that is no entry is not translated`, async function () {
      const r = await lab.client(inCgroup(POD_NS), ['tcp', ADDR[family].external, String(OTHER_PORT)]);
      expect(String(r.reply)).to.match(/^external /);
    });

    it(`${family}: a process outside the cgroup is not translated`, async function () {
      const tcp = await lab.client(outside(POD_NS), ['tcp', ADDR[family].external, String(PORT)]);
      expect(String(tcp.reply)).to.match(/^external /);
      const udp = await lab.client(outside(POD_NS), ['udp', ADDR[family].external, String(PORT)]);
      expect(String(udp.reply)).to.match(/^external /);
    });
  }

  it('an IPv6 socket connecting to an IPv4-mapped external IP is translated too', async function () {
    const mapped = `::ffff:${ADDR.ipv4.external}`;
    const r = await lab.client(inCgroup(POD_NS), ['tcp', mapped, String(PORT)]);
    expect(r.error).to.equal(undefined);
    expect(String(r.reply)).to.match(/^cluster /);
    expect(r.peer).to.equal(mapped);
  });

  it('the pinned maps have the layout the codec writes', async function () {
    const load = loadEbpfAddon();
    if (!load.ok) expect.fail('expected load.ok');
    for (const [family, name] of [
      ['ipv4', 'entries_v4'],
      ['ipv6', 'entries_v6'],
    ] as const) {
      const map: PinnedMap = new load.addon.PinnedMap(join(lab.bpffsPath, 'maps', name));
      try {
        expect(map.keySize).to.equal(KEY_SIZE[family]);
        expect(map.valueSize).to.equal(VALUE_SIZE[family]);
        const dump = await map.dump();
        const elements = decodeElements(family, dump.keys, dump.values);
        expect(
          elements.map((e) => `${e.externalIp} ${e.protocol} ${e.port} -> ${e.clusterIp} ${e.clusterPort}`).sort(),
        ).to.deep.equal(
          ALL_ENTRIES.filter((e) => e.family === family)
            .map((e) => `${e.externalIp} ${e.protocol} ${e.port} -> ${e.clusterIp} ${e.port}`)
            .sort(),
        );
      } finally {
        map.close();
      }
    }
  });

  it('a partial sync removing an entry removes its translation and nothing else', async function () {
    const without = ALL_ENTRIES.filter((e) => !(e.family === 'ipv4' && e.protocol === 'TCP'));
    const result = await backend.sync(desiredOf(without), { full: false });
    expect(result.mode).to.equal('partial');
    const tcp = await lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(PORT)]);
    expect(String(tcp.reply)).to.match(/^external /);
    expect(tcp.peer).to.equal(ADDR.ipv4.external);
    const udp = await lab.client(inCgroup(POD_NS), ['udp', ADDR.ipv4.external, String(PORT)]);
    expect(String(udp.reply)).to.match(/^cluster /);
    expect((await backend.sync(desiredOf(without), { full: false })).mode).to.equal('noop');
    // Put it back for the next tests.
    expect((await backend.sync(desiredOf(ALL_ENTRIES), { full: false })).mode).to.equal('partial');
    const again = await lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(PORT)]);
    expect(String(again.reply)).to.match(/^cluster /);
  });

  it('a full sync removes elements someone else wrote and rewrites changed ones', async function () {
    const load = loadEbpfAddon();
    if (!load.ok) expect.fail('expected load.ok');
    const map: PinnedMap = new load.addon.PinnedMap(join(lab.bpffsPath, 'maps', 'entries_v4'));
    try {
      const stray = { ...entry('ipv4', 'TCP', 9999) };
      const hijacked = { ...entry('ipv4', 'UDP'), clusterIp: '10.96.0.99' };
      await map.update(encodeKeys('ipv4', [stray, hijacked]), encodeValues('ipv4', [stray, hijacked]));
      expect((await backend.sync(desiredOf(ALL_ENTRIES), { full: false })).mode, 'partial trusts its memory').to.equal(
        'noop',
      );
      expect((await backend.sync(desiredOf(ALL_ENTRIES), { full: true })).mode).to.equal('full');
      const dump = await map.dump();
      const elements = decodeElements('ipv4', dump.keys, dump.values);
      expect(elements.map((e) => `${e.protocol} ${e.port} -> ${e.clusterIp}`).sort()).to.deep.equal([
        `TCP ${PORT} -> ${ADDR.ipv4.cluster}`,
        `UDP ${PORT} -> ${ADDR.ipv4.cluster}`,
      ]);
    } finally {
      map.close();
    }
  });

  it('a partial sync at 10,000 Services writes the changed elements and no other', async function () {
    const filler = (i: number, over: Partial<ServiceInfo> = {}): ServiceInfo => ({
      namespace: 'fill',
      name: `svc-${i}`,
      creationTimestamp: '2024-01-01T00:00:00Z',
      type: 'LoadBalancer',
      clusterIPs: [`10.97.${i >> 8}.${i & 255}`],
      ports: [{ port: 443, protocol: 'TCP' }],
      ingress: [{ ip: `198.18.${i >> 8}.${i & 255}` }],
      ...over,
    });
    const model = new DesiredStateModel(CONFIG);
    const services = Array.from({ length: 10_000 }, (_, i) => filler(i));
    const first = model.update(services, NODE);
    expect(first.ipv4.entries).to.have.lengthOf(10_000);
    expect((await backend.sync(first, { full: true })).mode).to.equal('full');

    // Someone else rewrites an element that no change below touches: a partial sync that wrote
    // every element would put it back.
    const load = loadEbpfAddon();
    if (!load.ok) expect.fail(load.reason);
    const map: PinnedMap = new load.addon.PinnedMap(join(lab.bpffsPath, 'maps', 'entries_v4'));
    const untouched = first.ipv4.entries.find((e) => e.service === 'fill/svc-5')!;
    const hijacked = { ...untouched, clusterIp: '10.96.0.99' };
    try {
      await map.update(encodeKeys('ipv4', [hijacked]), encodeValues('ipv4', [hijacked]));
    } finally {
      map.close();
    }

    const written = { ...(backend.driver as EbpfDriver).written.ipv4 };
    const next = services.filter((_, i) => i !== 3); // svc-3 goes
    next[1] = filler(1, { clusterIPs: ['10.98.0.1'] }); // svc-1 changes its ClusterIP
    next[2] = filler(2, { name: 'renamed-2' }); // same element, another Service: nothing to write
    next.push(filler(20_000)); // a new one
    const desired = model.update(next, NODE);
    expect((await backend.sync(desired, { full: false })).mode).to.equal('partial');
    expect((backend.driver as EbpfDriver).written.ipv4).to.deep.equal({
      upserted: written.upserted + 2,
      deleted: written.deleted + 1,
    });
    const withHijack = elementsOf(desired.ipv4.entries.map((e) => (e.service === 'fill/svc-5' ? hijacked : e)));
    expect(await mapElements(lab.bpffsPath, 'ipv4')).to.deep.equal(withHijack);

    // A Service renamed, nothing else: no element changes.
    next[next.findIndex((svc) => svc.name === 'svc-4')] = filler(4, { name: 'renamed-4' });
    expect((await backend.sync(model.update(next, NODE), { full: false })).mode).to.equal('noop');
    expect((backend.driver as EbpfDriver).written.ipv4).to.deep.equal({
      upserted: written.upserted + 2,
      deleted: written.deleted + 1,
    });

    // A full sync compares with the map and repairs the one element, writing nothing else.
    const repaired = model.update(next, NODE);
    expect((await backend.sync(repaired, { full: true })).mode).to.equal('full');
    expect((backend.driver as EbpfDriver).written.ipv4).to.deep.equal({
      upserted: written.upserted + 3,
      deleted: written.deleted + 1,
    });
    expect(await mapElements(lab.bpffsPath, 'ipv4')).to.deep.equal(elementsOf(repaired.ipv4.entries));

    // Back to the lab's entries, from a desired state the model did not make (no change hints).
    expect((await backend.sync(desiredOf(ALL_ENTRIES), { full: false })).mode).to.equal('partial');
    expect((backend.driver as EbpfDriver).written.ipv4.deleted).to.equal(written.deleted + 1 + 10_000);
    expect(await mapElements(lab.bpffsPath, 'ipv4')).to.deep.equal(
      elementsOf(ALL_ENTRIES.filter((e) => e.family === 'ipv4')),
    );
    const r = await lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(PORT)]);
    expect(String(r.reply)).to.match(/^cluster /);
  });

  it('partial syncs driven by the model keep the maps equal to the desired entries through random changes', async function () {
    const addresses = { clusterV4: '10.97', clusterV6: 'fd00:97::', ingressV6: '2001:db8:1::' };
    const partial = await churnedSyncs(
      (d, o) => backend.sync(d, o),
      NODE,
      11,
      addresses,
      async (desired, step) => {
        for (const family of ['ipv4', 'ipv6'] as const) {
          expect(await mapElements(lab.bpffsPath, family), `step ${step}, ${family}`).to.deep.equal(
            elementsOf(desired[family].entries),
          );
        }
      },
    );
    expect(partial, `most syncs were partial (${partial})`).to.be.above(40);
    expect((await backend.sync(desiredOf(ALL_ENTRIES), { full: false })).mode).to.equal('partial');
    for (const family of ['ipv4', 'ipv6'] as const) {
      expect(await mapElements(lab.bpffsPath, family)).to.deep.equal(
        elementsOf(ALL_ENTRIES.filter((e) => e.family === family)),
      );
    }
  });

  it('keeps translating while the controller process is killed and restarted on the same pins', async function () {
    await backend.close();
    const entriesJson = JSON.stringify(ALL_ENTRIES);
    const controllerArgs = ['controller', lab.cgroupPath, lab.bpffsPath, entriesJson];
    const first = lab.start(undefined, controllerArgs);
    const firstReady = await first.first;
    expect(firstReady.ready, JSON.stringify(firstReady)).to.equal(true);

    // A client connecting one connection after another through the whole restart.
    const stopFile = join(lab.scratch, 'stop-loop');
    const loop = lab.start(inCgroup(POD_NS), ['tcp-loop', ADDR.ipv4.external, String(PORT), stopFile]);

    first.child.kill('SIGKILL');
    await new Promise((r) => first.child.once('exit', r));
    // The controller is down: new connections still go to the ClusterIP.
    for (const family of ['ipv4', 'ipv6'] as const) {
      const tcp = await lab.client(inCgroup(POD_NS), ['tcp', ADDR[family].external, String(PORT)]);
      expect(String(tcp.reply), `${family} TCP while the controller is down`).to.match(/^cluster /);
      expect(tcp.peer).to.equal(ADDR[family].external);
      const udp = await lab.client(inCgroup(NODE_NS), ['udp', ADDR[family].external, String(PORT)]);
      expect(String(udp.reply), `${family} UDP while the controller is down`).to.match(/^cluster /);
    }

    const second = lab.start(undefined, controllerArgs);
    // Connections made while the new process loads, attaches and syncs.
    const during = lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(PORT)]);
    const secondReady = (await second.first) as {
      ready: boolean;
      mode: string;
      links: Array<{ name: string; link: string; linkId: number }>;
      maps: Array<{ name: string; id: number; reused: boolean }>;
    };
    expect(String((await during).reply)).to.match(/^cluster /);
    expect(secondReady.ready, JSON.stringify(secondReady)).to.equal(true);
    // The new process re-used the maps and swapped its programs into the same links.
    const firstMaps = firstReady.maps as Array<{ name: string; id: number }>;
    expect(secondReady.maps.map((m) => [m.name, m.id, m.reused])).to.deep.equal(
      firstMaps.map((m) => [m.name, m.id, true]),
    );
    const firstLinks = firstReady.links as Array<{ name: string; linkId: number }>;
    expect(secondReady.links.map((l) => [l.name, l.linkId, l.link])).to.deep.equal(
      firstLinks.map((l) => [l.name, l.linkId, 'updated']),
    );

    const after = await lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(PORT)]);
    expect(String(after.reply)).to.match(/^cluster /);
    writeFileSync(stopFile, '');
    const loopResult = (await new Promise<Record<string, unknown>>((resolve) => {
      const out: string[] = [];
      loop.child.stdout!.on('data', (d) => out.push(String(d)));
      loop.child.once('exit', () =>
        resolve(JSON.parse(out.join('').trim().split('\n').pop()!) as Record<string, unknown>),
      );
    })) as { attempts: number; replies: Record<string, number>; errors: string[] };
    expect(loopResult.errors).to.deep.equal([]);
    expect(Object.keys(loopResult.replies)).to.deep.equal([`${ADDR.ipv4.external} cluster`]);
    expect(loopResult.attempts).to.be.above(0);
    second.child.kill('SIGKILL');
    await new Promise((r) => second.child.once('exit', r));
  });

  it('counts each translation by family and source, across restarts and over pins without counters', async function () {
    // The node is where the attaching controller runs: here, the node namespace.
    const controllerArgs = ['controller', lab.cgroupPath, lab.bpffsPath, JSON.stringify(ALL_ENTRIES)];
    const inNode: Where = { ns: NODE_NS, inCgroup: false, netOnly: true };
    const startController = async () => {
      const started = lab.start(inNode, controllerArgs);
      const ready = (await started.first) as {
        ready: boolean;
        nodeNetnsCookie: string;
        maps: Array<{ name: string; reused: boolean }>;
      };
      expect(ready.ready, JSON.stringify(ready)).to.equal(true);
      // The node's namespace cookie, which the kernel tells from Linux 5.14 on (SO_NETNS_COOKIE).
      expect(ready.nodeNetnsCookie, 'a kernel before 5.14 counts the initial namespace as the node').to.match(/^[1-9]/);
      return { ...started, ready };
    };
    const stop = async (child: ChildProcess) => {
      child.kill('SIGKILL');
      if (child.exitCode === null && child.signalCode === null) await new Promise((r) => child.once('exit', r));
    };
    // A new driver over the pinned state each time: no attach, the counters read from the pins.
    const counts = async () =>
      Object.fromEntries(
        (await new EbpfDriver({ cgroupPath: lab.cgroupPath, bpffsPath: lab.bpffsPath }).translatedConnections()).map(
          (r) => [`${r.family} ${r.source}`, r.connections],
        ),
      );
    const moved = (before: Record<string, number>, after: Record<string, number>) =>
      Object.fromEntries(Object.keys(after).map((k) => [k, after[k]! - (before[k] ?? 0)]));
    const translatedBy = async (where: Where, args: string[]) => {
      const r = await lab.client(where, args);
      expect(r.error, args.join(' ')).to.equal(undefined);
      expect(String(r.reply), args.join(' ')).to.match(/^cluster /);
    };
    const port = String(PORT);

    const first = await startController();
    const before = await counts();
    expect(Object.keys(before).sort()).to.deep.equal(['ipv4 node', 'ipv4 pods', 'ipv6 node', 'ipv6 pods']);
    await translatedBy(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, port]);
    await translatedBy(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, port]);
    // A connected UDP socket: its connect() counts, its datagram (no address) is not looked at.
    await translatedBy(inCgroup(POD_NS), ['udp-connected', ADDR.ipv4.external, port]);
    // Unconnected UDP: every datagram is translated and counted, three on one socket.
    await translatedBy(inCgroup(POD_NS), ['udp', ADDR.ipv4.external, port, '3']);
    // An IPv6 socket to an IPv4-mapped address: translated by the IPv4 entries, counted as IPv4.
    await translatedBy(inCgroup(POD_NS), ['tcp', `::ffff:${ADDR.ipv4.external}`, port]);
    await translatedBy(inCgroup(NODE_NS), ['tcp', ADDR.ipv4.external, port]);
    await translatedBy(inCgroup(POD_NS), ['tcp', ADDR.ipv6.external, port]);
    await translatedBy(inCgroup(NODE_NS), ['udp', ADDR.ipv6.external, port, '2']);
    // Not translated, not counted: a port with no entry, a process outside the cgroup.
    const untranslated = [
      await lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(OTHER_PORT)]),
      await lab.client(inCgroup(NODE_NS), ['udp', ADDR.ipv6.external, String(OTHER_PORT)]),
      await lab.client(outside(POD_NS), ['tcp', ADDR.ipv4.external, port]),
      await lab.client(outside(NODE_NS), ['udp', ADDR.ipv6.external, port]),
    ];
    expect(untranslated.map((r) => String(r.reply).split(' ')[0])).to.deep.equal(Array(4).fill('external'));
    const afterFirst = await counts();
    expect(moved(before, afterFirst)).to.deep.equal({
      'ipv4 pods': 7,
      'ipv4 node': 1,
      'ipv6 pods': 1,
      'ipv6 node': 2,
    });

    // Killed: the counts stay in the pinned map, and the programs go on counting.
    await stop(first.child);
    expect(await counts()).to.deep.equal(afterFirst);
    await translatedBy(inCgroup(POD_NS), ['tcp', ADDR.ipv6.external, port]);
    // A restart re-uses the map: nothing is reset.
    const second = await startController();
    expect(second.ready.maps.find((m) => m.name === 'translated')?.reused).to.equal(true);
    await translatedBy(inCgroup(NODE_NS), ['tcp', ADDR.ipv4.external, port]);
    expect(moved(afterFirst, await counts())).to.deep.equal({
      'ipv4 pods': 0,
      'ipv4 node': 1,
      'ipv6 pods': 1,
      'ipv6 node': 0,
    });
    await stop(second.child);

    // The pins of a release without counters: the map is absent, so nothing is read; the next
    // controller makes it (the other maps are re-used) and counts from 0.
    unlinkSync(join(lab.bpffsPath, 'maps', 'translated'));
    unlinkSync(join(lab.bpffsPath, 'maps', 'node_netns'));
    expect(await counts()).to.deep.equal({});
    const third = await startController();
    expect(third.ready.maps.map((m) => `${m.name} ${m.reused}`).sort()).to.deep.equal([
      'entries_v4 true',
      'entries_v6 true',
      'node_netns false',
      'socket_origins true',
      'translated false',
    ]);
    await translatedBy(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, port]);
    await translatedBy(inCgroup(NODE_NS), ['udp', ADDR.ipv4.external, port]);
    expect(await counts()).to.deep.equal({ 'ipv4 pods': 1, 'ipv4 node': 1, 'ipv6 pods': 0, 'ipv6 node': 0 });
    await stop(third.child);
  });

  it('cleanup removes programs, links and pins; a second cleanup succeeds', async function () {
    const ids = cgroupPrograms(lab.cgroupPath).map((p) => p.id);
    expect(ids).to.have.lengthOf(8);
    const links = (bpftoolJson(['link', 'show']) as Array<{ id: number; prog_id: number }>).filter((l) =>
      ids.includes(l.prog_id),
    );
    expect(links).to.have.lengthOf(8);

    const fresh = new Reconciler(new EbpfDriver({ cgroupPath: lab.cgroupPath, bpffsPath: lab.bpffsPath }));
    expect(await fresh.driver.hasState!()).to.equal(true);
    await fresh.cleanup();
    expect(cgroupPrograms(lab.cgroupPath)).to.deep.equal([]);
    expect(existsSync(lab.bpffsPath)).to.equal(false);
    expect(await fresh.driver.hasState!()).to.equal(false);
    await waitUntil(
      'links and programs are freed',
      () => links.every((l) => !objectExists('link', l.id)) && ids.every((id) => !objectExists('prog', id)),
    );
    const r = await lab.client(inCgroup(POD_NS), ['tcp', ADDR.ipv4.external, String(PORT)]);
    expect(String(r.reply)).to.match(/^external /);

    await fresh.cleanup();
    expect(cgroupPrograms(lab.cgroupPath)).to.deep.equal([]);
  });
});
