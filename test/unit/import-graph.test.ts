// The import check of npm run lint (scripts/import-graph.mjs): the parts of src/ are its folders
// and the files directly in it, and no import may close a loop between them; and the rules of the
// driver seam (.dependency-cruiser.mjs), each shown rejecting the import it forbids in a small tree.

import { expect } from 'chai';
import { execa } from 'execa';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
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
    expect(arrows('controller/'), r.stdout).to.include('kubeproxy/');
    expect(arrows('kubeproxy/')).to.not.include('controller/');
    expect(arrows('config/')).to.not.include('kubeproxy/');
    expect(arrows('model/')).to.deep.equal(['(nothing)']);
    // The driver seam: the contract below both sides, which do not know each other.
    expect(arrows('driver/')).to.deep.equal(['model/']);
    expect(arrows('backends/')).to.include('driver/').and.not.include('reconciler/');
    expect(arrows('reconciler/')).to.include('driver/').and.not.include('backends/');
    expect(r.stdout).to.match(/loops between parts: 0$/);
  });
});

/** A small tree shaped as src/ is: the contract, a driver, the reconciler, the controller and the CLI. */
const SEAM_TREE: Record<string, string> = {
  'tsconfig.json': JSON.stringify({
    compilerOptions: { module: 'NodeNext', moduleResolution: 'NodeNext', target: 'ES2022', strict: true },
    include: ['src/**/*.ts'],
  }),
  'src/driver/driver.ts': 'export interface Driver { readonly name: string }\n',
  'src/backends/nft/nft-driver.ts':
    "import type { Driver } from '../../driver/driver.js';\nexport class NftDriver implements Driver { readonly name = 'nft'; }\n",
  'src/backends/registry.ts':
    "import { NftDriver } from './nft/nft-driver.js';\nexport const selectBackend = () => new NftDriver();\n",
  'src/reconciler/reconciler.ts':
    "import type { Driver } from '../driver/driver.js';\nexport class Reconciler { constructor(readonly driver: Driver) {} }\n",
  'src/controller.ts':
    "import type { Reconciler } from './reconciler/reconciler.js';\nexport class Controller { constructor(readonly reconciler: Reconciler) {} }\n",
  'src/cli/main.ts': [
    "import { selectBackend } from '../backends/registry.js';",
    "import { Controller } from '../controller.js';",
    "import { Reconciler } from '../reconciler/reconciler.js';",
    'new Controller(new Reconciler(selectBackend()));',
    '',
  ].join('\n'),
};

describe('import rules of the driver seam (.dependency-cruiser.mjs)', function () {
  this.timeout(60_000);
  let dir: string;

  beforeEach(() => {
    dir = mkdtempSync(join(tmpdir(), 'seam-'));
    for (const [path, text] of Object.entries(SEAM_TREE)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
  });
  afterEach(() => rmSync(dir, { recursive: true, force: true }));

  /** `npm run lint`'s check of the tree, with `changes` made to it. */
  const check = async (changes: Record<string, string> = {}) => {
    for (const [path, text] of Object.entries(changes)) {
      mkdirSync(dirname(join(dir, path)), { recursive: true });
      writeFileSync(join(dir, path), text);
    }
    const r = await execa(process.execPath, [fileURLToPath(SCRIPT), '--check'], { cwd: dir, reject: false });
    return { exitCode: r.exitCode, stderr: r.stderr };
  };

  it('passes the seam the right way round: the CLI builds the driver and the reconciler, the controller takes a type', async () => {
    const r = await check();
    expect(r, r.stderr).to.deep.equal({ exitCode: 0, stderr: '' });
  });

  const wrong: Array<[string, string, Record<string, string>]> = [
    [
      'a backend that imports the reconciler',
      'backends-not-reconciler',
      {
        'src/backends/nft/nft-driver.ts':
          "import type { Reconciler } from '../../reconciler/reconciler.js';\nexport type Over = Reconciler;\n",
      },
    ],
    [
      'the reconciler importing a backend',
      'reconciler-not-backends',
      {
        'src/reconciler/reconciler.ts':
          "import type { NftDriver } from '../backends/nft/nft-driver.js';\nexport class Reconciler { constructor(readonly driver: NftDriver) {} }\n",
      },
    ],
    [
      'the contract importing the reconciler',
      'driver-contract-neutral',
      {
        'src/driver/driver.ts':
          "import type { Reconciler } from '../reconciler/reconciler.js';\nexport interface Driver { readonly name: string; owner?: Reconciler }\n",
      },
    ],
    [
      'a controller that builds its reconciler',
      'reconciler-built-in-cli',
      {
        'src/controller.ts':
          "import { Reconciler } from './reconciler/reconciler.js';\nexport const make = (d: Reconciler['driver']) => new Reconciler(d);\n",
      },
    ],
    [
      'a controller that chooses its driver',
      'drivers-built-in-cli',
      {
        'src/controller.ts':
          "import { selectBackend } from './backends/registry.js';\nexport const driver = () => selectBackend();\n",
      },
    ],
    [
      'the conntrack clean-up computing its own difference with the reconciler',
      'conntrack-not-reconciler',
      {
        'src/conntrack/stale-tuples.ts':
          "import { Reconciler } from '../reconciler/reconciler.js';\nexport const diff = (r: Reconciler) => r.driver;\n",
      },
    ],
    [
      'the model importing the contract',
      'model-pure',
      {
        'src/model/desired-state.ts': "import type { Driver } from '../driver/driver.js';\nexport type D = Driver;\n",
      },
    ],
    [
      'an informer importing the reconciler',
      'kube-not-decisions',
      {
        'src/kube/informer.ts':
          "import type { Reconciler } from '../reconciler/reconciler.js';\nexport type R = Reconciler;\n",
      },
    ],
    [
      'an informer running model code',
      'kube-only-model-types',
      {
        'src/model/desired-state.ts': 'export const derive = (n: number) => n + 1;\n',
        'src/kube/informer.ts': "import { derive } from '../model/desired-state.js';\nexport const next = derive(1);\n",
      },
    ],
    [
      'a metric naming a backend',
      'observers-not-backends',
      {
        'src/metrics/controller-metrics.ts':
          "import type { NftDriver } from '../backends/nft/nft-driver.js';\nexport type Shown = NftDriver['name'];\n",
      },
    ],
  ];
  for (const [what, rule, changes] of wrong) {
    it(`rejects ${what} (${rule})`, async () => {
      const r = await check(changes);
      expect(r.exitCode, r.stderr).to.equal(1);
      expect(r.stderr).to.match(new RegExp(`\\b${rule}\\b`));
    });
  }
});
