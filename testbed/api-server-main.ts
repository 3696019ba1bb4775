// Runs the Kubernetes API stand-in on its own, for the demo and for trying kubectl by hand:
//   node dist/testbed/api-server-main.js --port 6443 --kubeconfig-out PATH [--objects FILE.yaml|json]

import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import YAML from 'yaml';
import { ApiStandIn } from './api-server.js';

const USAGE =
  'usage: api-server-main [--host 127.0.0.1] [--port 6443] --kubeconfig-out PATH [--objects FILE.yaml|FILE.json] [--bookmark-interval-ms 1000]';

/** Objects of a file: a List, a single object, or several YAML documents of either. */
export function objectsOf(text: string): Record<string, unknown>[] {
  const objects: Record<string, unknown>[] = [];
  for (const doc of YAML.parseAllDocuments(text)) {
    if (doc.errors.length > 0) throw new Error(doc.errors[0]!.message);
    const value = doc.toJSON() as Record<string, unknown> | null;
    if (value === null || value === undefined) continue;
    if (Array.isArray(value.items) && String(value.kind ?? '').endsWith('List')) {
      objects.push(...(value.items as Record<string, unknown>[]));
    } else {
      objects.push(value);
    }
  }
  return objects;
}

async function main(): Promise<void> {
  let values;
  try {
    ({ values } = parseArgs({
      options: {
        host: { type: 'string', default: '127.0.0.1' },
        port: { type: 'string', default: '6443' },
        'kubeconfig-out': { type: 'string' },
        objects: { type: 'string' },
        'bookmark-interval-ms': { type: 'string', default: '1000' },
      },
    }));
  } catch (err) {
    throw new Error(`${(err as Error).message}\n${USAGE}`);
  }
  const port = Number(values.port);
  if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`--port must be a port number\n${USAGE}`);
  const kubeconfigOut = values['kubeconfig-out'];
  if (!kubeconfigOut) throw new Error(`--kubeconfig-out is required\n${USAGE}`);

  let initial: Record<string, unknown>[] = [];
  if (values.objects) {
    try {
      initial = objectsOf(await readFile(values.objects, 'utf8'));
    } catch (err) {
      throw new Error(`cannot read objects from ${values.objects}: ${(err as Error).message}`);
    }
  }

  const server = await ApiStandIn.start({
    host: values.host,
    port,
    bookmarkIntervalMs: Number(values['bookmark-interval-ms']),
  });
  for (const obj of initial) server.apply(obj);
  await server.writeKubeconfig(kubeconfigOut);
  console.log(
    `Kubernetes API stand-in listening on ${server.url} (kubeconfig: ${kubeconfigOut}, ${initial.length} objects loaded)`,
  );

  const shutdown = () => {
    server.stop().then(
      () => process.exit(0),
      () => process.exit(1),
    );
  };
  process.once('SIGINT', shutdown);
  process.once('SIGTERM', shutdown);
}

main().catch((err: unknown) => {
  console.error(`api-server-main: ${(err as Error).message}`);
  process.exit(1);
});
