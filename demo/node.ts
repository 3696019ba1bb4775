// The demo's node, run by demo/run.ts inside a network and mount namespace of its own: pods, a
// second node with the Services' endpoint, kube-proxy 1.24+'s IPVS forwarding (demo/cluster.ts),
// the API stand-in with example Services, then the real controller, with probes before and after,
// and a live view of the rules while the user changes Services with kubectl.
// Usage: node dist/demo/node.js --workdir DIR --api-port N --metrics-port N --healthz-port N

import { execFile, spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { chownSync, closeSync, openSync, readFileSync } from 'node:fs';
import http from 'node:http';
import type net from 'node:net';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import YAML from 'yaml';
import { MAP_NAME, TABLE_NAME } from '../src/backends/nft/render.js';
import { ApiStandIn } from '../testbed/api-server.js';
import { assertIsolatedNetns, sh } from '../testbed/node-network.js';
import {
  DemoNode,
  ENDPOINT,
  IpvsStandIn,
  NODE_ADDRESS,
  NODE_NAME,
  OTHER_NODE,
  assignLoadBalancerIps,
  type VirtualService,
} from './cluster.js';
import { relayUnixToTcp } from './relay.js';
import { LAUNCHER } from '../testbed/shipped-controller.js';

const here = dirname(fileURLToPath(import.meta.url));
const PROBE_CLIENT = join(here, '..', 'testbed', 'probe-client.js');
/** demo/ of the source tree, beside dist/. */
export const DEMO_SOURCES = join(here, '..', '..', 'demo');
const LB_POOL = Array.from({ length: 240 }, (_, i) => `203.0.113.${10 + i}`);

type Json = Record<string, any>;

// The reader of stdout may go away (`npm start | tee log`, then Ctrl-C ends tee first): what is
// said is then lost, but the demo still stops and tears down. Node ignores SIGPIPE, so a write
// to a closed pipe is an EPIPE error event, which would otherwise crash before the teardown.
let stdoutOpen = true;
process.stdout.on('error', () => (stdoutOpen = false));
process.stderr.on('error', () => undefined);
const say = (line = '') => {
  if (stdoutOpen) process.stdout.write(`${line}\n`);
};

/** Thrown out of whatever step runs when Ctrl-C (SIGINT) or SIGTERM asks the demo to stop. */
class Interrupted extends Error {}

/** Aborted on SIGINT/SIGTERM: every wait of the demo and every probe process ends at once. */
const stop = new AbortController();
const onStop = new Promise<never>((_resolve, reject) =>
  stop.signal.addEventListener('abort', () => reject(new Interrupted('stopped'))),
);
onStop.catch(() => undefined);
/** `promise`, or Interrupted as soon as the demo is asked to stop. */
const untilStopped = <T>(promise: Promise<T>): Promise<T> => Promise.race([promise, onStop]);
const pause = (ms: number) => untilStopped(new Promise((r) => setTimeout(r, ms)));

function options() {
  const { values } = parseArgs({
    options: {
      workdir: { type: 'string' },
      'api-port': { type: 'string' },
      'metrics-port': { type: 'string' },
      'healthz-port': { type: 'string' },
    },
  });
  const port = (name: 'api-port' | 'metrics-port' | 'healthz-port') => {
    const n = Number(values[name]);
    if (!Number.isInteger(n) || n < 1 || n > 65535) throw new Error(`--${name} must be a port number`);
    return n;
  };
  if (!values.workdir) throw new Error('--workdir is required');
  return {
    workdir: values.workdir,
    apiPort: port('api-port'),
    metricsPort: port('metrics-port'),
    healthzPort: port('healthz-port'),
  };
}

function objectsOf(text: string): Json[] {
  return YAML.parseAllDocuments(text)
    .map((d) => d.toJSON() as Json | null)
    .filter((o): o is Json => o !== null);
}

/** The invoking user (behind sudo) gets the kubeconfig, so that kubectl works without sudo. */
function handToInvokingUser(path: string): void {
  const uid = Number(process.env.SUDO_UID);
  const gid = Number(process.env.SUDO_GID);
  if (Number.isInteger(uid) && uid > 0 && Number.isInteger(gid)) chownSync(path, uid, gid);
}

function httpStatus(url: string): Promise<number> {
  return new Promise((resolve) => {
    http
      .get(url, { agent: false }, (res) => {
        res.resume();
        resolve(res.statusCode ?? 0);
      })
      .on('error', () => resolve(0));
  });
}

interface MapEntry {
  key: string;
  ip: string;
  protocol: string;
  port: number;
  clusterIp: string;
  service: string;
}

/** The controller's IPv4 map as the kernel holds it; empty while the table does not exist. */
function programmedEntries(): Map<string, MapEntry> {
  const out = new Map<string, MapEntry>();
  let listing: { nftables: Array<{ map?: { elem?: Array<[Json, string]> } }> };
  try {
    listing = JSON.parse(sh('nft', ['-j', 'list', 'map', 'ip', TABLE_NAME, MAP_NAME]));
  } catch {
    return out;
  }
  for (const [key, clusterIp] of listing.nftables.find((o) => o.map)?.map?.elem ?? []) {
    const elem = key.elem ?? { val: key };
    const [ip, protocol, port] = elem.val.concat as [string, string, number];
    const k = `${ip} ${protocol} ${port}`;
    out.set(k, { key: k, ip, protocol, port, clusterIp, service: elem.comment ?? '' });
  }
  return out;
}

const WHERE_WIDTH = 24;

/** What the probe client printed, from inside the pod's namespace (none: the node's). */
function probe(ns: string | undefined, protocol: string, address: string, port: number, timeoutMs: number) {
  const args = [PROBE_CLIENT, protocol, address, String(port), String(timeoutMs)];
  const [cmd, argv] = ns ? ['ip', ['netns', 'exec', ns, process.execPath, ...args]] : [process.execPath, args];
  return untilStopped(
    new Promise<string>((resolve) =>
      // Killed on stop; a probe that ended without an answer (killed by a Ctrl-C meant for the
      // whole terminal) prints nothing, which must never read as a success.
      execFile(cmd, argv as string[], { signal: stop.signal, timeout: timeoutMs + 5000 }, (err, stdout) =>
        resolve(err ? '' : stdout.trim()),
      ),
    ),
  );
}

/** How long a probe waits for an answer: the node's connection before the controller never gets one. */
const PROBE_TIMEOUT_MS = 2000;

interface Client {
  label: string;
  ns?: string;
  /** The pod's own address; none: the node. */
  ip?: string;
}

/** Who the endpoint's answer says it saw, next to who connected. */
function seenAs(client: Client, seen: string): string {
  if (client.ip && seen === client.ip) return `${seen} (the pod's own address)`;
  if (seen === NODE_ADDRESS) return `${seen} (the node's address: masqueraded)`;
  return seen;
}

async function probeLine(from: Client, vip: VirtualService, timeoutMs = PROBE_TIMEOUT_MS): Promise<string> {
  const answer = await probe(from.ns, vip.protocol === 'UDP' ? 'udp' : 'tcp', vip.ip, vip.port, timeoutMs);
  const target = `${vip.ip}:${vip.port}/${vip.protocol.toLowerCase()}`;
  // The endpoint answers with its Service's namespace/name and the client address it saw (and the
  // probe adds a UDP answer's source after that).
  const [, service, seen] = /^([a-z0-9-]+\/[a-z0-9-]+) (\S+)(?= |$)/.exec(answer) ?? [];
  const verdict =
    service && seen
      ? `ok ${service}'s endpoint saw ${seenAs(from, seen)}`
      : answer === 'timeout'
        ? `x  timed out (no answer within ${timeoutMs / 1000} s)`
        : answer === 'refused'
          ? 'x  refused'
          : answer === ''
            ? 'x  the probe ended without a result'
            : `x  ${answer}`;
  return `   ${from.label.padEnd(WHERE_WIDTH)} -> ${target.padEnd(22)} ${verdict}`;
}

/** Every client to every address at once (a timeout costs its wait once), in order. */
async function probeAll(clients: Client[], vips: VirtualService[]): Promise<string[]> {
  return (await Promise.all(vips.map((vip) => Promise.all(clients.map((c) => probeLine(c, vip)))))).flat();
}

async function main(): Promise<void> {
  const opts = options();
  assertIsolatedNetns();
  const node = new DemoNode();
  const ipvs = new IpvsStandIn(node);
  const relays: net.Server[] = [];
  let api: ApiStandIn | undefined;
  let controller: ChildProcess | undefined;
  const onSignal = () => {
    if (stop.signal.aborted) return;
    say('\nStopping: tearing the demo down ...');
    stop.abort();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  process.on('exit', () => controller?.kill('SIGTERM'));

  try {
    node.setUp();
    const clients: Client[] = [
      { label: 'host network (node)' },
      ...node.pods.map((p) => ({ label: `${p.name} (${p.ip})`, ns: p.ns, ip: p.ip })),
    ];

    api = await untilStopped(ApiStandIn.start({ port: opts.apiPort }));
    for (const obj of objectsOf(readFileSync(join(DEMO_SOURCES, 'services.yaml'), 'utf8'))) api.apply(obj);
    const kubeconfig = join(opts.workdir, 'kubeconfig');
    await api.writeKubeconfig(kubeconfig);
    handToInvokingUser(kubeconfig);
    for (const [name, port] of [
      ['api', opts.apiPort],
      ['metrics', opts.metricsPort],
      ['healthz', opts.healthzPort],
    ] as const) {
      relays.push(await untilStopped(relayUnixToTcp(join(opts.workdir, `${name}.sock`), port)));
    }

    const standIn = api;
    const syncCluster = async () => {
      for (const svc of assignLoadBalancerIps(standIn.list('Service'), LB_POOL)) standIn.apply(svc);
      await untilStopped(ipvs.reconcile(standIn.list('Service')));
    };
    await syncCluster();

    say('ipvs-node-controller demo: a Kubernetes node in network namespaces of its own, and a second node');
    say(
      `   pods ${node.pods.map((p) => `${p.name} ${p.ip}`).join(', ')} on bridge cni0; this node's podCIDR is 10.244.1.0/24,` +
        ` its address ${NODE_ADDRESS}`,
    );
    say(
      `   the Services' endpoint: ${ENDPOINT.address}, a pod on ${OTHER_NODE.name} (${OTHER_NODE.address}); it answers` +
        ' with the client address it sees',
    );
    say('   kube-ipvs0 holds the ClusterIPs and LoadBalancer IPs on both nodes, as kube-proxy in IPVS mode binds them');
    say(`   Kubernetes API stand-in at https://127.0.0.1:${opts.apiPort} with the Services of demo/services.yaml`);
    say();
    const vips = () => ipvs.externalVirtualServices().sort((a, b) => (a.ip + a.port < b.ip + b.port ? -1 : 1));
    say('1. Without the controller, as kube-proxy 1.24+ leaves this node. The Services have externalTrafficPolicy:');
    say('   Local and no endpoint here, so IPVS forwards their LoadBalancer IPs to the endpoint on the other node,');
    say('   unmasqueraded: a pod is answered and keeps its address. The node connects from the LoadBalancer IP');
    say(
      `   itself (it is on kube-ipvs0), which ${OTHER_NODE.name} holds too: nothing comes back and the client times out.`,
    );
    for (const line of await probeAll(clients, vips())) say(line);
    say();

    say('2. Starting the controller (the real CLI) ...');
    const log = openSync(join(opts.workdir, 'controller.log'), 'a');
    // package.json's bin, as users and the image start it.
    controller = spawn(
      process.execPath,
      [
        LAUNCHER,
        `--kubeconfig=${kubeconfig}`,
        `--node-name=${NODE_NAME}`,
        '--min-sync-period=250ms',
        '--log-format=text', // for a person to read: klog's lines, as kube-proxy writes them
        `--metrics-bind-address=127.0.0.1:${opts.metricsPort}`,
        `--healthz-bind-address=127.0.0.1:${opts.healthzPort}`,
      ],
      { stdio: ['ignore', log, log] },
    );
    closeSync(log);
    const readyBy = Date.now() + 30_000;
    while ((await httpStatus(`http://127.0.0.1:${opts.healthzPort}/readyz`)) !== 200) {
      if (controller.exitCode !== null || Date.now() > readyBy) {
        throw new Error(`the controller did not become ready: see ${join(opts.workdir, 'controller.log')}`);
      }
      await pause(100);
    }
    let known = programmedEntries();
    say(`   ready; it programmed ${known.size} translations into table ip ${TABLE_NAME}:`);
    for (const e of known.values()) say(`   + ${e.ip} ${e.protocol} ${e.port} -> ${e.clusterIp}  (${e.service})`);
    for (const line of await probeAll(clients, vips())) say(line);
    say();

    const extra = join(DEMO_SOURCES, 'extra-service.yaml');
    say('3. Your turn. In another terminal:');
    say(`   export KUBECONFIG=${kubeconfig}`);
    say('   kubectl get services -A');
    say(`   kubectl apply --validate=false -f ${extra}   # the demo's load balancer gives it an IP`);
    say(`   kubectl delete -f ${extra}`);
    say(`   curl -s http://127.0.0.1:${opts.metricsPort}/metrics | grep ^ipvs_node_controller_programmed_entries`);
    say(`   curl -s http://127.0.0.1:${opts.healthzPort}/readyz`);
    say(`   The controller's log: ${join(opts.workdir, 'controller.log')}`);
    say('   Rule changes and probes show up below as they happen. Ctrl-C tears it all down.');
    say();

    for (;;) {
      await pause(300);
      await syncCluster();
      const now = programmedEntries();
      const added = [...now.values()].filter((e) => !known.has(e.key));
      const removed = [...known.values()].filter((e) => !now.has(e.key));
      known = now;
      for (const e of removed) say(`   - ${e.ip} ${e.protocol} ${e.port} -> ${e.clusterIp}  (${e.service})`);
      for (const e of added) say(`   + ${e.ip} ${e.protocol} ${e.port} -> ${e.clusterIp}  (${e.service})`);
      for (const e of added) {
        const vip = { ip: e.ip, protocol: e.protocol.toUpperCase(), port: e.port, service: e.service };
        for (const line of await probeAll(clients.slice(0, 2), [vip])) say(line);
      }
    }
  } catch (err) {
    if (!(err instanceof Interrupted)) throw err;
  } finally {
    // Each step on its own: one that fails must not leave the others undone.
    const steps: Array<[string, () => unknown]> = [
      [
        'stop the controller',
        async () => {
          if (controller && controller.exitCode === null && controller.signalCode === null) {
            const exited = once(controller, 'exit');
            controller.kill('SIGTERM');
            await exited;
          }
        },
      ],
      ['close the relays', () => relays.forEach((r) => r.close())],
      ['stop the IPVS stand-in', () => ipvs.stop()],
      ['stop the API stand-in', () => api?.stop()],
      ['remove the pod namespaces', () => node.tearDown()],
    ];
    for (const [what, step] of steps) {
      try {
        await step();
      } catch (err) {
        process.stderr.write(`demo: could not ${what}: ${(err as Error).message}\n`);
      }
    }
  }
  say("Torn down: the demo's namespaces, rules and API stand-in are gone; the machine was not touched.");
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`demo: ${(err as Error).message}\n`);
    process.exit(1);
  },
);
