// How nft JSON transactions reach the kernel. The CLI path lives here; the in-process
// libnftables path (native addon) implements the same interface.

import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { execa } from 'execa';

/**
 * What a committed transaction tells of the ruleset generation (nf_tables' NFT_MSG_GETGEN), read
 * just before and just after it: `after === before + 1` means the commit between was ours alone.
 */
export interface NftCommit {
  generations?: { before: number; after: number };
}

export interface NftExecutor {
  /** `addon` (in-process libnftables) or `cli` (`nft -j -f FILE`). */
  readonly kind: 'addon' | 'cli';
  /** Runs one JSON document as one transaction; rejects with nft's own message. */
  run(json: string): Promise<NftCommit | void>;
  /**
   * The ruleset generation now, when this executor can read it (undefined: it cannot). Nothing
   * committed since a generation was read <=> the generation is the same.
   */
  generation?(): Promise<number | undefined>;
  /** Hands memory freed by large work (a long listing, say) back to the kernel, if it can. */
  releaseMemory?(): Promise<void>;
  /** Runs a JSON document in check mode: validated by the kernel, nothing is committed. */
  check(json: string): Promise<void>;
  /** `nft -j list table <family> <name>` output, or undefined when the table does not exist. */
  listTable(family: 'ip' | 'ip6', name: string): Promise<string | undefined>;
}

/** A listing that did not finish in time (see NftCliExecutor.listTable). */
export class NftTimeoutError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NftTimeoutError';
  }
}

export class NftError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'NftError';
  }
}

/** nft's stderr keeps the useful part on its `Error:` lines. */
export function nftErrorMessage(stderr: string): string {
  const lines = stderr
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.length > 0);
  const errors = lines.filter((l) => l.startsWith('Error:') || l.includes('Error:'));
  return (errors.length > 0 ? errors : lines).slice(0, 3).join('; ') || 'nft failed without a message';
}

export function isNoSuchObject(err: unknown): boolean {
  return err instanceof Error && /No such file or directory|does not exist/i.test(err.message);
}

export class NftCliExecutor implements NftExecutor {
  readonly kind = 'cli' as const;
  constructor(readonly binary = 'nft') {}

  async run(json: string): Promise<void> {
    await this.execDocument([], json);
  }

  async check(json: string): Promise<void> {
    await this.execDocument(['-c'], json);
  }

  /**
   * With `timeoutMs`, a listing still running then is stopped (NftTimeoutError): nft starts its
   * listing again whenever the ruleset changes under it, so it may never finish while another
   * writer commits every few milliseconds.
   */
  async listTable(family: 'ip' | 'ip6', name: string, timeoutMs?: number): Promise<string | undefined> {
    try {
      return await this.exec(['-j', 'list', 'table', family, name], timeoutMs);
    } catch (err) {
      if (isNoSuchObject(err)) return undefined;
      throw err;
    }
  }

  /**
   * nft reads `-f -` by opening /dev/stdin, which fails (ENXIO) on the socket Node gives a
   * child as its stdin: the document goes through a private file instead.
   */
  private async execDocument(flags: string[], json: string): Promise<void> {
    const dir = await mkdtemp(join(tmpdir(), 'nft-transaction-'));
    try {
      const file = join(dir, 'document.json');
      await writeFile(file, json, { mode: 0o600 });
      await this.exec([...flags, '-j', '-f', file]);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }

  private async exec(args: string[], timeoutMs?: number): Promise<string> {
    const result = await execa(this.binary, args, {
      stdin: 'ignore',
      reject: false,
      stripFinalNewline: true,
      ...(timeoutMs !== undefined ? { timeout: timeoutMs } : {}),
    });
    if (result.failed) {
      if (result.timedOut) throw new NftTimeoutError(`nft ${args.join(' ')} did not finish within ${timeoutMs} ms`);
      if ((result as { code?: string }).code === 'ENOENT') {
        throw new NftError(`the '${this.binary}' command was not found: install the nftables package`);
      }
      throw new NftError(nftErrorMessage(`${result.stderr}\n${result.stdout}`));
    }
    return result.stdout;
  }
}
