import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

import { COUNTER_MAP_NAME, COUNTER_SLOTS, translatedRows } from '../../src/backends/ebpf/counters.js';

describe('ebpf translation counters', () => {
  it('names each summed slot by family and source, in the map order', () => {
    expect(translatedRows([1n, 2n, 3n, 4n])).to.deep.equal([
      { family: 'ipv4', source: 'pods', connections: 1 },
      { family: 'ipv4', source: 'node', connections: 2 },
      { family: 'ipv6', source: 'pods', connections: 3 },
      { family: 'ipv6', source: 'node', connections: 4 },
    ]);
  });

  it('keeps counts exact up to 2^53', () => {
    const big = BigInt(Number.MAX_SAFE_INTEGER);
    expect(translatedRows([big, 0n, 0n, 0n])[0]!.connections).to.equal(Number.MAX_SAFE_INTEGER);
  });

  it('refuses a map with another number of slots', () => {
    expect(() => translatedRows([1n, 2n])).to.throw(/the counter map holds 2 slots, not 4: .*--cleanup/);
  });

  it('the slots and the map match the BPF source', () => {
    const source = readFileSync(
      fileURLToPath(new URL('../../../bpf/ipvs_node_controller.bpf.c', import.meta.url)),
      'utf8',
    );
    expect(source).to.match(new RegExp(`#define COUNTER_SLOTS ${COUNTER_SLOTS.length}\\b`));
    // slot = family base + COUNTER_NODE for the node
    const define = (name: string) => Number(new RegExp(`#define ${name} (\\d+)`).exec(source)?.[1]);
    const slot = (family: string, source: string) =>
      COUNTER_SLOTS.findIndex((s) => s.family === family && s.source === source);
    for (const family of ['ipv4', 'ipv6']) {
      const base = define(family === 'ipv4' ? 'COUNTER_IPV4' : 'COUNTER_IPV6');
      expect(slot(family, 'pods'), `${family} pods`).to.equal(base);
      expect(slot(family, 'node'), `${family} node`).to.equal(base + define('COUNTER_NODE'));
    }
    expect(source).to.match(new RegExp(`\\} ${COUNTER_MAP_NAME} SEC\\("\\.maps"\\);`));
    expect(source).to.match(/BPF_MAP_TYPE_PERCPU_ARRAY/);
  });
});
