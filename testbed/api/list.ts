// Lists: ListOptions validated as the real server validates them, served from the modelled
// release's watch cache or from etcd (read-path.ts), paginated with `limit` and continue tokens
// over a snapshot taken at the first page, as Tables for kubectl, or cut short by breakNextList.

import { randomBytes } from 'node:crypto';
import { ApiError, invalidListOptions, tooLargeResourceVersion, type KubeObject } from './errors.js';
import type { Faults } from './faults.js';
import { sendJson, type ReadRequest } from './http.js';
import { listReadPath, type ReadPathFeatures } from './read-path.js';
import { withoutTypeMeta } from './resources.js';
import { inScope } from './selectors.js';
import type { ObjectStore } from './store.js';
import { toTable, wantsTable } from './table.js';

/** The list a continue token pages through: its objects as they were at its first page. */
interface ListSnapshot {
  rv: number;
  items: KubeObject[];
}

const CONTINUE_SNAPSHOTS_KEPT = 32;

/** The checks of resourceVersion, resourceVersionMatch and continue the real server makes. */
function validate(rv: string, match: string, cont: string): void {
  if (rv !== '' && !/^\d+$/.test(rv)) {
    throw new ApiError(400, `resourceVersion: Invalid value: "${rv}": must be a non-negative integer`);
  }
  if (match !== '') {
    const errors: string[] = [];
    if (match !== 'Exact' && match !== 'NotOlderThan') {
      errors.push(`resourceVersionMatch: Unsupported value: "${match}": supported values: "Exact", "NotOlderThan", ""`);
    }
    if (rv === '')
      errors.push(
        'resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided',
      );
    if (cont !== '')
      errors.push('resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided');
    if (match === 'Exact' && rv === '0') {
      errors.push('resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden for resourceVersion "0"');
    }
    if (errors.length > 0) throw invalidListOptions(errors);
  }
  if (cont !== '' && rv !== '' && rv !== '0') {
    throw new ApiError(400, 'specifying resource version is not allowed when using continue');
  }
}

export class ListServer {
  private readonly snapshots = new Map<string, ListSnapshot>();

  constructor(
    private readonly store: ObjectStore,
    private readonly faults: Faults,
    private readonly features: ReadPathFeatures,
  ) {}

  /** Forgets the snapshots continue tokens point at: those tokens get 410 Expired. */
  forgetSnapshots(): void {
    this.snapshots.clear();
  }

  serve({ req, res, route, selection, query, reads }: ReadRequest): void {
    const { resource } = route;
    reads.lists++;
    const limit = Number(query.get('limit') ?? 0);
    if (!Number.isInteger(limit) || limit < 0) throw new ApiError(400, `invalid limit: ${query.get('limit')}`);
    const cont = query.get('continue') ?? '';
    const rv = query.get('resourceVersion') ?? '';
    const match = query.get('resourceVersionMatch') ?? '';
    validate(rv, match, cont);
    const lag = this.faults.lag;
    const cacheVersion = this.faults.cacheVersion;
    if (rv !== '' && rv !== '0' && match !== 'Exact' && Number(rv) > cacheVersion) {
      throw tooLargeResourceVersion(rv, cacheVersion);
    }
    let path = listReadPath(this.features, rv, match, limit, cont !== '');
    // A consistent read that a lagging cache cannot serve falls back to etcd.
    if (lag && rv === '' && path.fromCache) path = { fromCache: false, revisionProbe: true };
    const fromLaggingCache = lag !== undefined && path.fromCache && cont === '';
    // The watch cache ignores limit for resourceVersion=0 (cacher's computeListLimit): the whole list.
    const pageLimit = path.fromCache && rv === '0' ? 0 : limit;
    let snapshot: ListSnapshot;
    let offset = 0;
    if (cont) {
      ({ snapshot, offset } = this.resolveContinue(cont));
    } else {
      snapshot = {
        rv: fromLaggingCache ? lag.rv : this.store.resourceVersion,
        items: (fromLaggingCache ? lag.objects.get(resource)! : this.store.list(resource)).filter((o) =>
          inScope(route.namespace, selection, o),
        ),
      };
    }
    const end = pageLimit > 0 ? Math.min(offset + pageLimit, snapshot.items.length) : snapshot.items.length;
    const page = snapshot.items.slice(offset, end);
    reads.objects += page.length;
    if (path.revisionProbe) reads.etcdRevisionReads++;
    if (!path.fromCache) {
      reads.etcdListReads++;
      reads.etcdObjects += page.length;
    }
    const listMeta: KubeObject = { resourceVersion: String(snapshot.rv) };
    if (end < snapshot.items.length) {
      listMeta.continue = this.continueToken(snapshot, end);
      listMeta.remainingItemCount = snapshot.items.length - end;
    }
    if (wantsTable(req)) {
      sendJson(res, 200, toTable(resource, page, listMeta, query.get('includeObject') ?? 'Metadata'));
      return;
    }
    const items = page.map(withoutTypeMeta);
    const cut = this.faults.takeListBreak();
    if (cut) {
      // The beginning of the body, as far as the cut, then the connection goes away.
      const head = JSON.stringify({ kind: `${resource.kind}List`, apiVersion: 'v1', metadata: listMeta, items: [] });
      const sent = items.slice(0, cut.afterItems).map((o) => JSON.stringify(o) + ',');
      res.writeHead(200, { 'Content-Type': 'application/json' });
      res.write(head.slice(0, -2) + sent.join(''), () => res.socket?.destroy());
      return;
    }
    sendJson(res, 200, { kind: `${resource.kind}List`, apiVersion: 'v1', metadata: listMeta, items });
  }

  private continueToken(snapshot: ListSnapshot, offset: number): string {
    let id = [...this.snapshots.entries()].find(([, s]) => s === snapshot)?.[0];
    if (!id) {
      id = randomBytes(6).toString('hex');
      this.snapshots.set(id, snapshot);
      while (this.snapshots.size > CONTINUE_SNAPSHOTS_KEPT) this.snapshots.delete(this.snapshots.keys().next().value!);
    }
    return Buffer.from(JSON.stringify({ v: 'meta.k8s.io/v1', rv: snapshot.rv, id, offset })).toString('base64url');
  }

  private resolveContinue(token: string): { snapshot: ListSnapshot; offset: number } {
    let parsed: KubeObject;
    try {
      parsed = JSON.parse(Buffer.from(token, 'base64url').toString('utf8'));
    } catch {
      throw new ApiError(400, 'continue key is not valid: illegal base64 data or JSON');
    }
    const snapshot = this.snapshots.get(String(parsed.id));
    if (!snapshot || !Number.isInteger(parsed.offset)) {
      throw new ApiError(
        410,
        'The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.',
        'Expired',
      );
    }
    return { snapshot, offset: parsed.offset };
  }
}
