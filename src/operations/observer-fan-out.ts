// Event fan-out: the controller and each informer take one observer; these pass every hook on
// to several (metrics, health, Events, the CLI's own logging). Each returns every hook
// (Required<>): a hook added to an observer interface fails to compile here until it is passed on.

import type { ControllerObserver } from '../controller/controller.js';
import type { InformerObserver } from '../kube/informer.js';

export function allControllerObservers(
  ...observers: Array<ControllerObserver | undefined>
): Required<ControllerObserver> {
  const present = observers.filter((o): o is ControllerObserver => o !== undefined);
  return {
    onDesiredState: (desired) => present.forEach((o) => o.onDesiredState?.(desired)),
    onSync: (report) => present.forEach((o) => o.onSync?.(report)),
    onNewSkips: (skips) => present.forEach((o) => o.onNewSkips?.(skips)),
    onNewConflicts: (conflicts) => present.forEach((o) => o.onNewConflicts?.(conflicts)),
    onKubeProxy: (status) => present.forEach((o) => o.onKubeProxy?.(status)),
    onConntrackCleanup: (report) => present.forEach((o) => o.onConntrackCleanup?.(report)),
    onLeftovers: (pending) => present.forEach((o) => o.onLeftovers?.(pending)),
  };
}

export function allInformerObservers(...observers: Array<InformerObserver | undefined>): Required<InformerObserver> {
  const present = observers.filter((o): o is InformerObserver => o !== undefined);
  return {
    onList: (resource) => present.forEach((o) => o.onList?.(resource)),
    onWatchListUnavailable: (resource, why) => present.forEach((o) => o.onWatchListUnavailable?.(resource, why)),
    onWatch: (resource) => present.forEach((o) => o.onWatch?.(resource)),
    onError: (resource, err, retryInMs) => present.forEach((o) => o.onError?.(resource, err, retryInMs)),
    onDecodeError: (resource, problem, first) => present.forEach((o) => o.onDecodeError?.(resource, problem, first)),
  };
}
