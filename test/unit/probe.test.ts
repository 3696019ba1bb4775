// The continuous probe: which Services and paths it tries (pure), its rounds against real
// sockets on loopback (a TCP server, a UDP echo, a closed port), its metrics, its flags, and the
// readiness it feeds.

import { expect } from 'chai';
import * as dgram from 'node:dgram';
import { once } from 'node:events';
import * as net from 'node:net';
import { pino } from 'pino';
import { Registry } from 'prom-client';
import { parseConfig, UsageError } from '../../src/config/options.js';
import { judgeReadiness, ApiReachability } from '../../src/health/health.js';
import { toServiceInfo } from '../../src/kube/objects.js';
import { registerProbeMetrics } from '../../src/metrics/probe-metrics.js';
import { MAX_PATHS_PER_SERVICE, probedServices } from '../../src/probe/probe-selection.js';
import { ContinuousProber, type ProbeResult, type ProbeSettings } from '../../src/probe/prober.js';
import type { DesiredState, Entry, ServiceInfo } from '../../src/model/types.js';
import { closedLoopbackPort } from '../support/local-http-server.js';

function svc(name: string, created: string, probe = false): ServiceInfo {
  return { namespace: 'ns', name, creationTimestamp: created, ...(probe ? { probe: true } : {}) };
}

function entry(service: string, externalIp: string, port: number, extra: Partial<Entry> = {}): Entry {
  return { family: 'ipv4', externalIp, protocol: 'TCP', port, clusterIp: '10.96.0.1', service, ...extra };
}

function desired(entries: Entry[]): DesiredState {
  return { ipv4: { entries }, ipv6: { entries: [] }, skips: [], conflicts: [] } as unknown as DesiredState;
}

