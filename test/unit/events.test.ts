// Events (--emit-events) on Services and on the Node, recorded through the real client against the
// API stand-in, and read back the way an operator reads them: kubectl describe / get events.

import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { KubeConfig } from '@kubernetes/client-node';
import { ServiceEventRecorder, SKIP_EXPLANATIONS } from '../../src/events/service-events.js';
import {
  KNOWN_ISSUE_REASON,
  NodeKubeProxyEvents,
  RESUMED_REASON,
  STEPPED_ASIDE_REASON,
} from '../../src/events/node-events.js';
import type { KubeProxyStatus } from '../../src/controller/controller.js';
import { eventRecorders } from '../../src/operations/event-service.js';
import { toServiceInfo } from '../../src/kube/objects.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { SKIP_REASONS, type DesiredState, type ServiceInfo } from '../../src/model/types.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { CONFIG } from '../support/fixtures.js';
import { linesLogger } from '../support/log-lines.js';
import { wireLbService } from '../support/wire-objects.js';

const run = promisify(execFile);

const SERVICES = [
  wireLbService('web', '10.96.0.10', [{ ip: '192.0.2.10' }, { ip: '192.0.2.20', ipMode: 'Proxy' }], {
    namespace: 'shop',
    metadata: { creationTimestamp: '2024-01-01T00:00:00Z' },
  }),
  wireLbService('late', '10.96.0.11', '192.0.2.10', {
    namespace: 'shop',
    metadata: { creationTimestamp: '2024-02-01T00:00:00Z' },
  }),
  {
    apiVersion: 'v1',
    kind: 'Service',
    metadata: { namespace: 'shop', name: 'headless', creationTimestamp: '2024-03-01T00:00:00Z' },
    spec: {
      type: 'ClusterIP',
      clusterIP: 'None',
      clusterIPs: ['None'],
      externalIPs: ['198.51.100.7'],
      ports: [{ port: 443 }],
    },
  },
];

type Json = Record<string, any>;

