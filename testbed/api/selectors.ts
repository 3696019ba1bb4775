// Selectors: labelSelector (equality and set-based) and the field selectors the server supports
// for each resource, parsed from a request's query and matched against stored objects.

import { ApiError, type KubeObject } from './errors.js';
import { isPlainObject, type Resource } from './resources.js';

type LabelRequirement =
  | { key: string; op: 'eq' | 'ne'; value: string }
  | { key: string; op: 'in' | 'notin'; values: string[] }
  | { key: string; op: 'exists' | 'notexists' };

interface FieldRequirement {
  field: string;
  equal: boolean;
  value: string;
}

export interface Selection {
  labels: LabelRequirement[];
  fields: FieldRequirement[];
}

const LABEL_KEY = '[A-Za-z0-9][-A-Za-z0-9_./]*';

function splitTopLevel(s: string): string[] {
  const parts: string[] = [];
  let depth = 0;
  let current = '';
  for (const ch of s) {
    if (ch === '(') depth++;
    if (ch === ')') depth--;
    if (ch === ',' && depth === 0) {
      parts.push(current);
      current = '';
    } else {
      current += ch;
    }
  }
  parts.push(current);
  return parts.map((p) => p.trim()).filter((p) => p !== '');
}

function parseLabelSelector(selector: string): LabelRequirement[] {
  return splitTopLevel(selector).map((term): LabelRequirement => {
    let m = new RegExp(`^!\\s*(${LABEL_KEY})$`).exec(term);
    if (m) return { key: m[1]!, op: 'notexists' };
    m = new RegExp(`^(${LABEL_KEY})\\s+(in|notin)\\s*\\(([^)]*)\\)$`).exec(term);
    if (m) return { key: m[1]!, op: m[2] as 'in' | 'notin', values: m[3]!.split(',').map((v) => v.trim()) };
    m = new RegExp(`^(${LABEL_KEY})\\s*(==|=|!=)\\s*([-A-Za-z0-9_.]*)$`).exec(term);
    if (m) return { key: m[1]!, op: m[2] === '!=' ? 'ne' : 'eq', value: m[3]! };
    m = new RegExp(`^(${LABEL_KEY})$`).exec(term);
    if (m) return { key: m[1]!, op: 'exists' };
    throw new ApiError(400, `unable to parse requirement: found '${term}', expected a label selector term`);
  });
}

function parseFieldSelector(resource: Resource, selector: string): FieldRequirement[] {
  return splitTopLevel(selector).map((term) => {
    const m = /^([A-Za-z.]+)\s*(==|=|!=)\s*(.*)$/.exec(term);
    if (!m) throw new ApiError(400, `invalid selector: '${selector}'; can't understand '${term}'`);
    const field = m[1]!;
    if (!resource.selectableFields.includes(field)) throw new ApiError(400, `field label not supported: ${field}`);
    return { field, equal: m[2] !== '!=', value: m[3]! };
  });
}

/** The selectors of a list or watch request; `name`: the one object a request's path names. */
export function parseSelection(resource: Resource, query: URLSearchParams, name?: string): Selection {
  const selection = {
    labels: parseLabelSelector(query.get('labelSelector') ?? ''),
    fields: parseFieldSelector(resource, query.get('fieldSelector') ?? ''),
  };
  if (name !== undefined) selection.fields.push({ field: 'metadata.name', equal: true, value: name });
  return selection;
}

/** A field's value as field selectors compare it: a string, '' when absent. */
function fieldValue(obj: KubeObject, field: string): string {
  if (field === 'source') return obj.source?.component ?? '';
  const value: unknown = field.split('.').reduce<unknown>((o, k) => (isPlainObject(o) ? o[k] : undefined), obj);
  if (value === undefined || value === null) return field === 'spec.unschedulable' ? 'false' : '';
  return String(value);
}

function selects(selection: Selection, obj: KubeObject): boolean {
  const labels: Record<string, string> = obj.metadata?.labels ?? {};
  for (const r of selection.labels) {
    const has = Object.hasOwn(labels, r.key);
    const value = labels[r.key];
    const ok =
      r.op === 'eq'
        ? has && value === r.value
        : r.op === 'ne'
          ? !has || value !== r.value
          : r.op === 'in'
            ? has && r.values.includes(value!)
            : r.op === 'notin'
              ? !has || !r.values.includes(value!)
              : r.op === 'exists'
                ? has
                : !has;
    if (!ok) return false;
  }
  for (const r of selection.fields) {
    if ((fieldValue(obj, r.field) === r.value) !== r.equal) return false;
  }
  return true;
}

/** Whether a list or watch of `namespace` (undefined: every one) with `selection` sees `obj`. */
export function inScope(namespace: string | undefined, selection: Selection, obj: KubeObject): boolean {
  return (namespace === undefined || obj.metadata?.namespace === namespace) && selects(selection, obj);
}
