// Import arrows run one way: no module imports itself through others, and no folder of src/
// reaches back into a folder that reaches it. npm run lint runs this over src/.
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
  ],
  options: {
    includeOnly: '^src/',
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.json' },
    enhancedResolveOptions: { extensions: ['.ts', '.js'] },
  },
};
