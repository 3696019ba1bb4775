// The check's report as a person reads it: one line per thing seen, `ok` or `BROKEN` first where a
// verdict is given, the result last (docs/operations.md, "Prove it works", explains each line).

import type { CheckReport } from './check.js';

const mark = (ok: boolean) => (ok ? 'ok    ' : 'BROKEN');

export function renderText(r: CheckReport): string {
  const lines: string[] = [];
  lines.push(`node        ${r.node}: kernel ${r.kernel}, ipvs-node-controller ${r.version}`);
  const c = r.controller;
  if (c.kind === 'running') {
    const ready = c.readiness.ok ? 'ready' : `NOT ready: ${c.readiness.detail}`;
    const last = c.lastSuccessfulSync ? `last sync ${c.lastSuccessfulSync}` : 'no sync yet';
    lines.push(
      `controller  running at ${c.address}: ${ready}; ${last}${c.lastError ? `; last error: ${c.lastError}` : ''}`,
    );
    for (const w of c.readiness.warnings) lines.push(`controller  warning: ${w}`);
  } else {
    lines.push(`controller  ${c.why}: derived from this command's flags`);
  }
  const k = r.kubeProxy;
  lines.push(
    `kube-proxy  ${k.mode} mode (${k.source}), version ${k.version ?? 'unknown'}` +
      (k.steppedAside ? ': the controller steps aside, kube-proxy translates' : ''),
  );
  lines.push(`backend     ${r.backend.name} (${r.backend.reason})`);
  const d = r.detectLocal;
  lines.push(`detect      ${d.mode}: pods are ${d.pods.length > 0 ? d.pods.join(', ') : 'not told apart'}`);
  for (const p of d.problems) lines.push(`detect      no pod rules for ${p}`);
  const skips = Object.entries(r.skips).map(([reason, n]) => `${reason} ${n}`);
  lines.push(
    `services    ${r.services} read; ${r.entries.ipv4} IPv4 and ${r.entries.ipv6} IPv6 entries; ` +
      `skipped: ${skips.length > 0 ? skips.join(', ') : 'none'}`,
  );
  for (const f of r.findings) lines.push(`${f.check.padEnd(11)} ${mark(f.ok)} ${f.family} ${f.detail}`);
  if (r.ipvs) lines.push(`ipvs        ${r.ipvs}`);
  for (const p of r.paths) {
    const at = p.skipped && p.port === 0 ? p.address : `${p.address} ${p.protocol.toLowerCase()}/${p.port}`;
    if (p.skipped) {
      lines.push(`path        skip   ${p.service} ${at}: ${p.skipped}`);
      continue;
    }
    lines.push(`path        ${mark(p.ok)} ${p.service} ${at} -> ${p.clusterIp}: ${p.detail} [${p.ms} ms]`);
    const t = p.tracked;
    if (t) {
      lines.push(
        'problem' in t
          ? `tracked     ${p.service} ${at}: not counted: ${t.problem}`
          : `tracked     ${p.service} ${at}: ${t.connections} connections in conntrack now, ${t.translated} translated`,
      );
    }
  }
  if (r.bounded) lines.push(`bounds      ${r.bounded}`);
  for (const t of r.translated ?? []) {
    lines.push(`counted     ${t.family} ${t.source}: ${t.connections} connections translated`);
  }
  const tried = r.paths.filter((p) => !p.skipped);
  const broken = tried.filter((p) => !p.ok).length + r.findings.filter((f) => !f.ok).length;
  lines.push(
    r.ok
      ? `result      ok: ${tried.length} paths answered and translated, ${r.findings.length} kernel checks passed`
      : `result      BROKEN: ${broken} of ${tried.length + r.findings.length} checks failed`,
  );
  return lines.join('\n') + '\n';
}
