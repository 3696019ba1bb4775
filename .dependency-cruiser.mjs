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
      name: 'conntrack-not-reconciler',
      severity: 'error',
      comment:
        'The conntrack clean-up imports the reconciler: it is a subscriber, told each change (src/driver/kernel-change.ts) and mapping it to tuples; it never computes a difference of its own.',
      from: { path: '^src/conntrack/' },
      to: { path: '^src/(reconciler|backends)/' },
    },
    {
      name: 'model-pure',
      severity: 'error',
      comment:
        'The model imports another part of src/: it is pure (Services + Node + flags -> the desired state); of Node.js it imports only node:net (the no-restricted-imports rule of eslint.config.js).',
      from: { path: '^src/model/' },
      to: { pathNot: '^src/model/' },
    },
    {
      name: 'kube-not-decisions',
      severity: 'error',
      comment:
        'The informers import what decides or writes: they list and watch, and hand the model a change feed (a type of src/model/).',
      from: { path: '^src/kube/' },
      to: { path: '^src/(reconciler|backends|driver|controller|conntrack)/' },
    },
    {
      name: 'kube-only-model-types',
      severity: 'error',
      comment:
        "The informers import model code: what they share with the model is src/model/types.ts (ServiceInfo, NodeInfo, the annotations' names) and the change feed's type.",
      from: { path: '^src/kube/' },
      to: { path: '^src/model/', pathNot: '^src/model/types\\.ts$', dependencyTypesNot: ['type-only'] },
    },
    {
      name: 'observers-not-backends',
      severity: 'error',
      comment:
        'What an operator watches (operations, metrics, health, events, http) and the controller import a backend: they see the driver through src/driver/ and the reconciler, as values the composition root hands them.',
      from: { path: '^src/(operations|metrics|health|events|http|controller)/' },
      to: { path: '^src/backends/' },
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
