// Percentiles as the benchmarks report them (nearest rank on the sorted samples), their tables,
// and their command lines.

import { parseArgs } from 'node:util';

export function percentile(values: readonly number[], p: number): number {
  if (values.length === 0) return NaN;
  const sorted = [...values].sort((a, b) => a - b);
  const rank = Math.ceil((p / 100) * sorted.length);
  return sorted[Math.min(sorted.length - 1, Math.max(0, rank - 1))]!;
}

export function median(values: readonly number[]): number {
  return percentile(values, 50);
}

/** A seeded generator (mulberry32), so that every run changes the same Services in the same order. */
export function seededRandom(seed: number): () => number {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** The cells of a header: 'a|b|c' or a list. */
const cells = (header: string | string[]) => (typeof header === 'string' ? header.split('|') : header);

/** Columns of text two spaces apart, the first left-aligned, the others right-aligned. */
export function table(head: string | string[], rows: string[][], indent = ''): string[] {
  const header = cells(head);
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => (r[i] ?? '').length)));
  const line = (cells: string[]) =>
    indent +
    cells
      .map((c, i) => (i === 0 ? c.padEnd(widths[i]!) : c.padStart(widths[i]!)))
      .join('  ')
      .trimEnd();
  return [line(header), ...rows.map(line)];
}

/** A Markdown table. */
export function markdown(head: string | string[], rows: Array<Array<string | number>>): string[] {
  const header = cells(head);
  const line = (cells: Array<string | number>) => `| ${cells.join(' | ')} |`;
  return [line(header), line(header.map(() => '---')), ...rows.map(line)];
}

type Option = string | number | boolean | undefined;
export type Options<D extends Record<string, Option>> = {
  [K in keyof D]: undefined extends D[K]
    ? string | undefined
    : D[K] extends number
      ? number
      : D[K] extends boolean
        ? boolean
        : string;
};

/**
 * `--name VALUE` options with their defaults (undefined: none): a number default makes the option a
 * whole number of at least `least[name]` (1), a boolean one a flag. Unknown options throw.
 */
export function options<D extends Record<string, Option>>(
  argv: string[],
  defaults: D,
  least: Partial<Record<keyof D, number>> = {},
): Options<D> {
  const spec = Object.fromEntries(
    Object.entries(defaults).map(([k, d]) => [
      k,
      typeof d === 'boolean'
        ? { type: 'boolean' as const, default: d }
        : { type: 'string' as const, ...(d === undefined ? {} : { default: String(d) }) },
    ]),
  );
  const { values } = parseArgs({ args: argv, options: spec });
  const out: Record<string, unknown> = { ...values };
  for (const [k, d] of Object.entries(defaults)) {
    if (typeof d !== 'number') continue;
    const n = Number(values[k]);
    const min = least[k] ?? 1;
    if (!Number.isInteger(n) || n < min)
      throw new Error(`--${k}: '${String(values[k])}' is not a whole number of at least ${min}`);
    out[k] = n;
  }
  return out as Options<D>;
}
