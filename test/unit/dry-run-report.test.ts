// The text --dry-run prints before the ruleset (src/cli/dry-run-report.ts), whole: the CLI tests
// (kube-proxy-report.test.ts) check its lines through the real command; these pin its layout.

import { expect } from 'chai';
import { dryRunReport } from '../../src/cli/dry-run-report.js';
import { parseConfig } from '../../src/config/options.js';
import { toServiceInfo } from '../../src/kube/objects.js';
import { mergeSettings } from '../../src/kubeproxy/config.js';
import type { ModeVerdict } from '../../src/kubeproxy/mode.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import type { ServiceInfo } from '../../src/model/types.js';

function service(name: string, ip: string, extra: { local?: boolean; optOut?: boolean } = {}): ServiceInfo {
  const info = toServiceInfo({
    apiVersion: 'v1',
    kind: 'Service',
    metadata: {
      namespace: 'shop',
      name,
      creationTimestamp: '2024-01-01T00:00:00Z',
      ...(extra.optOut ? { annotations: { 'ipvs-node-controller/skip': 'true' } } : {}),
    },
    spec: {
      type: 'LoadBalancer',
      clusterIP: '10.96.0.10',
      clusterIPs: ['10.96.0.10'],
      externalTrafficPolicy: extra.local ? 'Local' : 'Cluster',
      ports: [{ port: 80, protocol: 'TCP' }],
    },
    status: { loadBalancer: { ingress: [{ ip }] } },
  });
  if (!info) throw new Error(`fixture ${name} is no Service`);
  return info;
}

const UNKNOWN: ModeVerdict = { mode: 'unknown', source: 'none', detail: 'no kube-ipvs0; /proxyMode: no answer' };

function report(args: string[], services: ServiceInfo[], mode: ModeVerdict, fileProblem?: string): string {
  const config = parseConfig(['--node-name', 'node-1', ...args]);
  const settings = mergeSettings({ model: config.model, sources: config.modelSources }, undefined);
  const desired = buildDesiredState(services, undefined, settings.model);
  return dryRunReport(config, { services, desired, kubeProxy: { settings, mode, fileProblem } });
}

describe('dry-run report', () => {
  it('reads, kube-proxy, then the migration report, sorted by Service, each part ending in a blank line', () => {
    const services = [service('web', '192.0.2.20'), service('api', '192.0.2.10', { local: true })];
    const text = report(['--kube-proxy-config=/etc/kube-proxy/config.conf'], services, UNKNOWN, 'no such file');
    expect(text.split('\n')).to.deep.equal([
      '# 2 Services read; 2 IPv4 and 0 IPv6 entries',
      '',
      '# kube-proxy mode: unknown (none: no kube-ipvs0; /proxyMode: no answer)',
      '# kube-proxy version: unknown (not read)',
      '# kube-proxy configuration: /etc/kube-proxy/config.conf not used: no such file',
      '# setting detectLocalMode=NodeCIDR (default)',
      '# setting clusterCidrs=(none) (default)',
      '# setting podBridgeInterface=(none) (default)',
      '# setting podInterfaceNamePrefix=(none) (default)',
      '# setting masqueradeBit=14 (default)',
      '# setting allowServiceExternalIPs=true (default)',
      '',
      '# migration report (this node):',
      "#   shop/api 192.0.2.10 TCP/80: depends on the controller: in IPVS mode the address has only local endpoints (externalTrafficPolicy Local); a move to nftables mode makes kube-proxy serve it; kube-proxy's mode is unknown here",
      "#   shop/web 192.0.2.20 TCP/80: translated, but IPVS serves it without the controller too (externalTrafficPolicy Cluster); kube-proxy's mode is unknown here",
      '',
      '',
    ]);
  });

  it('says when no Service is translated, and names the opted-out ones', () => {
    const ipvs: ModeVerdict = { mode: 'ipvs', source: 'kube-ipvs0', detail: 'kube-ipvs0 exists' };
    const text = report([], [service('quiet', '192.0.2.30', { optOut: true })], ipvs);
    expect(text).to.include('# skipped shop/quiet: optedOut');
    expect(text).to.match(
      /# migration report \(this node\):\n# {3}shop\/quiet: opted out \([^)]*\): never translated, kube-proxy alone serves it\n\n$/,
    );
    expect(report([], [], ipvs)).to.match(
      /# migration report \(this node\):\n# {3}no Service is translated on this node\n\n$/,
    );
  });
});
