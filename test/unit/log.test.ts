// The log line formats operators' pipelines read: pino's JSON (string levels, ISO 8601 time,
// errors in `err`) and klog's text format (--log-format=text), with constant messages and the
// values in fields.

import { Writable } from 'node:stream';
import { expect } from 'chai';
import { createLogger, jsonToKlogText, klogHeader, kobj, logFatal, quoteGo, type LogFormat } from '../../src/log.js';

function sink(format: LogFormat = 'json') {
  const raw: string[] = [];
  const stream = new Writable({
    write(chunk: Buffer, _encoding, done) {
      raw.push(
        ...chunk
          .toString()
          .split('\n')
          .filter((l) => l !== ''),
      );
      done();
    },
  });
  return { raw, logger: createLogger({ level: 'debug', node: 'worker-1', format }, stream) };
}

function capture() {
  const { raw, logger } = sink();
  return {
    logger,
    get lines() {
      return raw.map((l) => JSON.parse(l) as Record<string, unknown>);
    },
  };
}

/** Runs `fn` with stderr captured. */
function withStderr(fn: () => void): string[] {
  const stderr: string[] = [];
  const write = process.stderr.write.bind(process.stderr);
  process.stderr.write = ((text: string) => stderr.push(text) > 0) as typeof process.stderr.write;
  try {
    fn();
  } finally {
    process.stderr.write = write;
  }
  return stderr;
}

describe('log format: json (the default)', () => {
  it('has string levels, an ISO 8601 time, the node and the message', () => {
    const c = capture();
    c.logger.info({ services: 3 }, 'Caches synced');
    c.logger.debug('d');
    c.logger.warn('w');
    c.logger.error('e');
    const { lines } = c;
    expect(lines.map((l) => l.level)).to.deep.equal(['info', 'debug', 'warn', 'error']);
    const [first] = lines;
    expect(first).to.include({ node: 'worker-1', name: 'ipvs-node-controller', services: 3, msg: 'Caches synced' });
    expect(first!.time).to.be.a('string');
    expect(first!.time).to.match(/^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$/);
    expect(new Date(first!.time as string).toISOString()).to.equal(first!.time);
  });

  it('puts an error in `err` with its type, message and code, not in msg', () => {
    const c = capture();
    const err = Object.assign(new Error('connect ECONNREFUSED 10.96.0.1:443'), { code: 'ECONNREFUSED' });
    c.logger.warn({ resource: 'services', retryInMs: 500, err }, 'Failed to list and watch, keeping the last rules');
    const [line] = c.lines;
    expect(line!.err).to.deep.equal({
      type: 'Error',
      message: 'connect ECONNREFUSED 10.96.0.1:443',
      code: 'ECONNREFUSED',
    });
    expect(line!.msg).to.equal('Failed to list and watch, keeping the last rules');
    expect(String(line!.msg)).not.to.include('ECONNREFUSED');
  });

  it('writes a Service as {namespace, name}, split at the first slash', () => {
    const c = capture();
    c.logger.info({ service: kobj('tenant/big'), reason: 'tooManyEntries' }, 'Service address skipped');
    expect(c.lines[0]).to.deep.include({ service: { namespace: 'tenant', name: 'big' }, reason: 'tooManyEntries' });
    expect(kobj('a/b/c')).to.deep.equal({ namespace: 'a', name: 'b/c' });
    expect(kobj('cluster-scoped')).to.deep.equal({ namespace: '', name: 'cluster-scoped' });
  });

  it('ends a run with a fatal JSON line: err, exit code, and the stack of an unexpected error', () => {
    const c = capture();
    const stderr = withStderr(() => {
      logFatal(c.logger, new Error('no cgroup v2 mount in /proc/mounts'));
      logFatal(c.logger, new TypeError('x is undefined'), true);
    });
    const { lines } = c;
    expect(lines[0]).to.include({ level: 'fatal', msg: 'Exiting', exitCode: 1 });
    expect(lines[0]!.err).to.deep.equal({ type: 'Error', message: 'no cgroup v2 mount in /proc/mounts' });
    expect(lines[0]).not.to.have.property('stack');
    expect(lines[1]).to.include({ level: 'fatal', msg: 'Unexpected error, exiting' });
    expect(lines[1]!.stack).to.match(/^TypeError: x is undefined\n\s+at /);
    expect(stderr[0]).to.equal('ipvs-node-controller: no cgroup v2 mount in /proc/mounts\n');
    expect(stderr[1]).to.match(/^ipvs-node-controller: unexpected error: TypeError: x is undefined\n/);
  });
});

