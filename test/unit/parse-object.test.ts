// parseObject (src/kube/objects.ts): JSON.parse of an API object's text with its array-valued
// managedFields members left out before parsing. Checked against JSON.parse followed by deleting
// those members, on the objects the benchmark serves (as a real API server does), on text built
// to mislead the scan (the key inside strings, escaped quotes and backslashes, brackets in
// strings, a label of that name), and on random objects whose strings hold every troublesome
// character; malformed text is rejected as JSON.parse rejects it.

import { expect } from 'chai';
import { benchService } from '../../bench/services.js';
import { parseObject } from '../../src/kube/objects.js';

/** The reference: parsed whole, then every array-valued managedFields member that is not first in its object removed. */
function reference(text: string): unknown {
  const drop = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(drop);
    if (typeof v !== 'object' || v === null) return v;
    const out: Record<string, unknown> = {};
    Object.entries(v).forEach(([k, x], i) => {
      if (k === 'managedFields' && i > 0 && Array.isArray(x)) return;
      out[k] = drop(x);
    });
    return out;
  };
  return drop(JSON.parse(text));
}

/** A small deterministic generator (mulberry32). */
function random(seed: number): () => number {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const TRICKY = [
  '"',
  '\\',
  '[',
  ']',
  '{',
  '}',
  ',',
  ':',
  'managedFields',
  ',"managedFields":[',
  '\\"',
  'é',
  '\u2028',
  'a',
];

function randomValue(next: () => number, depth: number): unknown {
  const r = next();
  const str = () =>
    Array.from({ length: Math.floor(next() * 6) }, () => TRICKY[Math.floor(next() * TRICKY.length)]).join('');
  if (depth > 3 || r < 0.3) return str();
  if (r < 0.4) return Math.floor(next() * 1000);
  if (r < 0.45) return null;
  if (r < 0.6) return Array.from({ length: Math.floor(next() * 4) }, () => randomValue(next, depth + 1));
  const o: Record<string, unknown> = {};
  for (let i = Math.floor(next() * 5); i > 0; i--) {
    const k = next() < 0.25 ? 'managedFields' : str();
    o[k] = next() < 0.3 ? Array.from({ length: 2 }, () => randomValue(next, depth + 1)) : randomValue(next, depth + 1);
  }
  return o;
}

describe('parseObject: an API object without its managedFields', () => {
  it('parses the objects a real API server serves as JSON.parse does, less metadata.managedFields', () => {
    for (const object of [benchService(0), benchService(7), benchService(9999)]) {
      const text = JSON.stringify({ type: 'ADDED', object });
      expect(text).to.include('"managedFields":[');
      const parsed = parseObject(text) as { object: { metadata: Record<string, unknown> } };
      expect(parsed.object.metadata).to.not.have.property('managedFields');
      expect(parsed).to.deep.equal(reference(text));
      const whole = JSON.parse(text) as { object: { metadata: Record<string, unknown> } };
      delete whole.object.metadata.managedFields;
      expect(parsed).to.deep.equal(whole);
    }
  });

  it('is not misled by the key inside strings, escapes, brackets in strings or members of that name that are not arrays', () => {
    const texts = [
      '{"metadata":{"name":"a","annotations":{"x":",\\"managedFields\\":[1,2]"},"managedFields":[{"f:k":"]}\\\\"}]},"spec":{"a":1}}',
      '{"metadata":{"name":"a","labels":{"managedFields":"kept"},"managedFields":[{"k:{\\"port\\":443}":{}}]}}',
      '{"managedFields":[1],"b":2}',
      '{"a":"\\\\","managedFields":[["]","[",{"}":"{"}]],"c":"\\\\\\""}',
      '{"a":[],"managedFields":{"an":"object"}}',
      '{"a":1,"managedFields":[],"b":{"c":2,"managedFields":[3]}}',
      '{"a":1,"managedFields":[{"k":"a\\"]}"}],"b":2}',
    ];
    for (const text of texts) expect(parseObject(text), text).to.deep.equal(reference(text));
    expect(parseObject(texts[1]!)).to.deep.include({ metadata: { name: 'a', labels: { managedFields: 'kept' } } });
  });

  it('matches the reference on 2,000 random objects', () => {
    const next = random(37);
    for (let i = 0; i < 2000; i++) {
      const text = JSON.stringify(randomValue(next, 0));
      expect(parseObject(text), text).to.deep.equal(reference(text));
    }
  });

  it('rejects malformed text as JSON.parse does, and text whose managedFields never closes', () => {
    for (const text of ['{"a":1,"managedFields":[1,2', '{"a":1,"managedFields":["]', '{"a":', 'not json']) {
      expect(() => JSON.parse(text)).to.throw(SyntaxError);
      expect(() => parseObject(text), text).to.throw(SyntaxError);
    }
  });
});