describe('Service Events', function () {
  let server: ApiStandIn;
  let kc: KubeConfig;
  let services: { list(): ServiceInfo[] };
  let desired: DesiredState;
  const logLines: string[] = [];
  const logger = linesLogger(logLines);

  beforeEach(async () => {
    logLines.length = 0;
    server = await ApiStandIn.start();
    for (const s of SERVICES) server.apply(s);
    kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
    services = {
      list: () =>
        server
          .list('Service')
          .map(toServiceInfo)
          .filter((s): s is ServiceInfo => s !== undefined),
    };
    desired = buildDesiredState(services.list(), undefined, CONFIG);
  });
  afterEach(async () => server.stop());

  const events = (): Json[] => server.list('Event');

  it('records one Event per skip and per lost conflict, on the Service, with its uid', async () => {
    expect(desired.skips.map((s) => `${s.service} ${s.reason}`)).to.deep.equal([
      'shop/headless headless',
      'shop/web ipModeProxy',
    ]);
    expect(desired.conflicts).to.have.lengthOf(1);
    const recorder = new ServiceEventRecorder({ kubeConfig: kc, nodeName: 'node-1', services, logger });
    recorder.onNewSkips(desired.skips);
    recorder.onNewConflicts(desired.conflicts);
    await recorder.flush();

    const byService = new Map(events().map((e) => [`${e.involvedObject.namespace}/${e.involvedObject.name}`, e]));
    expect(events()).to.have.lengthOf(3);
    const uid = (name: string) => server.get('Service', 'shop', name)!.metadata.uid;

    const proxy = byService.get('shop/web')!;
    expect(proxy.type, 'ipMode Proxy is the intended behaviour, not a problem').to.equal('Normal');
    expect(proxy.reason).to.equal('ExternalAddressSkipped');
    expect(proxy.involvedObject.uid).to.equal(uid('web'));
    expect(proxy.involvedObject.kind).to.equal('Service');
    expect(proxy.source.component).to.equal('ipvs-node-controller');
    expect(proxy.source.host).to.equal('node-1');
    expect(proxy.count).to.equal(1);
    expect(proxy.message).to.match(/^ingress 192\.0\.2\.20: not translated .*\(ipModeProxy\)/);

    const headless = byService.get('shop/headless')!;
    expect(headless.type).to.equal('Warning');
    expect(headless.message).to.include(SKIP_EXPLANATIONS.headless);

    const conflict = byService.get('shop/late')!;
    expect(conflict.type).to.equal('Warning');
    expect(conflict.reason).to.equal('ExternalAddressConflict');
    expect(conflict.involvedObject.uid).to.equal(uid('late'));
    expect(conflict.message).to.match(/^192\.0\.2\.10 TCP\/80 is also claimed by the older Service shop\/web/);
    expect(logLines).to.deep.equal([]);
  });

  it('records the same report once however many nodes (or restarts) report it', async () => {
    for (const node of ['node-1', 'node-2', 'node-1']) {
      const recorder = new ServiceEventRecorder({ kubeConfig: kc, nodeName: node, services, logger });
      recorder.onNewSkips(desired.skips);
      recorder.onNewConflicts(desired.conflicts);
      await recorder.flush();
    }
    expect(events()).to.have.lengthOf(3);
    expect(events().every((e) => e.source.host === 'node-1')).to.equal(true);
    expect(logLines, 'AlreadyExists is not an error worth a log line').to.deep.equal([]);
  });

  it('skips Services deleted meanwhile, and bounds its queue with one log line for the dropped', async () => {
    const recorder = new ServiceEventRecorder({ kubeConfig: kc, nodeName: 'node-1', services, logger, maxQueued: 2 });
    const many = SKIP_REASONS.map((reason) => ({ service: 'shop/web', reason, detail: `detail of ${reason}` }));
    recorder.onNewSkips([{ service: 'shop/gone', reason: 'headless', detail: 'x' }, ...many]);
    await recorder.flush();
    // The first one is in flight at once (and dropped: no such Service), two wait, the rest are dropped.
    expect(events()).to.have.lengthOf(2);
    expect(logLines).to.have.lengthOf(1);
    expect(JSON.parse(logLines[0]!)).to.include({
      msg: 'Too many Events at once, further ones are not recorded',
      maxQueued: 2,
    });
  });

  it('shows up in kubectl describe service', async () => {
    const recorder = new ServiceEventRecorder({ kubeConfig: kc, nodeName: 'node-1', services, logger });
    recorder.onNewConflicts(desired.conflicts);
    await recorder.flush();
    const dir = await mkdtemp(join(tmpdir(), 'events-kubectl-'));
    try {
      await server.writeKubeconfig(join(dir, 'kubeconfig'));
      const kubectl = (...args: string[]) => run('kubectl', ['--kubeconfig', join(dir, 'kubeconfig'), ...args]);
      const { stdout } = await kubectl('describe', 'service', '-n', 'shop', 'late');
      expect(stdout).to.match(
        /Warning\s+ExternalAddressConflict\s+\S+\s+ipvs-node-controller\s+192\.0\.2\.10 TCP\/80 is also/,
      );
      // describe finds Events by the Service's uid: the other Service shows none.
      expect((await kubectl('describe', 'service', '-n', 'shop', 'web')).stdout).to.not.match(
        /ExternalAddressConflict/,
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe('Node Events', function () {
  let server: ApiStandIn;
  let kc: KubeConfig;
  const logLines: string[] = [];
  const logger = linesLogger(logLines);
  const status = (steppedAside: boolean): KubeProxyStatus => ({
    mode: steppedAside
      ? { mode: 'nftables', source: 'proxyMode', detail: 'kube-proxy answers /proxyMode: nftables' }
      : { mode: 'ipvs', source: 'proxyMode', detail: 'kube-proxy answers /proxyMode: ipvs' },
    steppedAside,
    ...(steppedAside ? { reason: 'kube-proxy is in nftables mode' } : {}),
    settings: [],
  });

  beforeEach(async () => {
    logLines.length = 0;
    server = await ApiStandIn.start();
    kc = new KubeConfig();
    kc.loadFromString(server.kubeconfig());
  });
  afterEach(async () => server.stop());

  it('records stepping aside and back once each, on the Node in default, as the kubelet names them', async () => {
    const recorder = new NodeKubeProxyEvents(kc, 'node-1', logger);
    recorder.onKubeProxy(status(false)); // programming from the start: nothing to say
    recorder.onKubeProxy(status(true));
    recorder.onKubeProxy(status(true)); // still aside: no second Event
    recorder.onKubeProxy(status(false));
    await recorder.flush();

    // In the order they were written: the server lists by name, whose suffix is random.
    const events = (server.list('Event') as Json[]).sort(
      (a, b) => Number(a.metadata.resourceVersion) - Number(b.metadata.resourceVersion),
    );
    expect(events.map((e) => e.reason)).to.deep.equal([STEPPED_ASIDE_REASON, RESUMED_REASON]);
    for (const e of events) {
      expect(e.metadata.namespace).to.equal('default');
      expect(e.metadata.name).to.match(/^node-1\./);
      expect(e.involvedObject).to.deep.equal({ apiVersion: 'v1', kind: 'Node', name: 'node-1', uid: 'node-1' });
      expect(e.type).to.equal('Normal');
      expect(e.source).to.deep.equal({ component: 'ipvs-node-controller', host: 'node-1' });
      expect(e.reportingComponent).to.equal('ipvs-node-controller');
      expect(e.reportingInstance).to.equal('node-1');
    }
    expect(events[0]!.message).to.equal(
      'ipvs-node-controller removed its rules and programs nothing: kube-proxy is in nftables mode',
    );
    expect(events[1]!.message).to.equal(
      'ipvs-node-controller translates again: kube-proxy is in IPVS mode (kube-proxy answers /proxyMode: ipvs)',
    );
    expect(logLines).to.deep.equal([]);
  });

  it("records kube-proxy's known bug as a Warning once per version, beside stepping aside", async () => {
    const recorder = new NodeKubeProxyEvents(kc, 'node-1', logger);
    const at = (version: string | undefined): KubeProxyStatus => {
      const s = status(true);
      return { ...s, mode: { ...s.mode, version } };
    };
    recorder.onKubeProxy(at(undefined)); // version unknown: nothing to say of it
    recorder.onKubeProxy(at('v1.33.2'));
    recorder.onKubeProxy(at('v1.33.2')); // the same: no second Event
    recorder.onKubeProxy(at('v1.33.4')); // upgraded, still affected: said again
    recorder.onKubeProxy(at('v1.33.6')); // fixed: nothing
    recorder.onKubeProxy(at('v1.33.6'));
    await recorder.flush();
    const events = (server.list('Event') as Json[]).sort(
      (a, b) => Number(a.metadata.resourceVersion) - Number(b.metadata.resourceVersion),
    );
    expect(events.map((e) => [e.reason, e.type])).to.deep.equal([
      [STEPPED_ASIDE_REASON, 'Normal'],
      [KNOWN_ISSUE_REASON, 'Warning'],
      [KNOWN_ISSUE_REASON, 'Warning'],
    ]);
    expect(events[1]!.involvedObject).to.deep.equal({ apiVersion: 'v1', kind: 'Node', name: 'node-1', uid: 'node-1' });
    expect(events[1]!.message).to.match(
      /^kube-proxy v1\.33\.2 has a known bug \(kubernetes#131765\): in nftables mode/,
    );
    expect(events[1]!.message).to.match(/upgrade kube-proxy$/);
    expect(events[2]!.message).to.match(/^kube-proxy v1\.33\.4 has a known bug/);
    // kubectl describe node shows it among the Node's Events.
    const kubeconfig = join(await mkdtemp(join(tmpdir(), 'kubeconfig-')), 'config');
    try {
      await server.writeKubeconfig(kubeconfig);
      const { stdout } = await run('kubectl', [
        '--kubeconfig',
        kubeconfig,
        'get',
        'events',
        '-n',
        'default',
        '-o',
        'wide',
      ]);
      expect(stdout).to.match(/Warning\s+KubeProxyKnownIssue\s+node\/node-1/);
    } finally {
      await rm(dirname(kubeconfig), { recursive: true, force: true });
    }
  });

  it('is recorded with --emit-events beside the Service Events, and not without', () => {
    const services = { list: (): ServiceInfo[] => [] };
    expect(eventRecorders({ emitEvents: false, nodeName: 'node-1' }, kc, services, logger)).to.deep.equal([]);
    const recorders = eventRecorders({ emitEvents: true, nodeName: 'node-1' }, kc, services, logger);
    expect(recorders.map((r) => r.constructor)).to.deep.equal([ServiceEventRecorder, NodeKubeProxyEvents]);
  });

  it('logs one line when the API server cannot be reached, and records the next change', async () => {
    const recorder = new NodeKubeProxyEvents(kc, 'node-1', logger);
    server.setUnavailable(true);
    recorder.onKubeProxy(status(true));
    await recorder.flush();
    server.setUnavailable(false);
    expect(server.list('Event')).to.have.lengthOf(0);
    expect(logLines).to.have.lengthOf(1);
    expect(JSON.parse(logLines[0]!)).to.include({ msg: 'Failed to record the Node Event' });

    recorder.onKubeProxy(status(false));
    await recorder.flush();
    expect((server.list('Event') as Json[]).map((e) => e.reason)).to.deep.equal([RESUMED_REASON]);
  });
});
