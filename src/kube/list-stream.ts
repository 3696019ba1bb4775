// A list response read item by item as it arrives: `{"kind": ..., "metadata": {...}, "items":
// [{...}, {...}]}` is cut into its members and the elements of its `items` array, each parsed on
// its own, so that what is held at once is one object, not the whole body. A list served from
// the API server's watch cache (resourceVersion=0, or not older than a version) is never
// paginated: at 10,000 Services it is 20 to 30 MB of JSON, which this reads with the memory of
// one Service. Each item, and each other member, is bounded like a watch line: a value longer
// than the bound ends the read with an error, so that a server gone mad cannot make the process
// buffer without bound.

import { formatSize } from '../bytes.js';

/** A value (an item, or another member of the list) longer than the bound. */
export class ListItemTooLargeError extends Error {
  constructor(
    readonly path: string,
    readonly limitBytes: number,
  ) {
    super(`listing ${path}: an object longer than ${formatSize(limitBytes)}, the most this controller reads`);
    this.name = 'ListItemTooLargeError';
  }
}

/** The body is not a JSON object with an items array. */
export class ListBodyError extends Error {
  constructor(path: string, problem: string) {
    super(`listing ${path}: ${problem}`);
    this.name = 'ListBodyError';
  }
}

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const OPEN_BRACE = 0x7b;
const CLOSE_BRACE = 0x7d;
const OPEN_BRACKET = 0x5b;
const CLOSE_BRACKET = 0x5d;
const COMMA = 0x2c;
const COLON = 0x3a;

function isSpace(b: number): boolean {
  return b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;
}

type Where =
  /** Before the top-level '{'. */
  | 'start'
  /** In the top-level object, before a key (or its end). */
  | 'key'
  /** After a key, before its ':'. */
  | 'colon'
  /** After ':', before the value. */
  | 'value'
  /** In the items array, before an element (or its end). */
  | 'element'
  /** After the top-level '}'. */
  | 'end';

/**
 * Feeds on the chunks of a list body. `onItem` gets each element of `items`, parsed; members
 * other than items are parsed and kept in `members` (metadata, kind, ...). Throws
 * ListItemTooLargeError or ListBodyError (the read is over then).
 */
export class ListBodySplitter {
  /** The top-level members other than items, parsed. */
  readonly members: Record<string, unknown> = {};
  private where: Where = 'start';
  /** Bytes of the value being read (a key, a member's value, an item). */
  private parts: Buffer[] = [];
  private size = 0;
  /** What is being read: nothing, a key, a member's value, an item. */
  private reading: 'none' | 'key' | 'member' | 'item' = 'none';
  private key = '';
  /** Nesting inside the value being read (0: at its top). */
  private depth = 0;
  private inString = false;
  private escaped = false;
  /** The value read is a string, number or literal (not an object or array). */
  private scalar = false;
  private sawItems = false;

  constructor(
    private readonly path: string,
    private readonly maxValueBytes: number,
    private readonly onItem: (item: unknown) => void,
  ) {}

  push(chunk: Buffer): void {
    let start = -1;
    if (this.reading !== 'none') start = 0;
    for (let i = 0; i < chunk.length; i++) {
      const b = chunk[i]!;
      if (this.reading !== 'none') {
        // Inside a value: find where it ends.
        if (this.inString) {
          if (this.escaped) this.escaped = false;
          else if (b === BACKSLASH) this.escaped = true;
          else if (b === QUOTE) {
            this.inString = false;
            if (this.scalar && this.depth === 0) {
              this.finish(chunk, start, i + 1);
              start = -1;
            }
          }
          continue;
        }
        if (this.scalar) {
          if (b === COMMA || b === CLOSE_BRACE || b === CLOSE_BRACKET || isSpace(b)) {
            this.finish(chunk, start, i);
            start = -1;
            i--; // the terminator belongs to the enclosing structure
          }
          continue;
        }
        if (b === QUOTE) this.inString = true;
        else if (b === OPEN_BRACE || b === OPEN_BRACKET) this.depth++;
        else if (b === CLOSE_BRACE || b === CLOSE_BRACKET) {
          this.depth--;
          if (this.depth === 0) {
            this.finish(chunk, start, i + 1);
            start = -1;
          }
        }
        continue;
      }
      if (isSpace(b)) continue;
      switch (this.where) {
        case 'start':
          if (b !== OPEN_BRACE) throw new ListBodyError(this.path, 'the response is not a JSON object');
          this.where = 'key';
          break;
        case 'key':
          if (b === COMMA) break;
          if (b === CLOSE_BRACE) {
            this.where = 'end';
            break;
          }
          if (b !== QUOTE) throw new ListBodyError(this.path, 'the response is not valid JSON');
          this.begin('key', true);
          this.inString = true;
          start = i;
          break;
        case 'colon':
          if (b !== COLON) throw new ListBodyError(this.path, 'the response is not valid JSON');
          this.where = 'value';
          break;
        case 'value':
          if (this.key === 'items' && b === OPEN_BRACKET) {
            this.sawItems = true;
            this.where = 'element';
            break;
          }
          start = i;
          this.beginValue('member', b);
          break;
        case 'element':
          if (b === COMMA) break;
          if (b === CLOSE_BRACKET) {
            this.where = 'key';
            break;
          }
          start = i;
          this.beginValue('item', b);
          break;
        case 'end':
          throw new ListBodyError(this.path, 'the response has data after its end');
      }
    }
    if (this.reading !== 'none' && start >= 0 && start < chunk.length) this.keep(chunk.subarray(start));
  }

  /** The body ended: checks it was a whole list. */
  end(): void {
    if (this.where !== 'end' || this.reading !== 'none') throw new ListBodyError(this.path, 'the response ended early');
    if (!this.sawItems) throw new ListBodyError(this.path, 'the response has no items');
  }

  private begin(reading: 'key' | 'member' | 'item', scalar: boolean): void {
    this.reading = reading;
    this.parts = [];
    this.size = 0;
    this.depth = 0;
    this.inString = false;
    this.escaped = false;
    this.scalar = scalar;
  }

  private beginValue(reading: 'member' | 'item', first: number): void {
    if (first === OPEN_BRACE || first === OPEN_BRACKET) {
      this.begin(reading, false);
      this.depth = 1;
    } else {
      this.begin(reading, true);
      if (first === QUOTE) this.inString = true;
    }
  }

  private keep(part: Buffer): void {
    this.size += part.length;
    if (this.size > this.maxValueBytes) throw new ListItemTooLargeError(this.path, this.maxValueBytes);
    this.parts.push(part);
  }

  /** The value read ends at `end` (exclusive) of this chunk. */
  private finish(chunk: Buffer, start: number, end: number): void {
    this.keep(chunk.subarray(Math.max(start, 0), end));
    const text = (this.parts.length === 1 ? this.parts[0]! : Buffer.concat(this.parts, this.size)).toString('utf8');
    this.parts = [];
    this.size = 0;
    const reading = this.reading;
    this.reading = 'none';
    let value: unknown;
    try {
      value = JSON.parse(text);
    } catch {
      throw new ListBodyError(this.path, 'the response is not valid JSON');
    }
    if (reading === 'key') {
      this.key = value as string;
      this.where = 'colon';
    } else if (reading === 'member') {
      this.members[this.key] = value;
      this.where = 'key';
    } else {
      this.onItem(value);
      this.where = 'element';
    }
  }
}
