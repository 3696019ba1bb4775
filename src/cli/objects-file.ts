// Reads Service and Node objects for --dry-run --from-file: JSON or YAML, one object, a List
// (as `kubectl get svc,nodes -A -o json` prints), or several YAML documents.

import { readFile } from 'node:fs/promises';
import { parseAllDocuments } from 'yaml';
import { toNodeInfo, toServiceInfo } from '../kube/objects.js';
import type { NodeInfo, ServiceInfo } from '../model/types.js';

export interface ObjectsFile {
  services: ServiceInfo[];
  nodes: NodeInfo[];
}

export async function readObjectsFile(path: string): Promise<ObjectsFile> {
  const text = path === '-' ? await readStdin() : await readFile(path, 'utf8');
  return parseObjects(text, path === '-' ? 'stdin' : path);
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export function parseObjects(text: string, source: string): ObjectsFile {
  const documents: unknown[] = [];
  const trimmed = text.trimStart();
  if (trimmed.startsWith('{') || trimmed.startsWith('[')) {
    try {
      documents.push(JSON.parse(text));
    } catch (err) {
      throw new Error(`${source}: not valid JSON: ${(err as Error).message}`);
    }
  } else {
    for (const doc of parseAllDocuments(text)) {
      if (doc.errors.length > 0) throw new Error(`${source}: not valid YAML: ${doc.errors[0]!.message.split('\n')[0]}`);
      documents.push(doc.toJS());
    }
  }
  // Other kinds (kubectl get all), and Services without a ClusterIP to translate to, are passed over.
  const out: ObjectsFile = { services: [], nodes: [] };
  const visit = (o: unknown) => {
    if (Array.isArray(o)) return o.forEach(visit);
    if (typeof o !== 'object' || o === null) return;
    const kind = (o as { kind?: unknown }).kind;
    const items = (o as { items?: unknown }).items;
    if (typeof kind === 'string' && kind.endsWith('List') && Array.isArray(items)) return items.forEach(visit);
    if (kind === 'Service') {
      // kubectl omits the namespace of objects in the current namespace only for single-namespace
      // output; a missing namespace means `default`, as kubectl apply would treat it.
      const withNs = withDefaultNamespace(o);
      const svc = toServiceInfo(withNs);
      if (svc) out.services.push(svc);
    } else if (kind === 'Node') {
      const node = toNodeInfo(o);
      if (node) out.nodes.push(node);
    }
  };
  documents.forEach(visit);
  return out;
}

function withDefaultNamespace(o: object): object {
  const meta = (o as { metadata?: Record<string, unknown> }).metadata;
  if (!meta || typeof meta.namespace === 'string') return o;
  return { ...o, metadata: { ...meta, namespace: 'default' } };
}