describe('the continuous probe', () => {
  describe('which Services and paths it tries', () => {
    const services = [
      svc('young', '2024-03-01T00:00:00Z', true),
      svc('old', '2024-01-01T00:00:00Z', true),
      svc('middle', '2024-02-01T00:00:00Z', true),
      svc('plain', '2023-01-01T00:00:00Z'),
      svc('named', '2025-01-01T00:00:00Z'),
    ];
    const state = desired([
      entry('ns/old', '192.0.2.1', 80),
      entry('ns/named', '192.0.2.2', 80),
      entry('ns/middle', '192.0.2.3', 80),
      entry('ns/young', '192.0.2.4', 80),
      entry('ns/plain', '192.0.2.5', 80),
    ]);

    it('takes the flag-named first, then the annotated oldest first, up to the limit', () => {
      const chosen = probedServices(['ns/named'], services, state, 3);
      expect(chosen.map((c) => [c.service, c.origin])).to.deep.equal([
        ['ns/named', 'flag'],
        ['ns/old', 'annotation'],
        ['ns/middle', 'annotation'],
      ]);
      expect(chosen[0]!.paths.map((p) => p.externalIp)).to.deep.equal(['192.0.2.2']);
    });

    it('never probes an unannotated Service that no flag names', () => {
      const chosen = probedServices([], services, state, 64);
      expect(chosen.map((c) => c.service)).to.deep.equal(['ns/old', 'ns/middle', 'ns/young']);
    });

    it("tries at most four paths of a Service of many ports, and none the node's connections are not translated for", () => {
      const many = Array.from({ length: 10_000 }, (_, i) => entry('ns/old', '192.0.2.1', i + 1));
      const ranged = entry('ns/middle', '192.0.2.3', 80, { sourceRanges: ['10.0.0.0/8'] });
      const chosen = probedServices([], services, desired([...many, ranged]), 2);
      expect(chosen[0]!.paths).to.have.length(MAX_PATHS_PER_SERVICE);
      expect(chosen[1]).to.deep.include({ service: 'ns/middle', paths: [] });
      expect(chosen[1]!.notProbed).to.match(/loadBalancerSourceRanges/);
    });

    it('says why a named Service is not tried', () => {
      const chosen = probedServices(['ns/gone', 'ns/plain'], services, desired([]), 4);
      expect(chosen[0]!.notProbed).to.equal('no such Service on the API server');
      expect(chosen[1]!.notProbed).to.match(/nothing of it is translated/);
    });

    it('keeps the annotation as one boolean, and only the value "true"', () => {
      const wire = (value: string) => ({
        metadata: { namespace: 'ns', name: 's', annotations: { 'ipvs-node-controller/probe': value, other: 'x' } },
        spec: {},
      });
      expect(toServiceInfo(wire('true'))!.probe).to.equal(true);
      expect(toServiceInfo(wire('yes'))!.probe).to.equal(undefined);
    });
  });

  describe('its rounds, on loopback', () => {
    let tcp: net.Server;
    let udp: dgram.Socket;
    let tcpPort: number;
    let udpPort: number;
    let closedPort: number;

    before(async () => {
      tcp = net.createServer((s) => s.end()).listen(0, '127.0.0.1');
      await once(tcp, 'listening');
      tcpPort = (tcp.address() as net.AddressInfo).port;
      udp = dgram.createSocket('udp4');
      udp.on('message', (m, r) => udp.send(m, r.port, r.address));
      udp.bind(0, '127.0.0.1');
      await once(udp, 'listening');
      udpPort = udp.address().port;
      closedPort = await closedLoopbackPort();
    });
    after(() => {
      tcp.close();
      udp.close();
    });

    const settings = (over: Partial<ProbeSettings> = {}): ProbeSettings => ({
      services: ['ns/named'],
      maxServices: 4,
      intervalMs: 60_000,
      timeoutMs: 1_000,
      readiness: true,
      ...over,
    });

    async function oneRound(prober: ContinuousProber, rounds: ProbeResult[][], state: DesiredState) {
      const before = rounds.length;
      prober.onDesiredState(state);
      prober.onSync({});
      while (rounds.length === before) await new Promise((r) => setTimeout(r, 10));
      return rounds.at(-1)!;
    }

    it('judges each Service by its paths, and exports success, time and outcomes per Service', async () => {
      const registry = new Registry();
      const metrics = registerProbeMetrics(registry);
      const rounds: ProbeResult[][] = [];
      const list = [svc('named', '2024-01-01T00:00:00Z'), svc('tenant', '2024-01-02T00:00:00Z', true)];
      const prober = new ContinuousProber(
        settings(),
        { list: () => list },
        {
          onProbeRound: (r) => {
            rounds.push([...r]);
            metrics.onProbeRound(r);
          },
        },
        pino({ level: 'silent' }),
      );
      try {
        const results = await oneRound(
          prober,
          rounds,
          desired([
            entry('ns/named', '127.0.0.1', tcpPort),
            entry('ns/named', '127.0.0.1', udpPort, { protocol: 'UDP' }),
            entry('ns/tenant', '127.0.0.1', closedPort),
          ]),
        );
        expect(results.map((r) => [r.service, r.origin, r.ok])).to.deep.equal([
          ['ns/named', 'flag', true],
          ['ns/tenant', 'annotation', false],
        ]);
        expect(results[0]!.paths.map((p) => p.outcome)).to.deep.equal(['answered', 'answered']);
        expect(results[1]!.paths.map((p) => p.outcome)).to.deep.equal(['refused']);
        const text = await registry.metrics();
        expect(text).to.include('ipvs_node_controller_probe_success{service="ns/named",origin="flag"} 1');
        expect(text).to.include('ipvs_node_controller_probe_success{service="ns/tenant",origin="annotation"} 0');
        expect(text).to.include('ipvs_node_controller_probes_total{service="ns/named",outcome="answered"} 2');
        expect(text).to.include('ipvs_node_controller_probes_total{service="ns/tenant",outcome="refused"} 1');
        // The tenant's failure never makes the node unready; the operator's named one would.
        expect(prober.failingForReadiness()).to.deep.equal([]);
      } finally {
        await prober.stop();
      }
      // A Service no longer probed loses its series.
      metrics.onProbeRound([]);
      expect(await registry.metrics()).to.not.include('service="ns/tenant"');
    });

    it("fails readiness, when asked, while the operator's Service does not answer", async () => {
      const rounds: ProbeResult[][] = [];
      const prober = new ContinuousProber(
        settings({ intervalMs: 5_000 }),
        { list: () => [svc('named', '2024-01-01T00:00:00Z')] },
        { onProbeRound: (r) => rounds.push([...r]) },
        pino({ level: 'silent' }),
      );
      try {
        await oneRound(prober, rounds, desired([entry('ns/named', '127.0.0.1', closedPort)]));
        const failing = prober.failingForReadiness();
        expect(failing.map((r) => r.service)).to.deep.equal(['ns/named']);
        const now = Date.now();
        const judged = judgeReadiness({
          status: { cachesSynced: true, localPodMatchProblems: [], lastSyncEndedAt: now, lastSuccessfulSyncAt: now },
          api: new ApiReachability(),
          syncPeriodMs: 30_000,
          startedAt: now,
          now,
          probesFailing: failing,
        });
        expect(judged.ok).to.equal(false);
        expect(judged.detail).to.equal(
          `the probe of --probe-service ns/named (127.0.0.1:${closedPort}/TCP refused) failed (--probe-readiness)`,
        );
      } finally {
        await prober.stop();
      }
    });
  });

  describe('its flags', () => {
    const parse = (...args: string[]) => parseConfig(args, {}).probe;
    it('defaults: 16 Services every 30s, 2s each, readiness untouched', () => {
      expect(parse()).to.deep.equal({
        services: [],
        maxServices: 16,
        intervalMs: 30_000,
        timeoutMs: 2_000,
        readiness: false,
      });
    });
    it('takes repeated --probe-service', () => {
      expect(parse('--probe-service=a/b', '--probe-service', 'c/d', '--probe-readiness').services).to.deep.equal([
        'a/b',
        'c/d',
      ]);
    });
    for (const [args, message] of [
      [['--probe-service=nope'], "--probe-service: 'nope' is not namespace/name"],
      [['--probe-max-services=65'], "--probe-max-services: '65' must be an integer from 0 to 64"],
      [['--probe-max-services=1', '--probe-service=a/b', '--probe-service=a/c'], 'more than --probe-max-services (1)'],
      [['--probe-interval=1s'], '--probe-interval: 1s is too short'],
      [['--probe-timeout=11s', '--probe-interval=1m'], '--probe-timeout: at most 10s'],
      [['--probe-timeout=5s', '--probe-interval=5s'], '--probe-timeout must be shorter than --probe-interval'],
      [['--probe-readiness'], '--probe-readiness needs --probe-service'],
    ] as const) {
      it(`refuses ${args.join(' ')}`, () => {
        expect(() => parse(...args)).to.throw(UsageError, message);
      });
    }
  });
});
