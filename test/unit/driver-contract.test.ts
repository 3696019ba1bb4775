// The driver contract (src/driver/driver.ts) has nothing optional: every driver answers every
// member, so that the reconciler, the controller and the composition root never branch on what a
// driver happens to have. Nor has the nft driver's executor contract (src/backends/nft/executor.ts):
// the driver has one way to write whichever executor it is given. Read from the source with the
// TypeScript compiler, as written.

import { expect } from 'chai';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const CONTRACT = fileURLToPath(new URL('../../../src/driver/driver.ts', import.meta.url));
const NFT_EXECUTOR = fileURLToPath(new URL('../../../src/backends/nft/executor.ts', import.meta.url));

/** The members of each interface a source text declares, with whether each is optional. */
function interfaceMembers(text: string): Map<string, Array<{ name: string; optional: boolean }>> {
  const source = ts.createSourceFile('driver.ts', text, ts.ScriptTarget.ES2022, true);
  const out = new Map<string, Array<{ name: string; optional: boolean }>>();
  source.forEachChild((node) => {
    if (!ts.isInterfaceDeclaration(node)) return;
    out.set(
      node.name.text,
      node.members.map((m) => ({
        name: m.name?.getText(source) ?? '(index)',
        optional: m.questionToken !== undefined,
      })),
    );
  });
  return out;
}

const optionalOf = (members: Array<{ name: string; optional: boolean }> | undefined) =>
  (members ?? []).filter((m) => m.optional).map((m) => m.name);

describe('the driver contract', () => {
  const members = interfaceMembers(readFileSync(CONTRACT, 'utf8'));

  it('has no optional member of Driver or of its capabilities', () => {
    expect(members.get('Driver')?.length, 'Driver is declared').to.be.greaterThan(10);
    expect(optionalOf(members.get('Driver'))).to.deep.equal([]);
    expect(optionalOf(members.get('DriverCapabilities'))).to.deep.equal([]);
  });

  it('has no optional member of NftExecutor', () => {
    const executor = interfaceMembers(readFileSync(NFT_EXECUTOR, 'utf8')).get('NftExecutor');
    expect(executor?.map((m) => m.name)).to.include.members(['run', 'applyElements', 'readSets', 'listTable']);
    expect(optionalOf(executor)).to.deep.equal([]);
  });

  it('finds an optional member where one is declared', () => {
    const found = interfaceMembers('interface Driver { a(): void; b?(): void; readonly c?: number }');
    expect(optionalOf(found.get('Driver'))).to.deep.equal(['b', 'c']);
  });
});
