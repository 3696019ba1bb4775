// The continuous probe's flags (--probe-*), read and checked into ProbeSettings (src/probe/).

import type { ProbeSettings } from '../probe/prober.js';
import { duration, serviceName, UsageError } from './flag-values.js';

export const DEFAULT_PROBED_SERVICES = 16;
export const MAX_PROBED_SERVICES = 64;
const MIN_INTERVAL_MS = 5_000;
const MIN_TIMEOUT_MS = 100;
const MAX_TIMEOUT_MS = 10_000;

export function probeSettings(o: Record<string, unknown>): ProbeSettings {
  const named = ((o.probeService as string[] | undefined) ?? []).map((s) => serviceName('--probe-service', s));
  const maxText = String(o.probeMaxServices);
  if (!/^\d+$/.test(maxText) || Number(maxText) > MAX_PROBED_SERVICES) {
    throw new UsageError(`--probe-max-services: '${maxText}' must be an integer from 0 to ${MAX_PROBED_SERVICES}`);
  }
  const maxServices = Number(maxText);
  const services = [...new Set(named)];
  if (services.length > maxServices) {
    throw new UsageError(
      `--probe-service names ${services.length} Services, more than --probe-max-services (${maxServices})`,
    );
  }
  const intervalMs = duration('--probe-interval', String(o.probeInterval), MIN_INTERVAL_MS);
  const timeoutMs = duration('--probe-timeout', String(o.probeTimeout), MIN_TIMEOUT_MS);
  if (timeoutMs > MAX_TIMEOUT_MS) throw new UsageError(`--probe-timeout: at most ${MAX_TIMEOUT_MS / 1000}s`);
  if (timeoutMs >= intervalMs) throw new UsageError('--probe-timeout must be shorter than --probe-interval');
  const readiness = o.probeReadiness === true;
  if (readiness && services.length === 0) {
    throw new UsageError('--probe-readiness needs --probe-service: annotated Services never make a node unready');
  }
  return { services, maxServices, intervalMs, timeoutMs, readiness };
}
