// kube-proxy's KubeProxyConfiguration as the controller reads it: the fields it uses, unknown
// fields ignored, partial files, malformed files refused with one line (the previous settings
// kept while following the file), and explicit flags winning over the file.

import { expect } from 'chai';
import { mkdtempSync, rmSync, writeFileSync, renameSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { pino } from 'pino';
import { parseConfig } from '../../src/config/options.js';
import {
  KubeProxyConfigError,
  KubeProxyConfigFollower,
  describeSettings,
  mergeSettings,
  parseKubeProxyConfiguration,
  readKubeProxyConfigFile,
  type KubeProxySettings,
} from '../../src/kubeproxy/config.js';
import { proxyModeAddressFromFile } from '../../src/kubeproxy/awareness.js';

/** kubeadm's config.conf, as `kubectl -n kube-system get cm kube-proxy -o yaml` shows it (v1.31). */
const KUBEADM_CONFIG = `apiVersion: kubeproxy.config.k8s.io/v1alpha1
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: /var/lib/kube-proxy/kubeconfig.conf
  qps: 0
clusterCIDR: 10.244.0.0/16,fd00:10:244::/56
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ClusterCIDR
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: 15
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: true
  syncPeriod: 0s
kind: KubeProxyConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: 0.0.0.0:10249
mode: ipvs
nftables:
  masqueradeAll: false
  masqueradeBit: null
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForTesting: false
winkernel:
  enableDSR: false
`;

function refused(text: string, pattern: RegExp): void {
  expect(() => parseKubeProxyConfiguration(text))
    .to.throw(KubeProxyConfigError)
    .that.satisfies((err: Error) => {
      expect(err.message).to.match(pattern);
      expect(err.message).not.to.include('\n');
      return true;
    });
}

const NO_FLAGS = parseConfig(['--kube-proxy-config', '/x'], { NODE_NAME: 'n' });

describe('kube-proxy configuration: reading', () => {
  it("reads kubeadm's v1alpha1 file: mode, clusterCIDR, masqueradeBit, detectLocalMode, metricsBindAddress", () => {
    const s = parseKubeProxyConfiguration(KUBEADM_CONFIG);
    expect(s).to.deep.equal({
      mode: 'ipvs',
      clusterCidrs: ['10.244.0.0/16', 'fd00:10:244::/56'],
      masqueradeBit: 15,
      detectLocalMode: 'ClusterCIDR',
      metricsBindAddress: '0.0.0.0:10249',
    } satisfies KubeProxySettings);
  });

  it('reads detectLocal.bridgeInterface and interfaceNamePrefix, and JSON as well as YAML', () => {
    const s = parseKubeProxyConfiguration(
      JSON.stringify({
        apiVersion: 'kubeproxy.config.k8s.io/v1alpha1',
        kind: 'KubeProxyConfiguration',
        detectLocalMode: 'InterfaceNamePrefix',
        detectLocal: { bridgeInterface: 'cni0', interfaceNamePrefix: 'veth' },
      }),
    );
    expect(s).to.deep.equal({
      detectLocalMode: 'InterfaceNamePrefix',
      podBridgeInterface: 'cni0',
      podInterfaceNamePrefix: 'veth',
    });
  });

  it('ignores fields it does not know, at the top and inside sections', () => {
    const s = parseKubeProxyConfiguration(
      'kind: KubeProxyConfiguration\nmode: nftables\nfutureField: {a: 1}\niptables:\n  masqueradeBit: 14\n  newKnob: true\n',
    );
    expect(s).to.deep.equal({ mode: 'nftables', masqueradeBit: 14, detectLocalMode: 'ClusterCIDR' });
  });

  it('takes a partial file: only what it sets; empty strings and nulls count as unset', () => {
    expect(parseKubeProxyConfiguration('mode: ""\nclusterCIDR: ""\niptables:\n  masqueradeBit: null\n')).to.deep.equal({
      detectLocalMode: 'ClusterCIDR',
    });
    expect(parseKubeProxyConfiguration('iptables: {masqueradeBit: 0}')).to.deep.equal({
      masqueradeBit: 0,
      detectLocalMode: 'ClusterCIDR',
    });
    expect(parseKubeProxyConfiguration('clusterCIDR: 10.0.0.0/8')).to.deep.equal({
      clusterCidrs: ['10.0.0.0/8'],
      detectLocalMode: 'ClusterCIDR',
    });
  });

  it("an empty or absent detectLocalMode is kube-proxy's default, ClusterCIDR, and wins over our NodeCIDR default", () => {
    for (const text of ['clusterCIDR: 10.244.0.0/16\n', 'clusterCIDR: 10.244.0.0/16\ndetectLocalMode: ""\n']) {
      const file = parseKubeProxyConfiguration(text);
      expect(file.detectLocalMode).to.equal('ClusterCIDR');
      const s = mergeSettings({ model: NO_FLAGS.model, sources: NO_FLAGS.modelSources }, file);
      expect(s.model.detectLocalMode).to.equal('ClusterCIDR');
      expect(s.model.clusterCidrs).to.deep.equal(['10.244.0.0/16']);
      expect(s.sources.detectLocalMode).to.equal('kube-proxy-config');
    }
    expect(NO_FLAGS.model.detectLocalMode, 'without the file: NodeCIDR (docs/semantics.md)').to.equal('NodeCIDR');
    const flag = parseConfig(['--kube-proxy-config', '/x', '--detect-local-mode=NodeCIDR'], { NODE_NAME: 'n' });
    expect(
      mergeSettings({ model: flag.model, sources: flag.modelSources }, parseKubeProxyConfiguration('{}')).model
        .detectLocalMode,
      'an explicit flag still wins',
    ).to.equal('NodeCIDR');
  });

  it('refuses malformed files with one line naming the field', () => {
    refused('mode: [ipvs', /not YAML/);
    refused('', /empty/);
    refused('- a\n- b\n', /mapping at the top/);
    refused('kind: KubeletConfiguration\n', /kind is "KubeletConfiguration"/);
    refused('apiVersion: kubeproxy.config.k8s.io/v2\n', /apiVersion "kubeproxy\.config\.k8s\.io\/v2" is not supported/);
    refused('mode: userspace\n', /mode: 'userspace' is not one of ipvs, iptables, nftables, kernelspace/);
    refused('clusterCIDR: 10.244.0.0/33\n', /clusterCIDR: '10\.244\.0\.0\/33' is not a CIDR/);
    refused('iptables:\n  masqueradeBit: 32\n', /iptables\.masqueradeBit: 32 must be an integer from 0 to 31/);
    refused('iptables:\n  masqueradeBit: "14"\n', /iptables\.masqueradeBit/);
    refused('iptables: 14\n', /iptables: expected a mapping/);
    refused('detectLocalMode: PodCIDR\n', /detectLocalMode: 'PodCIDR' is not one of/);
    refused('detectLocal:\n  bridgeInterface: "cni0 extra"\n', /detectLocal\.bridgeInterface/);
    refused('mode: 3\n', /mode: expected a string/);
  });

  it('a missing file is no error (the optional ConfigMap does not exist); an unreadable one is', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'kp-'));
    try {
      expect(await readKubeProxyConfigFile(join(dir, 'config.conf'))).to.deep.equal({ kind: 'missing' });
      writeFileSync(join(dir, 'config.conf'), 'mode: [');
      const bad = await readKubeProxyConfigFile(join(dir, 'config.conf'));
      expect(bad.kind).to.equal('invalid');
      expect(await readKubeProxyConfigFile(dir)).to.have.property('kind', 'invalid');
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("takes kube-proxy's metricsBindAddress as the /proxyMode address, a wildcard as loopback", () => {
    expect(proxyModeAddressFromFile('0.0.0.0:10249')).to.deep.equal({ host: '127.0.0.1', port: 10249 });
    expect(proxyModeAddressFromFile('[::]:10249')).to.deep.equal({ host: '::1', port: 10249 });
    expect(proxyModeAddressFromFile('10.0.0.5:9999')).to.deep.equal({ host: '10.0.0.5', port: 9999 });
    expect(proxyModeAddressFromFile('0.0.0.0/0:10249')).to.equal(undefined);
    expect(proxyModeAddressFromFile(undefined)).to.equal(undefined);
  });
});

describe('kube-proxy configuration: flags win over the file, the file over defaults', () => {
  const file = parseKubeProxyConfiguration(KUBEADM_CONFIG);

  it('without flags, every setting the file gives comes from the file', () => {
    const s = mergeSettings({ model: NO_FLAGS.model, sources: NO_FLAGS.modelSources }, file);
    expect(s.model).to.include({ detectLocalMode: 'ClusterCIDR', masqueradeBit: 15, localTrafficPolicyOnly: false });
    expect(s.model.clusterCidrs).to.deep.equal(['10.244.0.0/16', 'fd00:10:244::/56']);
    expect(s.sources).to.deep.equal({
      detectLocalMode: 'kube-proxy-config',
      clusterCidrs: 'kube-proxy-config',
      podBridgeInterface: 'default',
      podInterfaceNamePrefix: 'default',
      masqueradeBit: 'kube-proxy-config',
      allowServiceExternalIPs: 'default',
    });
    expect(s.configuredMode).to.equal('ipvs');
    expect(describeSettings(s)).to.include('masqueradeBit=15 (kube-proxy-config)');
  });

  it('explicit flags (and POD_CIDR_* in the environment) win, each on its own', () => {
    const flags = parseConfig(
      ['--kube-proxy-config', '/x', '--masquerade-bit', '14', '--detect-local-mode', 'NodeCIDR'],
      { NODE_NAME: 'n', POD_CIDR_IPV4: '10.42.0.0/16' },
    );
    const s = mergeSettings({ model: flags.model, sources: flags.modelSources }, file);
    expect(s.model.masqueradeBit).to.equal(14);
    expect(s.model.detectLocalMode).to.equal('NodeCIDR');
    expect(s.model.clusterCidrs).to.deep.equal(['10.42.0.0/16']);
    expect(s.sources).to.include({ masqueradeBit: 'flag', detectLocalMode: 'flag', clusterCidrs: 'env' });
    expect(describeSettings(s)).to.deep.equal([
      'detectLocalMode=NodeCIDR (flag)',
      'clusterCidrs=10.42.0.0/16 (env)',
      'podBridgeInterface=(none) (default)',
      'podInterfaceNamePrefix=(none) (default)',
      'masqueradeBit=14 (flag)',
      'allowServiceExternalIPs=true (default)',
    ]);
  });

  it("follows kube-proxy's AllowServiceExternalIPs feature gate when the file sets it", () => {
    const off = parseKubeProxyConfiguration(`${KUBEADM_CONFIG}featureGates:\n  AllowServiceExternalIPs: false\n`);
    expect(off.allowServiceExternalIPs).to.equal(false);
    const s = mergeSettings({ model: NO_FLAGS.model, sources: NO_FLAGS.modelSources }, off);
    expect(s.model.allowServiceExternalIPs).to.equal(false);
    expect(describeSettings(s)).to.include('allowServiceExternalIPs=false (kube-proxy-config)');
    const on = parseKubeProxyConfiguration('featureGates:\n  AllowServiceExternalIPs: true\n');
    expect(on.allowServiceExternalIPs).to.equal(true);
    expect(parseKubeProxyConfiguration('featureGates: {}\n').allowServiceExternalIPs).to.equal(undefined);
    expect(() => parseKubeProxyConfiguration('featureGates:\n  AllowServiceExternalIPs: "no"\n')).to.throw(
      /featureGates\.AllowServiceExternalIPs: "no" must be true or false/,
    );
  });

  it('a flag equal to the default still counts as explicit; without a file the flags and defaults stand', () => {
    const flags = parseConfig(['--masquerade-bit=14'], { NODE_NAME: 'n' });
    expect(flags.modelSources.masqueradeBit).to.equal('flag');
    expect(
      mergeSettings({ model: flags.model, sources: flags.modelSources }, { masqueradeBit: 3 }).model.masqueradeBit,
    ).to.equal(14);
    const none = mergeSettings({ model: NO_FLAGS.model, sources: NO_FLAGS.modelSources }, undefined);
    expect(none.model).to.deep.equal(NO_FLAGS.model);
  });

  it('with --kube-proxy-config, a detect-local mode may take its value from the file', () => {
    const flags = parseConfig(['--kube-proxy-config', '/x', '--detect-local-mode', 'ClusterCIDR'], { NODE_NAME: 'n' });
    const s = mergeSettings({ model: flags.model, sources: flags.modelSources }, file);
    expect(s.model.clusterCidrs).to.deep.equal(['10.244.0.0/16', 'fd00:10:244::/56']);
    expect(() => parseConfig(['--detect-local-mode', 'ClusterCIDR'], {})).to.throw(/needs --cluster-cidr/);
  });

  it('the kube-proxy flags: defaults and one-line errors', () => {
    expect(NO_FLAGS.kubeProxyMetricsAddress).to.deep.equal({ host: '127.0.0.1', port: 10249 });
    expect(NO_FLAGS.kubeProxyMetricsAddressExplicit).to.equal(false);
    expect(NO_FLAGS.kubeProxyStepAside).to.equal(true);
    expect(NO_FLAGS.kubeProxyPollIntervalMs).to.equal(2000);
    const off = parseConfig(['--kube-proxy-step-aside=false', '--kube-proxy-metrics-address='], {});
    expect(off.kubeProxyStepAside).to.equal(false);
    expect(off.kubeProxyMetricsAddress).to.equal(undefined);
    expect(() => parseConfig(['--kube-proxy-step-aside=no'], {})).to.throw(/'no' is not true or false/);
    expect(() => parseConfig(['--kube-proxy-metrics-address=localhost'], {})).to.throw(/not IP:port/);
    expect(() => parseConfig(['--kube-proxy-mode-poll-interval=10ms'], {})).to.throw(/too short/);
  });
});

describe('kube-proxy configuration: following the file', function () {
  let dir: string;
  beforeEach(() => (dir = mkdtempSync(join(tmpdir(), 'kp-follow-'))));
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  /** Writes as the kubelet updates a ConfigMap volume: a new file swapped in by rename. */
  function swapIn(path: string, text: string): void {
    writeFileSync(`${path}.new`, text);
    renameSync(`${path}.new`, path);
  }

  async function until(check: () => boolean): Promise<void> {
    for (let i = 0; i < 100 && !check(); i++) await sleep(20);
    expect(check()).to.equal(true);
  }

  it('reports a change, keeps the previous settings over a malformed file (one error), and takes the next good one', async () => {
    const path = join(dir, 'config.conf');
    swapIn(path, 'mode: ipvs\niptables: {masqueradeBit: 14}\n');
    const lines: string[] = [];
    const logger = pino({ level: 'info' }, { write: (l: string) => void lines.push(l) });
    const seen: Array<KubeProxySettings | undefined> = [];
    const follower = new KubeProxyConfigFollower(path, 20, logger, (s) => seen.push(s));
    try {
      const cidr = { detectLocalMode: 'ClusterCIDR' };
      expect(await follower.start()).to.deep.equal({ mode: 'ipvs', masqueradeBit: 14, ...cidr });
      swapIn(path, 'mode: nftables\niptables: {masqueradeBit: 14}\n');
      await until(() => seen.length === 1);
      expect(seen[0]).to.deep.equal({ mode: 'nftables', masqueradeBit: 14, ...cidr });

      swapIn(path, 'mode: nftables\niptables: {masqueradeBit: 99}\n');
      await until(() => lines.some((l) => l.includes('Invalid kube-proxy configuration')));
      await sleep(100); // several more polls of the same bad file
      expect(lines.filter((l) => l.includes('Invalid kube-proxy configuration'))).to.have.length(1);
      const line = JSON.parse(lines.find((l) => l.includes('Invalid'))!) as {
        msg: string;
        keeping: string;
        err: { message: string };
      };
      expect(line.msg).to.equal('Invalid kube-proxy configuration');
      expect(line.keeping).to.equal('previousSettings');
      expect(line.err.message).to.match(/iptables\.masqueradeBit: 99 must be an integer from 0 to 31/);
      expect(follower.current).to.deep.equal({ mode: 'nftables', masqueradeBit: 14, ...cidr });
      expect(seen).to.have.length(1);

      rmSync(path);
      const gone = () =>
        lines
          .map((l) => JSON.parse(l) as Record<string, unknown>)
          .find((l) => l.msg === 'No kube-proxy configuration file' && l.keeping === 'previousSettings');
      await until(() => gone() !== undefined);
      expect(follower.current).to.deep.equal({ mode: 'nftables', masqueradeBit: 14, ...cidr });

      swapIn(path, 'mode: ipvs\niptables: {masqueradeBit: 13}\n');
      await until(() => seen.length === 2);
      expect(seen[1]).to.deep.equal({ mode: 'ipvs', masqueradeBit: 13, ...cidr });
    } finally {
      follower.stop();
    }
  });
});
