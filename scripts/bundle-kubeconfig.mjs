// esbuild plugin for scripts/bundle.mjs: KubeConfig is the one part of @kubernetes/client-node
// the controller runs (src/kube/ imports it from dist/config.js), but that module also imports
// what only two of its methods the controller never calls need: node-fetch (for Headers, in
// applyToFetchOptions) and the whole generated API (in makeApiClient). Both are loaded at start
// and cost about 8 MiB of resident memory and 4 MiB of V8 heap. In the bundle, those two imports of
// config.js resolve to stand-ins that throw a clear error if ever called; every other module,
// and config.js's other imports (auth providers, proxies, YAML), are bundled as they are.

const CONFIG_MODULE = /[\\/]node_modules[\\/]@kubernetes[\\/]client-node[\\/]dist[\\/]config\.js$/;
const NAMESPACE = 'kubeconfig-only';

const STANDINS = {
  'node-fetch': `
    const left = () => { throw new Error("KubeConfig.applyToFetchOptions is not in this bundle (node-fetch is left out)"); };
    export class Headers { constructor() { left(); } }
    export default left;
  `,
  './gen/index.js': `
    const left = () => { throw new Error("KubeConfig.makeApiClient is not in this bundle (the generated API is left out)"); };
    export class ServerConfiguration { constructor() { left(); } }
    export const createConfiguration = left;
  `,
};

export const kubeConfigOnly = {
  name: 'kubeconfig-only',
  setup(build) {
    build.onResolve({ filter: /^(node-fetch|\.\/gen\/index\.js)$/ }, (args) =>
      CONFIG_MODULE.test(args.importer) ? { path: args.path, namespace: NAMESPACE } : undefined,
    );
    build.onLoad({ filter: /.*/, namespace: NAMESPACE }, (args) => ({ contents: STANDINS[args.path], loader: 'js' }));
  },
};
