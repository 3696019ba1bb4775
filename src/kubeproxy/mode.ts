// kube-proxy's live mode on this node, from three signals:
//   1. GET /proxyMode on kube-proxy's metrics address (what kube-proxy itself says),
//   2. the kube-ipvs0 interface (IPVS mode binds every Service address to it),
//   3. the mode in kube-proxy's configuration file.
// The first answer that is positive decides, in that order; only the interface and the file
// together may say "not IPVS" while kube-proxy does not answer (it restarts, say).
// Beside the mode, kube-proxy's version (version.ts) and the known bugs of that mode and version
// (known-issues.ts). The controller runs with hostNetwork: 127.0.0.1 and /proc/net/dev are the node's.

import http from 'node:http';
import { readFile } from 'node:fs/promises';
import type { Logger } from 'pino';
import type { BindAddress } from '../http/endpoint.js';
import { describeKnownIssue, knownIssues } from './known-issues.js';
import { fetchKubeProxyVersion } from './version.js';

export type ProxyMode = 'ipvs' | 'iptables' | 'nftables' | 'kernelspace' | 'unknown';
export const PROXY_MODES: readonly ProxyMode[] = ['ipvs', 'iptables', 'nftables', 'kernelspace', 'unknown'];

export const IPVS_INTERFACE = 'kube-ipvs0';

export interface ModeSignals {
  /** kube-proxy's /proxyMode answer; undefined when nothing usable answered. */
  live?: ProxyMode;
  /** Why there is no live answer (refused, timeout, an answer that is no mode). */
  liveProblem?: string;
  ipvsInterface: boolean;
  /** The mode in kube-proxy's configuration file, when it sets one. */
  configured?: string;
}

export interface ModeVerdict {
  mode: ProxyMode;
  /** Which signal decided. */
  source: 'proxyMode' | 'kube-ipvs0' | 'kube-proxy-config' | 'none';
  /** One line for logs and /readyz. */
  detail: string;
  /** kube-proxy's version (kubernetes_build_info on its metrics address), when known. */
  version?: string;
  /** Why the version is not known, when it is not. */
  versionProblem?: string;
}

export function judgeMode(s: ModeSignals): ModeVerdict {
  if (s.live) {
    const extra = s.live !== 'ipvs' && s.ipvsInterface ? ` (a leftover ${IPVS_INTERFACE} exists)` : '';
    return { mode: s.live, source: 'proxyMode', detail: `kube-proxy answers /proxyMode: ${s.live}${extra}` };
  }
  const why = s.liveProblem ?? 'no answer';
  if (s.ipvsInterface) {
    return { mode: 'ipvs', source: 'kube-ipvs0', detail: `${IPVS_INTERFACE} exists; /proxyMode: ${why}` };
  }
  if (s.configured && (PROXY_MODES as readonly string[]).includes(s.configured)) {
    return {
      mode: s.configured as ProxyMode,
      source: 'kube-proxy-config',
      detail: `kube-proxy's configuration sets mode ${s.configured} and there is no ${IPVS_INTERFACE}; /proxyMode: ${why}`,
    };
  }
  return {
    mode: 'unknown',
    source: 'none',
    detail: `no ${IPVS_INTERFACE}, no mode in a kube-proxy configuration; /proxyMode: ${why}`,
  };
}

/** Whether kube-proxy is positively in a mode where our translation breaks traffic. */
export function isNonIpvsMode(mode: ProxyMode): boolean {
  return mode === 'iptables' || mode === 'nftables';
}

/** At most this much of an answer is read: /proxyMode is one word. */
const MAX_ANSWER_BYTES = 256;

