// The running controller's /status (health-server.ts), as `check` reads it: over loopback, within
// a bound, at most a bounded body. No answer at all means no controller runs here: the check goes
// on alone; an answer that is not a /status is said as such.

import * as http from 'node:http';
import type { BindAddress } from '../../http/endpoint.js';
import type { ModelConfig } from '../../model/types.js';
import type { ProxyMode } from '../../kubeproxy/mode.js';
import type { BackendName } from '../../driver/driver.js';

const STATUS_TIMEOUT_MS = 2000;
const MAX_STATUS_BYTES = 1 << 20;

export interface RunningController {
  kind: 'running';
  address: string;
  version?: string;
  readiness: { ok: boolean; detail: string; warnings: string[] };
  lastSuccessfulSync: string | null;
  lastError: string | null;
  /** The model's settings in force: the check derives with these. */
  model?: ModelConfig;
  /** The backend, and the settings its driver was made with. */
  backend?: {
    backend: BackendName;
    nftKeyLookup?: 'map' | 'set';
    cgroupPath?: string;
    bpffsPath?: string;
    maxEntries?: number;
    kubeProxyStepAside?: boolean;
  };
  kubeProxy?: { mode: ProxyMode; modeSource: string; version?: string | null };
  derived?: { skips: Record<string, number>; entries: { ipv4: number; ipv6: number } };
}

export type ControllerView = RunningController | { kind: 'absent'; address?: string; why: string };

function format(a: BindAddress): string {
  return a.host.includes(':') ? `[${a.host}]:${a.port}` : `${a.host}:${a.port}`;
}

export async function readControllerStatus(address: BindAddress | undefined): Promise<ControllerView> {
  if (!address) return { kind: 'absent', why: 'checked alone (--controller-address is empty)' };
  const at = format(address);
  let answer: { status: number; body: string };
  try {
    answer = await get(address);
  } catch (err) {
    return { kind: 'absent', address: at, why: `no controller answers at ${at} (${(err as Error).message})` };
  }
  let body: Record<string, unknown>;
  try {
    if (answer.status !== 200) throw new Error(`HTTP ${answer.status}`);
    body = JSON.parse(answer.body) as Record<string, unknown>;
    if (typeof body !== 'object' || body === null || typeof body.readiness !== 'object')
      throw new Error('no readiness');
  } catch (err) {
    return {
      kind: 'absent',
      address: at,
      why: `${at}/status is not the controller's status (${(err as Error).message})`,
    };
  }
  const readiness = body.readiness as { ok: boolean; detail: string; warnings: string[] };
  const kubeProxy = body.kubeProxy as RunningController['kubeProxy'];
  return {
    kind: 'running',
    address: at,
    ...(typeof body.version === 'string' ? { version: body.version } : {}),
    readiness: { ok: readiness.ok === true, detail: String(readiness.detail), warnings: readiness.warnings ?? [] },
    lastSuccessfulSync: typeof body.lastSuccessfulSync === 'string' ? body.lastSuccessfulSync : null,
    lastError: typeof body.lastError === 'string' ? body.lastError : null,
    ...(body.model ? { model: body.model as ModelConfig } : {}),
    ...(body.backend ? { backend: body.backend as RunningController['backend'] } : {}),
    ...(kubeProxy ? { kubeProxy } : {}),
    ...(body.derived ? { derived: body.derived as RunningController['derived'] } : {}),
  };
}

function get(address: BindAddress): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = http.get(
      { host: address.host, port: address.port, path: '/status', timeout: STATUS_TIMEOUT_MS },
      (res) => {
        let body = '';
        res.setEncoding('utf8');
        res.on('data', (chunk: string) => {
          body += chunk;
          if (body.length > MAX_STATUS_BYTES) req.destroy(new Error(`more than ${MAX_STATUS_BYTES} bytes`));
        });
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
        res.on('error', reject);
      },
    );
    req.on('timeout', () => req.destroy(new Error(`no answer within ${STATUS_TIMEOUT_MS} ms`)));
    req.on('error', reject);
  });
}
