// The operator's opt-out: `ipvs-node-controller/skip: "true"` leaves a Service untranslated,
// counted and reported like every other skip, and the stripping keeps only that one boolean.

import { expect } from 'chai';
import { toServiceInfo } from '../../src/kube/objects.js';
import { buildDesiredState, DesiredStateModel } from '../../src/model/desired-state.js';
import { SKIP_REASONS, type ServiceInfo } from '../../src/model/types.js';
import { ControllerMetrics } from '../../src/metrics/controller-metrics.js';
import { CONFIG } from '../support/fixtures.js';

function service(annotations?: Record<string, unknown>) {
  return {
    metadata: { name: 'web', namespace: 'shop', annotations },
    spec: { type: 'LoadBalancer', clusterIP: '10.96.0.10', ports: [{ port: 80, protocol: 'TCP' }] },
    status: { loadBalancer: { ingress: [{ ip: '192.0.2.10' }] } },
  };
}

describe('the skip annotation', () => {
  it('is kept as one boolean when "true", and no annotation is kept otherwise', () => {
    const opted = toServiceInfo(service({ 'ipvs-node-controller/skip': 'true', 'other/big': 'x'.repeat(1000) }))!;
    expect(opted.skip).to.equal(true);
    expect(JSON.stringify(opted)).not.to.include('other/big');
    for (const value of ['false', 'True', 'yes', '', true, 1]) {
      const s = toServiceInfo(service({ 'ipvs-node-controller/skip': value }))!;
      expect(s, String(value)).not.to.have.property('skip');
    }
    expect(toServiceInfo(service(undefined))!).not.to.have.property('skip');
    expect(
      toServiceInfo({ ...service(), metadata: { name: 'web', namespace: 'shop', annotations: 'junk' } }),
    ).not.to.have.property('skip');
  });

  it('leaves the Service untranslated with the reason optedOut; the other Services keep their entries', () => {
    const opted = toServiceInfo(service({ 'ipvs-node-controller/skip': 'true' }))!;
    const other: ServiceInfo = { ...toServiceInfo(service())!, name: 'api', clusterIP: '10.96.0.11' };
    other.ingress = [{ ip: '192.0.2.11' }];
    const state = buildDesiredState([opted, other], undefined, CONFIG);
    expect(state.ipv4.entries.map((e) => e.service)).to.deep.equal(['shop/api']);
    expect(state.skips).to.deep.equal([
      { service: 'shop/web', reason: 'optedOut', detail: 'annotation ipvs-node-controller/skip: "true"' },
    ]);
    expect(SKIP_REASONS).to.include('optedOut');
  });

  it('removing the annotation brings the translation back (the informer replaces the object)', () => {
    const model = new DesiredStateModel(CONFIG);
    const opted = toServiceInfo(service({ 'ipvs-node-controller/skip': 'true' }))!;
    expect(model.update([opted], undefined).ipv4.entries).to.have.length(0);
    const back = toServiceInfo(service())!;
    const state = model.update([back], undefined);
    expect(state.ipv4.entries.map((e) => `${e.externalIp}->${e.clusterIp}`)).to.deep.equal(['192.0.2.10->10.96.0.10']);
    expect(state.skips).to.deep.equal([]);
  });

  it('is counted in the skip metrics like every other reason', async () => {
    const metrics = new ControllerMetrics({ defaultMetrics: false });
    const opted = toServiceInfo(service({ 'ipvs-node-controller/skip': 'true' }))!;
    const state = buildDesiredState([opted], undefined, CONFIG);
    metrics.onDesiredState(state);
    metrics.onNewSkips(state.skips);
    const { text } = await metrics.exposition();
    expect(text).to.include('ipvs_node_controller_skipped_addresses{reason="optedOut"} 1');
    expect(text).to.include('ipvs_node_controller_skip_events_total{reason="optedOut"} 1');
  });
});
