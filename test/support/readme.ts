// Reading the README's code blocks, to hold what it shows to what the commands print.

/** The lines of the first fenced code block after `marker` in `text`. */
export function codeBlockAfter(text: string, marker: string): string[] {
  const at = text.indexOf(marker);
  if (at < 0) throw new Error(`README: no "${marker}"`);
  const open = text.indexOf('```', at);
  const start = text.indexOf('\n', open) + 1;
  const end = text.indexOf('\n```', start);
  if (open < 0 || end < 0) throw new Error(`README: no code block after "${marker}"`);
  return text.slice(start, end).split('\n');
}

const flat = (l: string) => l.replace(/ +/g, ' ').trimEnd();

/**
 * Whether `lines` (a command's output) is what `shown` shows of it: each line of `shown` is the
 * next line of the output, except after a line `isElision` takes for "left out here", after which
 * the next non-blank line shown is looked for further on. Runs of spaces count as one, trailing
 * blank lines of the output are ignored. `{ missing: undefined }` when so, else the first line
 * shown that is not where it should be.
 */
export function shownAsPrinted(
  shown: string[],
  lines: string[],
  isElision: (line: string) => boolean,
): { missing: string | undefined } {
  let at = 0;
  let skipping = false;
  for (const line of shown) {
    if (isElision(line)) {
      skipping = true;
      continue;
    }
    if (skipping && line.trim() === '') continue;
    const found = skipping
      ? lines.findIndex((l, i) => i >= at && flat(l) === flat(line))
      : at < lines.length && flat(lines[at]!) === flat(line)
        ? at
        : -1;
    if (found < 0) return { missing: line };
    at = found + 1;
    skipping = false;
  }
  const rest = lines.slice(at).filter((l) => l.trim() !== '');
  return { missing: skipping || rest.length === 0 ? undefined : `(not shown, not elided) ${rest[0]}` };
}

/**
 * Whether `wanted` occurs in `lines` in its order (other lines between allowed), each compared
 * with its runs of spaces made one: `{ missing: undefined }` when so, else the first line not found
 * after the ones before it.
 */
export function inOrder(wanted: string[], lines: string[]): { missing: string | undefined } {
  let at = 0;
  for (const line of wanted) {
    const found = lines.findIndex((l, i) => i >= at && flat(l) === flat(line));
    if (found < 0) return { missing: line };
    at = found + 1;
  }
  return { missing: undefined };
}