/** GET /proxyMode; never throws and never waits longer than timeoutMs. */
export function fetchProxyMode(
  address: BindAddress,
  timeoutMs: number,
): Promise<Pick<ModeSignals, 'live' | 'liveProblem'>> {
  return new Promise((resolve) => {
    let settled = false;
    const done = (r: Pick<ModeSignals, 'live' | 'liveProblem'>) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => done({ liveProblem: `no answer within ${timeoutMs}ms` }), timeoutMs);
    const req = http.get(
      { host: address.host, port: address.port, path: '/proxyMode', agent: false, headers: { accept: 'text/plain' } },
      (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          done({ liveProblem: `HTTP ${res.statusCode}` });
          return;
        }
        let body = '';
        res.setEncoding('latin1');
        res.on('data', (chunk: string) => {
          body += chunk;
          if (body.length > MAX_ANSWER_BYTES) done({ liveProblem: 'an answer too long to be a mode' });
        });
        res.on('end', () => {
          const word = body.trim().toLowerCase();
          if ((PROXY_MODES as readonly string[]).includes(word) && word !== 'unknown')
            done({ live: word as ProxyMode });
          else done({ liveProblem: `an answer that is no mode: ${JSON.stringify(body.slice(0, 40))}` });
        });
        res.on('error', (err) => done({ liveProblem: err.message }));
      },
    );
    req.on('error', (err: NodeJS.ErrnoException) =>
      done({ liveProblem: err.code === 'ECONNREFUSED' ? 'connection refused' : (err.code ?? err.message) }),
    );
  });
}

/** Whether kube-ipvs0 exists in this process's network namespace (/proc/net is per namespace). */
export async function hasIpvsInterface(procNetDev = '/proc/net/dev'): Promise<boolean> {
  try {
    const text = await readFile(procNetDev, 'utf8');
    return text.split('\n').some((line) => line.trimStart().startsWith(`${IPVS_INTERFACE}:`));
  } catch {
    return false;
  }
}

/** The version is read again this often while kube-proxy answers (and at once after it did not answer). */
export const VERSION_READ_INTERVAL_MS = 60_000;

export interface ModeMonitorOptions {
  /** kube-proxy's metrics address now; undefined: /proxyMode is not asked. */
  metricsAddress: () => BindAddress | undefined;
  intervalMs: number;
  /** How many polls in a row must agree before a new mode is taken (the first poll is taken at once). */
  confirmations: number;
  timeoutMs: number;
  /** The mode kube-proxy's configuration file sets now. */
  configuredMode: () => string | undefined;
  /** How often the version is read while kube-proxy keeps answering; default VERSION_READ_INTERVAL_MS. */
  versionIntervalMs?: number;
  logger: Logger;
  onChange: (verdict: ModeVerdict) => void;
}

/**
 * Polls the signals and reports a mode once it was seen `confirmations` times in a row, and a new
 * version of kube-proxy at once (it is kube-proxy's own answer). The version is read beside
 * /proxyMode, bounded by the same timeout, at the first look, after kube-proxy did not answer (a
 * restart may bring another build), and every versionIntervalMs; it is taken only from a look at
 * which kube-proxy answered /proxyMode, and kept while kube-proxy does not answer.
 */
export class ModeMonitor {
  private timer: NodeJS.Timeout | undefined;
  private stable: ModeVerdict | undefined;
  private candidate: { verdict: ModeVerdict; seen: number } | undefined;
  private polling: Promise<void> | undefined;
  private stopped = false;
  private version: Pick<ModeVerdict, 'version' | 'versionProblem'> = {
    versionProblem: 'kube-proxy has not answered /proxyMode yet',
  };
  /** kube-proxy has not answered since the version was read: the next answer may be another build. */
  private versionStale = true;
  private versionReadAt = 0;

  constructor(private readonly options: ModeMonitorOptions) {}

  get current(): ModeVerdict {
    return this.stable ?? { mode: 'unknown', source: 'none', detail: 'not looked yet' };
  }

  /** Looks once now (the result is taken at once), then every interval. */
  async start(): Promise<ModeVerdict> {
    await this.poll();
    if (!this.stopped) this.schedule();
    return this.current;
  }

  async stop(): Promise<void> {
    this.stopped = true;
    clearTimeout(this.timer);
    await this.polling;
  }

