// Reading the controller's HTTP endpoints from tests: /metrics parsed into series, health JSON,
// and `promtool check metrics` (Debian package prometheus) on an exposition.

import { spawn } from 'node:child_process';
import http from 'node:http';

export interface HttpAnswer {
  status: number;
  contentType: string;
  body: string;
}

export function httpGet(url: string, method = 'GET'): Promise<HttpAnswer> {
  return new Promise((resolve, reject) => {
    const req = http.request(url, { method, agent: false }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => (body += c));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, contentType: String(res.headers['content-type']), body }),
      );
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** The samples of a text exposition, keyed `name{label="value",...}` with labels sorted. */
export class Exposition {
  readonly samples = new Map<string, number>();
  readonly help = new Map<string, string>();
  readonly types = new Map<string, string>();

  constructor(readonly text: string) {
    for (const line of text.split('\n')) {
      if (line.startsWith('# HELP ')) {
        const [name, ...rest] = line.slice(7).split(' ');
        this.help.set(name!, rest.join(' '));
      } else if (line.startsWith('# TYPE ')) {
        const [name, type] = line.slice(7).split(' ');
        this.types.set(name!, type!);
      } else if (line && !line.startsWith('#')) {
        const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)/.exec(line);
        if (!m) throw new Error(`not an exposition line: ${line}`);
        const labels = m[2] ? parseLabels(m[2]) : {};
        this.samples.set(seriesKey(m[1]!, labels), Number(m[3]));
      }
    }
  }

  /** The sample's value, or undefined when the series is absent. */
  value(name: string, labels: Record<string, string> = {}): number | undefined {
    return this.samples.get(seriesKey(name, labels));
  }

  /** Sum over every series of `name` whose labels include `labels`. */
  sum(name: string, labels: Record<string, string> = {}): number {
    let total = 0;
    for (const [key, v] of this.samples) {
      const m = /^([^{]+)(?:\{(.*)\})?$/.exec(key)!;
      if (m[1] !== name) continue;
      const own = m[2] ? parseLabels(m[2]) : {};
      if (Object.entries(labels).every(([k, want]) => own[k] === want)) total += v;
    }
    return total;
  }

  /** Metric family names (HELP lines). */
  families(): string[] {
    return [...this.help.keys()];
  }
}

function parseLabels(text: string): Record<string, string> {
  const out: Record<string, string> = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;
  for (let m = re.exec(text); m; m = re.exec(text))
    out[m[1]!] = m[2]!.replace(/\\(.)/g, (_, c: string) => (c === 'n' ? '\n' : c));
  return out;
}

function seriesKey(name: string, labels: Record<string, string>): string {
  const keys = Object.keys(labels).sort();
  return keys.length === 0 ? name : `${name}{${keys.map((k) => `${k}="${labels[k]}"`).join(',')}}`;
}

export async function scrapeMetrics(baseUrl: string): Promise<Exposition> {
  const answer = await httpGet(`${baseUrl}/metrics`);
  if (answer.status !== 200) throw new Error(`/metrics answered ${answer.status}: ${answer.body}`);
  return new Exposition(answer.body);
}

/** Runs `promtool check metrics` on the text; resolves with its exit code and output. */
export function promtoolCheckMetrics(text: string): Promise<{ code: number; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn('promtool', ['check', 'metrics'], { stdio: ['pipe', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code: code ?? -1, output }));
    child.stdin.end(text);
  });
}
