// kube-proxy's version, as kube-proxy itself says it on its metrics address: the `git_version`
// label of `kubernetes_build_info` on GET /metrics (component-base/metrics/prometheus/version;
// `gitVersion` before Kubernetes 1.19). What comes back is another process's text: the read is
// bounded in bytes and time, and a value is taken only when it looks like a Kubernetes version.

import http from 'node:http';
import type { BindAddress } from '../http/endpoint.js';

/** A version as Kubernetes builds stamp it: vMAJOR.MINOR.PATCH, then `-pre-release`, then `+build`. */
export interface KubeProxyVersion {
  /** As kube-proxy gave it (at most MAX_VERSION_LENGTH characters). */
  text: string;
  major: number;
  minor: number;
  patch: number;
  /**
   * Kubernetes' own pre-release (`alpha.N`, `beta.N`, `rc.N`, and what a build between tags adds
   * after it): it comes before the release. Any other suffix (`-eks-5d4a308`, `-gke.1080000`) is a
   * vendor's build of the release itself and is not kept here.
   */
  prerelease: Array<string | number>;
}

/** Longer than any version Kubernetes or a vendor stamps; a longer value is not taken. */
export const MAX_VERSION_LENGTH = 128;

const VERSION = /^v(\d{1,4})\.(\d{1,4})\.(\d{1,6})(?:-([0-9A-Za-z.-]{1,100}))?(?:\+([0-9A-Za-z.-]{1,100}))?$/;
const UPSTREAM_PRERELEASE = /^(alpha|beta|rc)\.\d+(\.|$)/;

/** The version in `text`, or undefined when it is no vMAJOR.MINOR.PATCH[-suffix][+build]. */
export function parseKubeProxyVersion(text: string): KubeProxyVersion | undefined {
  if (text.length > MAX_VERSION_LENGTH) return undefined;
  const m = VERSION.exec(text);
  if (!m) return undefined;
  const suffix = m[4];
  const prerelease =
    suffix !== undefined && UPSTREAM_PRERELEASE.test(suffix)
      ? suffix.split('.').map((p) => (/^\d+$/.test(p) ? Number(p) : p))
      : [];
  return { text, major: Number(m[1]), minor: Number(m[2]), patch: Number(m[3]), prerelease };
}

/** Semantic-version precedence (build metadata ignored): negative when a comes before b. */
export function compareVersions(a: KubeProxyVersion, b: KubeProxyVersion): number {
  const core = a.major - b.major || a.minor - b.minor || a.patch - b.patch;
  if (core !== 0) return core;
  // A pre-release comes before its release.
  if (a.prerelease.length === 0 || b.prerelease.length === 0) return b.prerelease.length - a.prerelease.length;
  for (let i = 0; i < Math.max(a.prerelease.length, b.prerelease.length); i++) {
    const x = a.prerelease[i];
    const y = b.prerelease[i];
    if (x === undefined) return -1;
    if (y === undefined) return 1;
    if (x === y) continue;
    if (typeof x === 'number' && typeof y === 'number') return x - y;
    if (typeof x === 'number') return -1; // numeric identifiers come first
    if (typeof y === 'number') return 1;
    return x < y ? -1 : 1;
  }
  return 0;
}

/** The metric family and the labels that carry the version (since 1.19, and before). */
const BUILD_INFO = 'kubernetes_build_info';
const VERSION_LABELS = ['git_version', 'gitVersion'];

/**
 * The version label of one exposition line `kubernetes_build_info{...} 1`, unchecked: undefined
 * for another line, '' for that line without a version label (or with labels that do not parse).
 */
export function buildInfoVersionLabel(line: string): string | undefined {
  if (!line.startsWith(`${BUILD_INFO}{`)) return undefined;
  const end = line.lastIndexOf('}');
  if (end < 0) return '';
  const labels = new Map<string, string>();
  // name="value", values with the exposition format's escapes (\\, \", \n).
  const pair = /\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)/y;
  const body = line.slice(BUILD_INFO.length + 1, end);
  pair.lastIndex = 0;
  while (pair.lastIndex < body.length) {
    const m = pair.exec(body);
    if (!m) return '';
    labels.set(
      m[1]!,
      m[2]!.replace(/\\(.)/g, (_s, c: string) => (c === 'n' ? '\n' : c)),
    );
  }
  for (const name of VERSION_LABELS) {
    const v = labels.get(name);
    if (v !== undefined) return v;
  }
  return '';
}

/** What reading the version gave: the version, or why there is none. */
export type VersionRead = { version: KubeProxyVersion; problem?: undefined } | { version?: undefined; problem: string };

/** At most this much of /metrics is read: kubernetes_build_info sorts before most of kube-proxy's families. */
export const MAX_METRICS_BYTES = 4 * 1024 * 1024;
/** A longer line is skipped unread (the build info line is a few hundred bytes). */
const MAX_LINE_BYTES = 16 * 1024;

/**
 * GET /metrics up to the kubernetes_build_info line; never throws and never waits longer than
 * timeoutMs. A problem is one line that names what /metrics did.
 */
export function fetchKubeProxyVersion(address: BindAddress, timeoutMs: number): Promise<VersionRead> {
  return new Promise((resolve) => {
    let settled = false;
    const done = (r: VersionRead) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      req.destroy();
      resolve(r);
    };
    const timer = setTimeout(() => done({ problem: `no answer within ${timeoutMs}ms` }), timeoutMs);
    const req = http.get(
      {
        host: address.host,
        port: address.port,
        path: '/metrics',
        agent: false,
        // The text format, uncompressed (no accept-encoding): what a line reader can read.
        headers: { accept: 'text/plain;version=0.0.4' },
      },
      (res) => {
        if (res.statusCode !== 200) {
          res.resume();
          done({ problem: `HTTP ${res.statusCode}` });
          return;
        }
        let read = 0;
        let line = '';
        let skipping = false;
        const take = (text: string) => {
          const value = buildInfoVersionLabel(text);
          if (value === undefined) return false;
          const version = parseKubeProxyVersion(value);
          done(
            version
              ? { version }
              : { problem: `${BUILD_INFO} carries no version: ${JSON.stringify(value.slice(0, 40))}` },
          );
          return true;
        };
        res.setEncoding('latin1'); // one character per byte: lengths are bytes; a version is ASCII
        res.on('data', (chunk: string) => {
          read += chunk.length;
          let start = 0;
          for (let nl = chunk.indexOf('\n'); nl >= 0; nl = chunk.indexOf('\n', start)) {
            const long = skipping || line.length + (nl - start) > MAX_LINE_BYTES;
            if (!long && take(line + chunk.slice(start, nl))) return;
            line = '';
            skipping = false;
            start = nl + 1;
          }
          if (!skipping) line += chunk.slice(start);
          if (line.length > MAX_LINE_BYTES) {
            line = '';
            skipping = true;
          }
          if (read > MAX_METRICS_BYTES) done({ problem: `no ${BUILD_INFO} in the first ${MAX_METRICS_BYTES} bytes` });
        });
        res.on('end', () => {
          if (!skipping && take(line)) return;
          done({ problem: `no ${BUILD_INFO}` });
        });
        res.on('error', (err) => done({ problem: err.message }));
      },
    );
    req.on('error', (err: NodeJS.ErrnoException) =>
      done({ problem: err.code === 'ECONNREFUSED' ? 'connection refused' : (err.code ?? err.message) }),
    );
  });
}
