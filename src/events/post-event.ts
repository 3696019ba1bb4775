// One core/v1 Event posted to the API server: the single narrow request behind both recorders
// (Service Events in service-events.ts, Node Events in node-events.ts), so that the generated API
// client is not loaded, and both carry the same source fields that `kubectl describe` shows.

import type { KubeConfig } from '@kubernetes/client-node';
import { PROGRAM } from '../log.js';
import { apiRequest, statusMessage } from '../kube/request.js';

/** The component named as the source of every Event the controller records. */
export const EVENT_COMPONENT = PROGRAM;

export interface NewEvent {
  namespace: string;
  /** A fixed name (a retry or another node gets 409 AlreadyExists), or a prefix the API server completes. */
  name: { name: string } | { generateName: string };
  involvedObject: { apiVersion: string; kind: string; namespace?: string; name: string; uid: string };
  reason: string;
  message: string;
  type: 'Normal' | 'Warning';
  /** This node: the Event's source host and reporting instance. */
  nodeName: string;
}

/** Why an Event was not recorded: the status code when the API server answered, and the error. */
export interface EventFailure {
  code?: number;
  err: Error;
}

/** Posts one Event; resolves to undefined once it is recorded, else to why not. Never rejects. */
export async function postEvent(kubeConfig: KubeConfig, event: NewEvent): Promise<EventFailure | undefined> {
  const now = new Date().toISOString();
  // A core/v1 Event, as `kubectl describe` reads it (the legacy fields plus the reporting ones).
  const body = {
    apiVersion: 'v1',
    kind: 'Event',
    metadata: { ...event.name, namespace: event.namespace },
    involvedObject: event.involvedObject,
    reason: event.reason,
    message: event.message,
    type: event.type,
    count: 1,
    firstTimestamp: now,
    lastTimestamp: now,
    source: { component: EVENT_COMPONENT, host: event.nodeName },
    reportingComponent: EVENT_COMPONENT,
    reportingInstance: event.nodeName,
  };
  let code: number | undefined;
  try {
    const response = await apiRequest(kubeConfig, `/api/v1/namespaces/${encodeURIComponent(event.namespace)}/events`, {
      method: 'POST',
      body,
      timeoutMs: 30_000,
    });
    code = response.status;
    if (code >= 200 && code < 300) return undefined;
    return { code, err: new Error(statusMessage(response)) };
  } catch (err) {
    return { code, err: err as Error };
  }
}
