// How iptables-restore input reaches the kernel: one `*-restore --noflush -w` process per family
// and transaction, and `*-save` to read what is there. Nothing here knows about our rules.

import { readFile } from 'node:fs/promises';
import { execa } from 'execa';
import type { Family } from '../../model/types.js';
import { loadNftAddon, type NftAddonExecutor } from '../nft/addon-executor.js';

export type IptablesVariant = 'legacy' | 'nft';
/** In the order detection prefers them. */
export const IPTABLES_VARIANTS: readonly IptablesVariant[] = ['nft', 'legacy'];

/** `iptables-legacy-restore`, `ip6tables-nft-save`, ... */
export function variantCommand(variant: IptablesVariant, family: Family, tool: '' | 'save' | 'restore'): string {
  const base = family === 'ipv4' ? 'iptables' : 'ip6tables';
  return tool === '' ? `${base}-${variant}` : `${base}-${variant}-${tool}`;
}

/** Seconds to wait for the xtables lock that kube-proxy may hold (legacy; iptables-nft ignores it). */
export const XTABLES_LOCK_WAIT_SECONDS = 30;

export class IptablesError extends Error {
  constructor(
    message: string,
    /** The command's exit status: 1 other problem, 2 bad parameters, 4 resource problem. */
    readonly exitCode?: number,
  ) {
    super(message);
    this.name = 'IptablesError';
  }
}

/** The variant's commands are not installed: there is nothing of ours to find or clean either. */
export class IptablesToolMissing extends IptablesError {
  constructor(message: string) {
    super(message);
    this.name = 'IptablesToolMissing';
  }
}

/** iptables keeps the useful part of a failure on its first lines ("line 7 failed: ..."). */
export function iptablesErrorMessage(stderr: string): string {
  const lines = stderr
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l.length > 0 && !l.startsWith('Try `'));
  return lines.slice(0, 3).join('; ') || 'iptables failed without a message';
}

/** What one iptables command did: its exit status and output, or that it is not installed. */
export interface IptablesOutcome {
  /** 0 on success; undefined when it ended without one (killed, timed out). */
  exitCode: number | undefined;
  stdout: string;
  stderr: string;
  /** The command was not found. */
  missing?: boolean;
}

/**
 * How the iptables commands are run and the legacy tables are found: the real commands and
 * /proc by default; tests give a stand-in that keeps a nat table in memory.
 */
export interface IptablesRunner {
  /**
   * `timeoutMs`: stopped after this long (exit status undefined); the command timeout by default.
   * `onOutput`: called once, when the command first writes to its stdout (a `-save` has read the
   * table whole by then: both variants fetch it before printing its first line); never for a
   * command that writes nothing.
   */
  run(
    command: string,
    args: readonly string[],
    input?: string,
    timeoutMs?: number,
    onOutput?: () => void,
  ): Promise<IptablesOutcome>;
  /** The legacy tables that exist in this network namespace (see variant.ts legacyTables). */
  legacyTables(family: Family): Promise<Set<string> | undefined>;
  /**
   * The nf_tables ruleset generation (NFT_MSG_GETGEN), which every commit to any nf_tables table
   * of this network namespace bumps, iptables-nft's included; undefined when it cannot be read.
   */
  generation?(): Promise<number | undefined>;
}

/** The nftables addon, loaded on the first generation asked for; null: it does not load. */
let generationAddon: NftAddonExecutor | null | undefined;

/** Waiting for the xtables lock, then the command itself. */
const COMMAND_TIMEOUT_MS = (XTABLES_LOCK_WAIT_SECONDS + 30) * 1000;

export const systemIptablesRunner: IptablesRunner = {
  async run(command, args, input, timeoutMs = COMMAND_TIMEOUT_MS, onOutput) {
    const child = execa(command, [...args], {
      ...(input === undefined ? { stdin: 'ignore' as const } : { input }),
      reject: false,
      stripFinalNewline: false,
      timeout: timeoutMs,
    });
    if (onOutput) child.stdout?.once('data', onOutput);
    const result = await child;
    const missing = result.failed && (result as { code?: string }).code === 'ENOENT';
    const exitCode = result.failed ? result.exitCode : 0;
    // Killed at the timeout, it wrote no message of its own.
    const stderr = result.timedOut ? `${command} did not finish within ${timeoutMs} ms` : result.stderr;
    return { exitCode, stdout: result.stdout, stderr, ...(missing ? { missing } : {}) };
  },
  async legacyTables(family) {
    const path = family === 'ipv4' ? '/proc/net/ip_tables_names' : '/proc/net/ip6_tables_names';
    try {
      return new Set((await readFile(path, 'utf8')).split('\n').filter((t) => t.length > 0));
    } catch {
      return undefined; // no ip_tables support in this kernel: no legacy tables
    }
  },
  async generation() {
    if (generationAddon === undefined) generationAddon = loadNftAddon().executor ?? null;
    if (generationAddon === null) return undefined;
    try {
      return await generationAddon.generation();
    } catch {
      return undefined;
    }
  },
};

