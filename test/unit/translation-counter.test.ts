// The counts of translated connections: the nft driver's read of its rules' named counters, and
// translated_connections_total, read when scraped.

import { expect } from 'chai';
import { Registry } from 'prom-client';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { TABLE_NAME } from '../../src/backends/nft/render.js';
import type { TranslatedConnections } from '../../src/driver/driver.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { registerTranslationCounter } from '../../src/metrics/translation-counter.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { FakeNftExecutor } from '../doubles/fake-nft-executor.js';
import { CONFIG } from '../support/fixtures.js';

const NODE = { name: 'node-1', podCIDRs: ['10.244.1.0/24', 'fd01::/64'] };
const SERVICE = {
  namespace: 'default',
  name: 'svc-1',
  type: 'LoadBalancer' as const,
  creationTimestamp: '2024-01-01T00:00:00Z',
  clusterIP: '10.96.0.1',
  clusterIPs: ['10.96.0.1', 'fd00::1'],
  ports: [{ port: 80, protocol: 'TCP' as const }],
  ingress: [{ ip: '192.0.2.1' }, { ip: '2001:db8::1' }],
};

describe('translated connections', () => {
  describe('the nft driver', () => {
    it("reads its rules' counters per family and source, and nothing where no table is", async () => {
      const fake = new FakeNftExecutor();
      const driver = new NftDriver(fake, { lister: fake });
      expect(await driver.translatedConnections()).to.deep.equal([]);
      await new Reconciler(driver).sync(buildDesiredState([SERVICE], NODE, CONFIG), { full: true });
      fake.tables.get(`ip ${TABLE_NAME}`)!.counters.set('translated-from-pods', 7);
      fake.tables.get(`ip ${TABLE_NAME}`)!.counters.set('translated-from-node', 2);
      fake.tables.get(`ip6 ${TABLE_NAME}`)!.counters.set('translated-from-pods', 1);
      expect(await driver.translatedConnections()).to.deep.equal([
        { family: 'ipv4', source: 'pods', connections: 7 },
        { family: 'ipv4', source: 'node', connections: 2 },
        { family: 'ipv6', source: 'pods', connections: 1 },
        { family: 'ipv6', source: 'node', connections: 0 },
      ]);
    });

    it('leaves out a family whose listing fails, and reads nothing without a lister', async () => {
      const fake = new FakeNftExecutor();
      const lister = {
        listTable: () => Promise.resolve(undefined),
        listCounters: (family: 'ip' | 'ip6') =>
          family === 'ip' ? Promise.reject(new Error('timed out')) : fake.listCounters(family, TABLE_NAME),
      };
      const driver = new NftDriver(fake, { lister });
      await new Reconciler(driver).sync(buildDesiredState([SERVICE], NODE, CONFIG), { full: true });
      expect((await driver.translatedConnections()).map((r) => r.family)).to.deep.equal(['ipv6', 'ipv6']);
      expect(await new NftDriver(fake).translatedConnections()).to.deep.equal([]);
    });
  });

  describe('translated_connections_total', () => {
    const value = async (registry: Registry, family: string, source: string) => {
      const metric = (await registry.getMetricsAsJSON()).find(
        (m) => m.name === 'ipvs_node_controller_translated_connections_total',
      )!;
      return metric.values.find((v) => v.labels.family === family && v.labels.source === source)?.value;
    };

    it('is read when scraped, once for the scrapes of a second, and keeps what a failed read leaves out', async () => {
      const registry = new Registry();
      let reads = 0;
      let answer: () => TranslatedConnections[] = () => [
        { family: 'ipv4', source: 'pods', connections: 5 },
        { family: 'ipv4', source: 'node', connections: 1 },
      ];
      let now = 1_000_000;
      registerTranslationCounter(
        registry,
        async () => {
          reads++;
          return answer();
        },
        () => now,
      );
      expect(reads).to.equal(0);
      expect(await value(registry, 'ipv4', 'pods')).to.equal(5);
      expect(await value(registry, 'ipv4', 'node')).to.equal(1);
      expect(reads).to.equal(1);
      answer = () => {
        throw new Error('the nft command timed out');
      };
      now += 999;
      expect(await value(registry, 'ipv4', 'pods')).to.equal(5);
      expect(reads, 'a scrape within the second shares the read').to.equal(1);
      now += 1;
      expect(await value(registry, 'ipv4', 'pods')).to.equal(5);
      expect(reads).to.equal(2);
      answer = () => [{ family: 'ipv4', source: 'node', connections: 3 }];
      now += 1_000;
      expect(await value(registry, 'ipv4', 'node')).to.equal(3);
      expect(await value(registry, 'ipv4', 'pods')).to.equal(5);
    });
  });
});