describe('log format: text (klog)', () => {
  const HEADER = /^([IWEF])(\d\d)(\d\d) (\d\d):(\d\d):(\d\d)\.(\d{6}) ( {0,6}\d+) ipvs-node-controller\] /;

  it('writes the klog header: severity letter, MMDD hh:mm:ss.uuuuuu in UTC, the pid in 7 columns, the program', () => {
    const at = new Date('2024-11-25T01:02:03.456Z');
    expect(klogHeader('I', at, 12345)).to.equal('I1125 01:02:03.456000   12345 ipvs-node-controller] ');
    expect(klogHeader('E', new Date('2025-01-05T23:59:59.007Z'), 7)).to.equal(
      'E0105 23:59:59.007000       7 ipvs-node-controller] ',
    );
    expect(klogHeader('W', at, 12345678)).to.equal('W1125 01:02:03.456000 12345678 ipvs-node-controller] ');
  });

  it('one line per record: the quoted message, then key=value in the order of the JSON line', () => {
    const { raw, logger } = sink('text');
    const before = Date.now();
    logger.info(
      {
        service: kobj('tenant/big'),
        reason: 'tooManyEntries',
        detail: 'asks for 20000 entries (100 addresses x 200 ports)',
        count: 2,
        local: false,
        addresses: ['127.0.0.1:10249', '[::1]:10249'],
        settings: { mode: 'ipvs' },
        gone: null,
      },
      'Service address skipped',
    );
    expect(raw).to.have.length(1);
    const line = raw[0]!;
    const m = HEADER.exec(line);
    expect(m, line).to.not.equal(null);
    expect(m![1]).to.equal('I');
    expect(Number(m![8])).to.equal(process.pid);
    const stamp = Date.UTC(
      new Date(before).getUTCFullYear(),
      Number(m![2]) - 1,
      Number(m![3]),
      Number(m![4]),
      Number(m![5]),
      Number(m![6]),
      Number(m![7]!.slice(0, 3)),
    );
    expect(stamp).to.be.within(before - 1, Date.now() + 1);
    expect(line.slice(m![0].length)).to.equal(
      '"Service address skipped" node="worker-1" service="tenant/big" reason="tooManyEntries" ' +
        'detail="asks for 20000 entries (100 addresses x 200 ports)" count=2 local=false ' +
        'addresses=["127.0.0.1:10249","[::1]:10249"] settings={"mode":"ipvs"} gone=null',
    );
    expect(line).not.to.include('\n');
  });

  it('maps levels to klog severities; debug is an I line with v=4', () => {
    const { raw, logger } = sink('text');
    logger.debug({ ms: 3 }, 'Synced');
    logger.info('Caches synced');
    logger.warn('Service conflict, the older Service keeps the address');
    logger.error('Sync failed, keeping the rules in place');
    withStderr(() => logFatal(logger, new Error('gone')));
    expect(raw.map((l) => l[0])).to.deep.equal(['I', 'I', 'W', 'E', 'F']);
    expect(raw[0]).to.match(/\] "Synced" v=4 node="worker-1" ms=3$/);
    expect(raw[1]).to.match(/\] "Caches synced" node="worker-1"$/);
    expect(raw[4]).to.match(/\] "Exiting" node="worker-1" err="gone" exitCode=1$/);
  });

  it('writes an error as its quoted message, and a multi-line value on the same line', () => {
    const { raw, logger } = sink('text');
    const err = Object.assign(new Error('connect ECONNREFUSED 10.96.0.1:443'), { code: 'ECONNREFUSED' });
    logger.warn({ resource: 'services', retryInMs: 500, err }, 'Failed to list and watch, keeping the last rules');
    withStderr(() => logFatal(logger, new TypeError('x is "undefined"'), true));
    expect(raw[0]).to.match(
      /\] "Failed to list and watch, keeping the last rules" node="worker-1" resource="services" retryInMs=500 err="connect ECONNREFUSED 10\.96\.0\.1:443"$/,
    );
    expect(raw).to.have.length(2);
    expect(raw[1]).to.match(
      /^F.*\] "Unexpected error, exiting" node="worker-1" err="x is \\"undefined\\"" exitCode=1 stack="TypeError: x is \\"undefined\\"\\n +at /,
    );
  });

  it("quotes strings as Go's strconv.Quote does", () => {
    expect(quoteGo('plain ASCII, with spaces')).to.equal('"plain ASCII, with spaces"');
    expect(quoteGo('say "hi"\\now')).to.equal('"say \\"hi\\"\\\\now"');
    expect(quoteGo('a\nb\tc\rd\x07\b\f\v')).to.equal('"a\\nb\\tc\\rd\\a\\b\\f\\v"');
    expect(quoteGo('\x00\x1b\x7f')).to.equal('"\\x00\\x1b\\x7f"');
    expect(quoteGo('naïve 日本 €')).to.equal('"naïve 日本 €"');
    expect(quoteGo('\u00a0\u200b\u2028\ufeff')).to.equal('"\\u00a0\\u200b\\u2028\\ufeff"');
    expect(quoteGo('\u{e0001}')).to.equal('"\\U000e0001"');
    expect(quoteGo('😀')).to.equal('"😀"');
  });

  it('turns any pino JSON line into one text line, and leaves what is not JSON as it is', () => {
    const json =
      '{"level":"warn","time":1732496523456,"name":"ipvs-node-controller","node":"n","family":"ipv6","msg":"Left out of the iptables rules"}\n';
    expect(jsonToKlogText(json)).to.match(
      /^W1125 01:02:03\.456000 +\d+ ipvs-node-controller\] "Left out of the iptables rules" node="n" family="ipv6"\n$/,
    );
    expect(jsonToKlogText('not json\n')).to.equal('not json\n');
  });
});
