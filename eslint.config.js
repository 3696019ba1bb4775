// Lint for defects, not style: prettier owns the layout (npm run lint runs both).
// Type-aware, so that a promise nobody awaits or catches is an error: an unhandled rejection
// ends the process, and a promise handed to a callback whose result is ignored hides a failure.

import js from '@eslint/js';
import globals from 'globals';
import tseslint from 'typescript-eslint';

export default tseslint.config(
  { ignores: ['dist/', 'build/', 'node_modules/', 'bench/results/'] },
  js.configs.recommended,
  {
    files: ['**/*.ts'],
    extends: [tseslint.configs.recommendedTypeChecked],
    languageOptions: {
      parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname },
    },
    rules: {
      '@typescript-eslint/no-floating-promises': 'error',
      '@typescript-eslint/no-misused-promises': 'error',
      // A promise returned from inside try without await escapes its catch and finally.
      '@typescript-eslint/return-await': ['error', 'in-try-catch'],
      // A new union member (a backend, a family, a skip reason) must reach every switch on it.
      '@typescript-eslint/switch-exhaustiveness-check': ['error', { considerDefaultExhaustiveForUnions: true }],
      // `_name` marks a value dropped on purpose (an omitted key of a rest pattern, a callback
      // parameter); tsc's noUnusedLocals/noUnusedParameters report the rest.
      '@typescript-eslint/no-unused-vars': [
        'error',
        { argsIgnorePattern: '^_', varsIgnorePattern: '^_', ignoreRestSiblings: true },
      ],
      // A `let` assigned after a closure that reads it (with ?.) is deliberate: const would throw there.
      'prefer-const': ['error', { ignoreReadBeforeAssign: true }],
      // Parsed JSON and YAML (Kubernetes objects, nft -j output) is `any`/`unknown` by nature and
      // checked where it is used; the no-unsafe-* family would flag every such read.
      '@typescript-eslint/no-unsafe-argument': 'off',
      '@typescript-eslint/no-unsafe-assignment': 'off',
      '@typescript-eslint/no-unsafe-call': 'off',
      '@typescript-eslint/no-unsafe-member-access': 'off',
      '@typescript-eslint/no-unsafe-return': 'off',
      // Style rather than defects: an assertion tsc finds redundant, an async function that
      // implements a Promise-returning interface without awaiting, String() of an unknown value
      // in an error message, `unknown | undefined` that documents an optional result.
      '@typescript-eslint/no-unnecessary-type-assertion': 'off',
      '@typescript-eslint/require-await': 'off',
      '@typescript-eslint/no-base-to-string': 'off',
      '@typescript-eslint/no-redundant-type-constituents': 'off',
    },
  },
  {
    // A file of the product is one responsibility a reader holds in mind at once: past 400 lines
    // it is two, and is split along them (docs/architecture.md names the parts).
    files: ['src/**/*.ts'],
    rules: { 'max-lines': ['error', { max: 400, skipBlankLines: false, skipComments: false }] },
  },
  {
    // The model is pure (docs/architecture.md): of Node.js it may use node:net's address parsing, nothing else.
    files: ['src/model/**/*.ts'],
    rules: {
      'no-restricted-imports': [
        'error',
        {
          patterns: [
            {
              regex: '^(node:(?!net$)|(fs|os|path|child_process|http|https|dgram|worker_threads|timers|process)(/|$))',
              message: 'src/model/ is pure: of Node.js it imports node:net alone.',
            },
          ],
        },
      ],
    },
  },
  {
    // Tests and the demo type Kubernetes JSON loosely on purpose; the product code does not.
    files: ['test/**/*.ts', 'testbed/**/*.ts', 'demo/**/*.ts', 'bench/**/*.ts'],
    rules: { '@typescript-eslint/no-explicit-any': 'off' },
  },
  {
    // Build scripts, the test launcher and this file: plain Node.js modules outside the TypeScript project.
    files: ['**/*.mjs', '**/*.js'],
    languageOptions: { globals: globals.node },
  },
);
