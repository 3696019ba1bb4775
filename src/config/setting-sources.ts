// The model settings that kube-proxy's configuration file can also give, and where each effective
// value came from. The command line fills them (src/config/options.ts); src/kubeproxy/config.ts
// merges kube-proxy's file in.

/** Where an effective setting came from, as logged and shown on /readyz and in --dry-run. */
export type SettingSource = 'flag' | 'env' | 'kube-proxy-config' | 'default';

/** The model settings that kube-proxy's configuration can provide. */
export const KUBE_PROXY_MODEL_SETTINGS = [
  'detectLocalMode',
  'clusterCidrs',
  'podBridgeInterface',
  'podInterfaceNamePrefix',
  'masqueradeBit',
  'allowServiceExternalIPs',
] as const;
export type KubeProxyModelSetting = (typeof KUBE_PROXY_MODEL_SETTINGS)[number];
