// Import arrows run one way: no module imports itself through others, and no folder of src/
// reaches back into a folder that reaches it. npm run lint runs this over src/.
//
// The driver seam: the contract drivers implement is src/driver/, below both the backends and the
// reconciler, which know nothing of each other; only the composition root (src/cli/) builds a
// driver and puts the reconciler over it.
export default {
  forbidden: [
    {
      name: 'no-circular',
      severity: 'error',
      comment: 'A module that reaches itself through its imports: split what both sides need into a third module.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'no-circular-folders',
      severity: 'error',
      scope: 'folder',
      comment: 'A folder of src/ that imports from a folder that imports from it: move the shared part to one side.',
      from: {},
      to: { circular: true },
    },
    {
      name: 'backends-not-reconciler',
      severity: 'error',
      comment:
        'A backend imports the reconciler: what a driver and the reconciler share is the contract of src/driver/; the composition root (src/cli/) puts them together.',
      from: { path: '^src/backends/' },
      to: { path: '^src/reconciler/' },
    },
    {
      name: 'reconciler-not-backends',
      severity: 'error',
      comment:
        'The reconciler imports a backend: it knows a driver only through src/driver/, and is handed one by the composition root (src/cli/).',
      from: { path: '^src/reconciler/' },
      to: { path: '^src/backends/' },
    },
    {
      name: 'driver-contract-neutral',
      severity: 'error',
      comment: 'The driver contract imports a backend or the reconciler: it is what both import, and imports neither.',
      from: { path: '^src/driver/' },
      to: { path: '^src/(backends|reconciler)/' },
    },
    {
      name: 'reconciler-built-in-cli',
      severity: 'error',
      comment:
        'The Reconciler is built by the composition root alone (src/cli/compose.ts); elsewhere it is only a type (a controller is handed one).',
      from: { path: '^src/', pathNot: '^src/(cli|reconciler)/' },
      to: { path: '^src/reconciler/reconciler\\.ts$', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'drivers-built-in-cli',
      severity: 'error',
      comment:
        'Drivers are chosen and built by the composition root alone (src/cli/, through src/backends/registry.ts); elsewhere a backend is only a type.',
      from: { path: '^src/', pathNot: '^src/(cli|backends)/' },
      to: { path: '^src/backends/', dependencyTypesNot: ['type-only'] },
    },
  ],
  options: {
    includeOnly: '^src/',
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