  /**
   * One look at the signals, as --dry-run takes it; with `version`, kube-proxy's version is read
   * beside /proxyMode (same timeout: the look takes no longer), and kept when /proxyMode answered.
   */
  static async look(options: {
    metricsAddress?: BindAddress;
    timeoutMs: number;
    configured?: string;
    version?: boolean;
  }): Promise<ModeVerdict> {
    const address = options.metricsAddress;
    const [live, read, ipvsInterface] = await Promise.all([
      address ? fetchProxyMode(address, options.timeoutMs) : {},
      address && options.version ? fetchKubeProxyVersion(address, options.timeoutMs) : undefined,
      hasIpvsInterface(),
    ]);
    const verdict = judgeMode({ ...live, ipvsInterface, configured: options.configured });
    if (!options.version) return verdict;
    if (!address) return { ...verdict, versionProblem: 'no kube-proxy metrics address' };
    if (verdict.source !== 'proxyMode') return { ...verdict, versionProblem: '/proxyMode gives no mode' };
    return read?.version
      ? { ...verdict, version: read.version.text }
      : { ...verdict, versionProblem: `/metrics: ${read?.problem}` };
  }

  private schedule(): void {
    this.timer = setTimeout(() => {
      this.polling = this.poll().finally(() => {
        this.polling = undefined;
        if (!this.stopped) this.schedule();
      });
    }, this.options.intervalMs);
  }

  private async poll(): Promise<void> {
    let verdict: ModeVerdict;
    const now = Date.now();
    const readVersion =
      this.versionStale || now - this.versionReadAt >= (this.options.versionIntervalMs ?? VERSION_READ_INTERVAL_MS);
    try {
      verdict = await ModeMonitor.look({
        metricsAddress: this.options.metricsAddress(),
        timeoutMs: this.options.timeoutMs,
        configured: this.options.configuredMode(),
        version: readVersion,
      });
    } catch (err) {
      verdict = { mode: 'unknown', source: 'none', detail: `cannot look: ${(err as Error).message}` };
    }
    if (this.stopped) return;
    if (verdict.source !== 'proxyMode') {
      this.versionStale = true; // the version read before stays until kube-proxy answers again
    } else if (readVersion) {
      this.version = { version: verdict.version, versionProblem: verdict.versionProblem };
      this.versionStale = false;
      this.versionReadAt = now;
    }
    verdict = { ...verdict, ...this.version };
    if (!this.stable) {
      this.adopt(verdict);
      return;
    }
    if (verdict.mode === this.stable.mode) {
      this.candidate = undefined;
      // A new version is kube-proxy's own answer: taken at once. Else maybe a fresher detail.
      if (verdict.version !== this.stable.version) this.adopt(verdict);
      else this.stable = verdict;
      return;
    }
    if (this.candidate?.verdict.mode === verdict.mode) this.candidate.seen++;
    else this.candidate = { verdict, seen: 1 };
    if (this.candidate.seen >= this.options.confirmations) this.adopt(verdict);
  }

  private adopt(verdict: ModeVerdict): void {
    const previous = this.stable;
    this.stable = verdict;
    this.candidate = undefined;
    const { logger } = this.options;
    logger.info(
      {
        mode: verdict.mode,
        version: verdict.version ?? 'unknown',
        source: verdict.source,
        detail: verdict.detail,
        ...(verdict.versionProblem ? { versionProblem: verdict.versionProblem } : {}),
        previous: previous?.mode,
        previousVersion: previous ? (previous.version ?? 'unknown') : undefined,
      },
      'Detected the kube-proxy mode',
    );
    // Known bugs of kube-proxy, logged once per change of mode or version while they apply.
    const before = new Set(previous ? knownIssues(previous.mode, previous.version).map((i) => i.id) : []);
    const now = knownIssues(verdict.mode, verdict.version);
    for (const issue of now) {
      logger.warn(
        {
          issue: issue.id,
          kubeProxyMode: verdict.mode,
          kubeProxyVersion: verdict.version,
          detail: describeKnownIssue(issue, verdict.version!),
        },
        'Known kube-proxy bug breaks traffic to external addresses',
      );
      before.delete(issue.id);
    }
    for (const id of before) {
      logger.info(
        { issue: id, kubeProxyMode: verdict.mode, kubeProxyVersion: verdict.version ?? 'unknown' },
        'No longer reporting the known kube-proxy bug',
      );
    }
    this.options.onChange(verdict);
  }
}
