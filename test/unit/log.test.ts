// The log line format operators' pipelines read: string levels, ISO 8601 time, errors in `err`.

import { Writable } from 'node:stream';
import { expect } from 'chai';
import { createLogger, logFatal } from '../../src/log.js';

function capture() {
  const lines: Array<Record<string, unknown>> = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      for (const line of chunk
        .toString()
        .split('\n')
        .filter((l) => l !== ''))
        lines.push(JSON.parse(line));
      done();
    },
  });
  return { lines, logger: createLogger({ level: 'debug', node: 'worker-1' }, stream) };
}

describe('log format', () => {
  it('has string levels, an ISO 8601 time, the node and the message', () => {
    const { lines, logger } = capture();
    logger.info({ services: 3 }, 'caches synced');
    logger.debug('d');
    logger.warn('w');
    logger.error('e');
    expect(lines.map((l) => l.level)).to.deep.equal(['info', 'debug', 'warn', 'error']);
    const [first] = lines;
    expect(first).to.include({ node: 'worker-1', name: 'ipvs-node-controller', services: 3, msg: 'caches synced' });
    expect(first!.time).to.be.a('string');
    expect(first!.time).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(new Date(first!.time as string).toISOString()).to.equal(first!.time);
  });

  it('puts an error in `err` with its type, message and code, not in msg', () => {
    const { lines, logger } = capture();
    const err = Object.assign(new Error('connect ECONNREFUSED 10.96.0.1:443'), { code: 'ECONNREFUSED' });
    logger.warn({ resource: 'services', retryInMs: 500, err }, 'cannot list/watch services, keeping the last rules');
    const [line] = lines;
    expect(line!.err).to.deep.equal({
      type: 'Error',
      message: 'connect ECONNREFUSED 10.96.0.1:443',
      code: 'ECONNREFUSED',
    });
    expect(line!.msg).to.equal('cannot list/watch services, keeping the last rules');
    expect(String(line!.msg)).not.to.include('ECONNREFUSED');
  });

  it('ends a run with a fatal JSON line: err, exit code, and the stack of an unexpected error', () => {
    const { lines, logger } = capture();
    const stderr: string[] = [];
    const write = process.stderr.write.bind(process.stderr);
    process.stderr.write = ((text: string) => stderr.push(text) > 0) as typeof process.stderr.write;
    try {
      logFatal(logger, new Error('no cgroup v2 mount in /proc/mounts'));
      logFatal(logger, new TypeError('x is undefined'), true);
    } finally {
      process.stderr.write = write;
    }
    expect(lines[0]).to.include({ level: 'fatal', msg: 'exiting', exitCode: 1 });
    expect(lines[0]!.err).to.deep.equal({ type: 'Error', message: 'no cgroup v2 mount in /proc/mounts' });
    expect(lines[0]).not.to.have.property('stack');
    expect(lines[1]).to.include({ level: 'fatal', msg: 'unexpected error, exiting' });
    expect(lines[1]!.stack).to.match(/^TypeError: x is undefined\n\s+at /);
    expect(stderr[0]).to.equal('ipvs-node-controller: no cgroup v2 mount in /proc/mounts\n');
    expect(stderr[1]).to.match(/^ipvs-node-controller: unexpected error: TypeError: x is undefined\n/);
  });
});
