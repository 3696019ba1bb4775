// The import check of npm run lint (scripts/import-graph.mjs): the parts of src/ are its folders
// and the files directly in it, and no import may close a loop between them.

import { expect } from 'chai';
import { execa } from 'execa';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const SCRIPT = new URL('../../../scripts/import-graph.mjs', import.meta.url);

interface ImportGraph {
  partOf: (path: string) => string;
  partGraph: (edges: Array<[string, string]>) => Map<string, Set<string>>;
  loopsOf: (graph: Map<string, Set<string>>) => string[][];
}

// A plain .mjs script outside the TypeScript project: loaded by URL, typed here.
const load = async () => (await import(SCRIPT.href)) as ImportGraph;

describe('import graph of src/', function () {
  this.timeout(30_000);

  it('takes a folder of src/ as one part and each file directly in src/ as a part of its own', async () => {
    const { partOf } = await load();
    expect(partOf('src/backends/nft/render.ts')).to.equal('backends/');
    expect(partOf('src/kube/watch.ts')).to.equal('kube/');
    expect(partOf('src/controller.ts')).to.equal('controller.ts');
  });

  it('finds the loops the controller, kube-proxy and config once made, and none through a shared leaf', async () => {
    const { partGraph, loopsOf } = await load();
    const before: Array<[string, string]> = [
      ['src/controller.ts', 'src/kubeproxy/mode.ts'],
      ['src/kubeproxy/node-events.ts', 'src/controller.ts'],
      ['src/config/options.ts', 'src/kubeproxy/config.ts'],
      ['src/kubeproxy/mode.ts', 'src/config/options.ts'],
      ['src/cli/main.ts', 'src/controller.ts'],
      ['src/kubeproxy/mode.ts', 'src/log.ts'],
      ['src/controller.ts', 'src/log.ts'],
    ];
    expect(loopsOf(partGraph(before))).to.deep.equal([['config/', 'controller.ts', 'kubeproxy/']]);
    // The same arrows with the Node Events in events/ and the setting names in config/.
    const after: Array<[string, string]> = [
      ['src/controller.ts', 'src/kubeproxy/mode.ts'],
      ['src/events/node-events.ts', 'src/controller.ts'],
      ['src/kubeproxy/config.ts', 'src/config/setting-sources.ts'],
      ['src/kubeproxy/mode.ts', 'src/config/options.ts'],
      ['src/cli/main.ts', 'src/controller.ts'],
      ['src/kubeproxy/mode.ts', 'src/log.ts'],
      ['src/controller.ts', 'src/log.ts'],
    ];
    expect(loopsOf(partGraph(after))).to.deep.equal([]);
    // A file importing a file of its own folder is no arrow between parts.
    expect(loopsOf(partGraph([['src/kube/watch.ts', 'src/kube/informer.ts']]))).to.deep.equal([]);
  });

  it('prints the graph of this tree, whose parts form no loop', async () => {
    const r = await execa(process.execPath, [fileURLToPath(SCRIPT)], { cwd: ROOT, reject: false });
    const lines = r.stdout.split('\n');
    const arrows = (part: string) =>
      lines
        .find((l) => l.startsWith(`${part} -> `))
        ?.split(' ')
        .slice(2) ?? [];
    expect(arrows('controller.ts'), r.stdout).to.include('kubeproxy/');
    expect(arrows('kubeproxy/')).to.not.include('controller.ts');
    expect(arrows('config/')).to.not.include('kubeproxy/');
    expect(arrows('model/')).to.deep.equal(['(nothing)']);
    expect(r.stdout).to.match(/loops between parts: 0$/);
  });
});
