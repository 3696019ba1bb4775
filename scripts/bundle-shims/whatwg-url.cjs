// node-fetch 2 (imported by @kubernetes/client-node's KubeConfig for Headers) takes `URL` from
// node:url and falls back to whatwg-url only where node:url has none, which no supported Node
// is. The bundle gets this instead of whatwg-url, whose tr46 tables cost megabytes of heap at load.
'use strict';
module.exports = { URL: globalThis.URL, URLSearchParams: globalThis.URLSearchParams };
