// The HTTP writes: POST (create), PUT (replace), PATCH and DELETE, with the real server's checks
// (names, namespaces, resourceVersion and uid preconditions, dryRun) and its answers.

import { randomBytes } from 'node:crypto';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { ApiError, MODIFIED_SINCE_READ, conflict, notFound, type KubeObject } from './errors.js';
import { isDryRun, readJsonBody, sendJson, type Route } from './http.js';
import type { ObjectWriter } from './objects.js';
import { patchOf } from './patches.js';
import { checkBody, isPlainObject, normalize, withTypeMeta } from './resources.js';
import type { ObjectStore } from './store.js';

export class WriteVerbs {
  constructor(
    private readonly store: ObjectStore,
    private readonly writer: ObjectWriter,
  ) {}

  /** The object a route names; 404 when there is none. */
  mustGet(route: Route): KubeObject {
    const obj = this.store.get(route.resource, route.namespace, route.name!);
    if (!obj) throw notFound(route.resource.plural, route.name!);
    return obj;
  }

  async create(req: IncomingMessage, res: ServerResponse, route: Route, query: URLSearchParams): Promise<void> {
    const { resource } = route;
    const body = await readJsonBody(req);
    checkBody(resource, body);
    if (!body.metadata?.name && body.metadata?.generateName) {
      body.metadata.name = body.metadata.generateName + randomBytes(3).toString('hex').slice(0, 5);
    }
    if (!body.metadata?.name) {
      throw new ApiError(
        422,
        `${resource.kind} "" is invalid: metadata.name: Required value: name or generateName is required`,
      );
    }
    if (resource.namespaced) {
      const ns = body.metadata.namespace;
      if (ns !== undefined && ns !== '' && ns !== route.namespace) {
        throw new ApiError(
          400,
          'the namespace of the provided object does not match the namespace sent on the request',
        );
      }
    }
    const incoming = normalize(resource, { ...body, metadata: { ...body.metadata, namespace: route.namespace } });
    if (this.store.get(resource, incoming.metadata.namespace, incoming.metadata.name)) {
      throw new ApiError(409, `${resource.plural} "${incoming.metadata.name}" already exists`, 'AlreadyExists', {
        name: incoming.metadata.name,
        kind: resource.plural,
      });
    }
    if (isDryRun(query)) {
      sendJson(res, 201, withTypeMeta(resource, incoming));
      return;
    }
    // Clients cannot set these on create.
    delete incoming.metadata.uid;
    delete incoming.metadata.creationTimestamp;
    sendJson(res, 201, withTypeMeta(resource, this.writer.create(resource, incoming, { defaults: true })));
  }

  async replace(req: IncomingMessage, res: ServerResponse, route: Route, query: URLSearchParams): Promise<void> {
    const { resource } = route;
    const body = await readJsonBody(req);
    checkBody(resource, body);
    const existing = this.mustGet(route);
    if (body.metadata?.name !== undefined && body.metadata.name !== route.name) {
      throw new ApiError(
        400,
        `the name of the object (${body.metadata.name}) does not match the name on the URL (${route.name})`,
      );
    }
    const rv = body.metadata?.resourceVersion;
    if (rv !== undefined && rv !== '' && rv !== existing.metadata.resourceVersion) {
      throw conflict(resource.plural, route.name!, MODIFIED_SINCE_READ);
    }
    const merged = {
      ...body,
      metadata: { ...body.metadata, name: route.name, namespace: existing.metadata.namespace },
    };
    this.finishUpdate(res, route, existing, merged, query);
  }

  async patch(req: IncomingMessage, res: ServerResponse, route: Route, query: URLSearchParams): Promise<void> {
    const { resource } = route;
    const apply = patchOf(req.headers['content-type'] ?? '');
    const patch = await readJsonBody(req, true);
    const existing = this.mustGet(route);
    const patched = apply(withTypeMeta(resource, existing), patch);
    if (!isPlainObject(patched)) throw new ApiError(422, 'the patch did not produce an object');
    checkBody(resource, patched);
    if (
      patched.metadata?.name !== route.name ||
      (patched.metadata?.namespace ?? undefined) !== existing.metadata.namespace
    ) {
      throw new ApiError(400, 'a patch cannot change the name or namespace of an object');
    }
    const rv = patched.metadata?.resourceVersion;
    if (rv !== undefined && rv !== existing.metadata.resourceVersion) {
      throw conflict(resource.plural, route.name!, MODIFIED_SINCE_READ);
    }
    this.finishUpdate(res, route, existing, patched, query);
  }

  async delete(req: IncomingMessage, res: ServerResponse, route: Route, query: URLSearchParams): Promise<void> {
    const { resource } = route;
    const options = await readJsonBody(req, false, true);
    const existing = this.mustGet(route);
    const pre = options?.preconditions ?? {};
    if (
      (pre.uid && pre.uid !== existing.metadata.uid) ||
      (pre.resourceVersion && pre.resourceVersion !== existing.metadata.resourceVersion)
    ) {
      throw conflict(resource.plural, route.name!, 'the precondition does not match the current object');
    }
    const dryRun = isDryRun(query) || (Array.isArray(options?.dryRun) && options.dryRun.includes('All'));
    const deleted = dryRun ? existing : this.store.delete(resource, route.namespace, route.name!)!;
    if (resource.deleteReturnsObject) {
      sendJson(res, 200, withTypeMeta(resource, deleted));
    } else {
      sendJson(res, 200, {
        kind: 'Status',
        apiVersion: 'v1',
        metadata: {},
        status: 'Success',
        details: { name: route.name, kind: resource.plural, uid: existing.metadata.uid },
      });
    }
  }

  /** The common tail of PUT and PATCH: main resource writes keep the status, status writes keep the rest. */
  private finishUpdate(
    res: ServerResponse,
    route: Route,
    existing: KubeObject,
    incoming: KubeObject,
    query: URLSearchParams,
  ): void {
    const { resource } = route;
    let candidate: KubeObject;
    if (route.subresource === 'status') {
      candidate = { ...structuredClone(existing), status: incoming.status };
      if (candidate.status === undefined) delete candidate.status;
    } else {
      candidate = normalize(resource, incoming);
      if (resource.hasStatus) {
        if (existing.status === undefined) delete candidate.status;
        else candidate.status = existing.status;
      }
      if (resource.kind === 'Service') this.writer.defaultService(candidate, existing);
    }
    candidate.metadata.resourceVersion = existing.metadata.resourceVersion;
    if (isDryRun(query)) {
      sendJson(res, 200, withTypeMeta(resource, candidate));
      return;
    }
    sendJson(
      res,
      200,
      withTypeMeta(resource, this.writer.update(resource, existing, candidate, { keepCreation: true })),
    );
  }
}
