// The two caches the controller reads: every Service, and this node's Node object.

import { CoreV1Api, KubeConfig } from '@kubernetes/client-node';
import type { NodeInfo, ServiceInfo } from '../model/types.js';
import { Informer, type InformerObserver } from './informer.js';
import { toNodeInfo, toServiceInfo } from './objects.js';

export function loadKubeConfig(path: string | undefined): KubeConfig {
  const kc = new KubeConfig();
  if (path) kc.loadFromFile(path);
  else if (process.env.KUBERNETES_SERVICE_HOST) kc.loadFromCluster();
  else kc.loadFromDefault();
  if (!kc.getCurrentCluster()) {
    throw new Error(
      path
        ? `kubeconfig ${path} has no current cluster`
        : 'no Kubernetes configuration found: pass --kubeconfig, set KUBECONFIG, or run in a pod',
    );
  }
  return kc;
}

export interface ClusterCaches {
  services: Informer<ServiceInfo>;
  node: Informer<NodeInfo>;
}

const PAGE_SIZE = 500;

export function createClusterCaches(
  kc: KubeConfig,
  nodeName: string,
  onChange: () => void,
  observer?: InformerObserver,
): ClusterCaches {
  const core = kc.makeApiClient(CoreV1Api);
  const services = new Informer<ServiceInfo>(kc, {
    resource: 'services',
    path: '/api/v1/services',
    listPage: async (token) => {
      const list = await core.listServiceForAllNamespaces({ limit: PAGE_SIZE, _continue: token });
      return { items: list.items, resourceVersion: list.metadata?.resourceVersion, continue: list.metadata?._continue };
    },
    strip: toServiceInfo,
    onChange,
    observer,
  });
  const fieldSelector = `metadata.name=${nodeName}`;
  const node = new Informer<NodeInfo>(kc, {
    resource: 'nodes',
    path: '/api/v1/nodes',
    fieldSelector,
    listPage: async (token) => {
      const list = await core.listNode({ fieldSelector, limit: PAGE_SIZE, _continue: token });
      return { items: list.items, resourceVersion: list.metadata?.resourceVersion, continue: list.metadata?._continue };
    },
    strip: toNodeInfo,
    onChange,
    observer,
  });
  return { services, node };
}
