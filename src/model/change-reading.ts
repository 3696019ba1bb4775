// Which Service objects came and went since the model's last update, read from what the model is
// given: a ChangeFeed (the informer: change-feed.ts), whose changes since the model's cursor are
// read and then released; or a list (a file, a test), compared with the last one. Either way the
// records of the new objects are derived and those of the gone ones forgotten (service-records.ts).

import type { ChangeFeed } from './change-feed.js';
import { orderedChanges } from './ordered-changes.js';
import { fieldsOf, type RecordChanges, type ServiceRecord, type ServiceRecords } from './service-records.js';
import type { Steps, WorkMeter } from './time-slicing.js';
import type { ServiceInfo } from './types.js';

/** What the model reads its Services from: a list, or a feed of the changes of one. */
export type ServiceSource = Iterable<ServiceInfo> | ChangeFeed<ServiceInfo>;

function isChangeFeed(services: ServiceSource): services is ChangeFeed<ServiceInfo> {
  return !(Symbol.iterator in services);
}

export class ChangeReader {
  /** The feed's cursor at the last update; undefined when the model does not hold it (read it all). */
  private cursor: number | undefined;
  /** The previous list, when it held each object once. */
  private lastInput: ServiceInfo[] | undefined;
  /** Numbers each read: a record's `seenIn`. */
  private generation = 0;

  constructor(
    private readonly records: ServiceRecords,
    private readonly meter: WorkMeter,
  ) {}

  /** The records are forgotten: the next read reads everything. */
  reset(): void {
    this.lastInput = undefined;
    this.cursor = undefined;
  }

  /** The records that came and went since the last read. */
  *read(services: ServiceSource): Steps<RecordChanges> {
    if (isChangeFeed(services)) return yield* this.fromFeed(services);
    this.cursor = undefined;
    return yield* this.fromList(Array.isArray(services) ? (services as ServiceInfo[]) : [...services]);
  }

  /**
   * The changes the feed reports since the last read, or all of it anew. Read once, then released:
   * the model holds what was before the cursor from now on.
   */
  private *fromFeed(feed: ChangeFeed<ServiceInfo>): Steps<RecordChanges> {
    const since = this.cursor;
    const cursor = feed.cursor;
    const changes = since === undefined ? undefined : feed.changesSince(since);
    this.cursor = cursor;
    feed.release(cursor);
    const records = this.records.byObject;
    // Anything the model does not hold as the feed says it should: read it all.
    if (!changes || changes.removed.some((svc) => !records.has(svc)) || changes.added.some((svc) => records.has(svc))) {
      return yield* this.fromList(feed.list());
    }
    this.lastInput = undefined; // the last list no longer describes what the model holds
    return yield* this.records.replace(changes.removed, changes.added, ++this.generation);
  }

  /** Which Service objects of the list are new, and which known ones it no longer holds. */
  private *fromList(input: ServiceInfo[]): Steps<RecordChanges> {
    const changes = yield* this.compare(input);
    // Compared by identity next time: kept as a copy, the caller may reuse its array.
    this.lastInput = this.records.byObject.size === input.length ? input.slice() : undefined;
    return changes;
  }

  /**
   * Which Service objects are new and which are gone since the last update. The caches list
   * their objects in a stable order, an object replaced where it stood: walking the last input
   * and this one side by side finds the changes without a lookup per Service.
   */
  private *compare(input: ServiceInfo[]): Steps<RecordChanges> {
    const generation = ++this.generation;
    const records = this.records.byObject;
    const walked = this.lastInput && orderedChanges(this.lastInput, input, (svc) => records.has(svc));
    if (walked && new Set(walked.fresh).size === walked.fresh.length) {
      return yield* this.records.replace(walked.gone, walked.fresh, generation);
    }
    const added: ServiceRecord[] = [];
    let kept = 0;
    for (const svc of input) {
      const known = records.get(svc);
      if (known) {
        if (known.seenIn !== generation) kept++;
        known.seenIn = generation;
        if (this.meter.worked()) yield;
        continue;
      }
      const record = this.records.derive(svc, generation);
      records.set(svc, record);
      added.push(record);
      if (this.meter.worked(fieldsOf(svc))) yield;
    }
    const removed: ServiceRecord[] = [];
    if (kept + added.length < records.size) {
      for (const [svc, record] of records) {
        if (record.seenIn === generation) continue;
        records.delete(svc);
        removed.push(record);
      }
    }
    return { added, removed };
  }
}
