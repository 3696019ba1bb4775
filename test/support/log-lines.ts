// A logger whose lines (pino's JSON, one per call) are kept in an array the test reads.

import { Writable } from 'node:stream';
import { pino, type Level, type Logger } from 'pino';

export function linesLogger(lines: string[], level: Level = 'info'): Logger {
  return pino(
    { level },
    new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(chunk.toString());
        done();
      },
    }),
  );
}