export class IptablesCommands {
  constructor(
    readonly variant: IptablesVariant,
    readonly family: Family,
    readonly runner: IptablesRunner = systemIptablesRunner,
  ) {}

  /** The nf_tables ruleset generation (iptables-nft only; undefined for legacy or when unreadable). */
  async generation(): Promise<number | undefined> {
    if (this.variant !== 'nft' || !this.runner.generation) return undefined;
    return this.runner.generation();
  }

  /** `-save` of one table, or of every table that exists when `table` is omitted. */
  async save(table?: string): Promise<string> {
    return this.exec(variantCommand(this.variant, this.family, 'save'), table ? ['-t', table] : []);
  }

  /**
   * `-save -c -t nat`: the nat table with each rule's `[packets:bytes]`, within `timeoutMs`.
   * `onRead`: called once the table has been read (its first line printed), before the rest of
   * the output has come.
   */
  async saveCounted(timeoutMs: number, onRead?: () => void): Promise<string> {
    const command = variantCommand(this.variant, this.family, 'save');
    return this.exec(command, ['-c', '-t', 'nat'], undefined, timeoutMs, onRead);
  }

  /**
   * `iptables -t nat -S CHAIN -v`: the chain's `-A` lines with `-c PACKETS BYTES` before the
   * target, within `timeoutMs`; undefined when the chain does not exist. Cheap with iptables-nft.
   */
  async listCounted(chain: string, timeoutMs: number): Promise<string[] | undefined> {
    const command = variantCommand(this.variant, this.family, '');
    const args = ['-w', String(XTABLES_LOCK_WAIT_SECONDS), '-t', 'nat', '-S', chain, '-v'];
    try {
      return (await this.exec(command, args, undefined, timeoutMs)).split('\n').filter((l) => l.startsWith('-A '));
    } catch (err) {
      if (err instanceof IptablesError && !(err instanceof IptablesToolMissing) && err.exitCode === 1) return undefined;
      throw err;
    }
  }

  /**
   * Applies `input` in one transaction, keeping everything it does not name (--noflush) and
   * holding the xtables lock. `test`: parse and build the ruleset, commit nothing.
   */
  async restore(input: string, options: { test?: boolean } = {}): Promise<void> {
    const args = ['--noflush', '-w', String(XTABLES_LOCK_WAIT_SECONDS), ...(options.test ? ['--test'] : [])];
    await this.exec(variantCommand(this.variant, this.family, 'restore'), args, input);
  }

  /**
   * `iptables -t TABLE -S CHAIN`: the chain's `-A` lines, or undefined when the chain does not
   * exist (iptables exits 1: "No chain/target/match by that name"). Cheap with iptables-nft,
   * which fetches that chain only.
   */
  async listRules(table: string, chain: string): Promise<string[] | undefined> {
    const command = variantCommand(this.variant, this.family, '');
    const args = ['-w', String(XTABLES_LOCK_WAIT_SECONDS), '-t', table, '-S', chain];
    try {
      return (await this.exec(command, args)).split('\n').filter((l) => l.startsWith('-A '));
    } catch (err) {
      if (err instanceof IptablesError && !(err instanceof IptablesToolMissing) && err.exitCode === 1) return undefined;
      throw err;
    }
  }

  /**
   * The spec of rule 1 of a chain (the text after `-A CHAIN `), '' when the chain is empty,
   * undefined when it does not exist. Formats one rule only: cheap enough to ask every second.
   */
  async firstRule(table: string, chain: string): Promise<string | undefined> {
    const command = variantCommand(this.variant, this.family, '');
    const args = ['-w', String(XTABLES_LOCK_WAIT_SECONDS), '-t', table, '-S', chain, '1'];
    try {
      const line = (await this.exec(command, args)).split('\n').find((l) => l.startsWith(`-A ${chain}`));
      return line === undefined ? '' : line.slice(`-A ${chain} `.length);
    } catch (err) {
      if (err instanceof IptablesError && !(err instanceof IptablesToolMissing) && err.exitCode === 1) return undefined;
      throw err;
    }
  }

  private async exec(
    command: string,
    args: string[],
    input?: string,
    timeoutMs?: number,
    onOutput?: () => void,
  ): Promise<string> {
    const result = await this.runner.run(command, args, input, timeoutMs, onOutput);
    if (result.missing) {
      throw new IptablesToolMissing(`the '${command}' command was not found: install the iptables package`);
    }
    if (result.exitCode !== 0) {
      const message = iptablesErrorMessage(`${result.stderr}\n${result.stdout}`);
      // The legacy variant talks to the kernel over a raw socket: without CAP_NET_RAW even a read fails.
      const hint =
        this.variant === 'legacy' && /Permission denied/.test(message)
          ? ' (iptables-legacy needs CAP_NET_RAW besides CAP_NET_ADMIN)'
          : '';
      throw new IptablesError(`${command}: ${message}${hint}`, result.exitCode);
    }
    return result.stdout;
  }
}
