// Errors of the API stand-in: every failure leaves as a metav1.Status, worded as the real
// kube-apiserver words it, so that clients take the path they take on a real cluster.

// Objects are plain JSON as on the wire; the stand-in never interprets more than it must.
export type KubeObject = Record<string, any>;

export const REASONS: Record<number, string> = {
  400: 'BadRequest',
  401: 'Unauthorized',
  404: 'NotFound',
  405: 'MethodNotAllowed',
  406: 'NotAcceptable',
  409: 'Conflict',
  410: 'Expired',
  413: 'RequestEntityTooLarge',
  415: 'UnsupportedMediaType',
  422: 'Invalid',
  500: 'InternalError',
  504: 'Timeout',
};

export class ApiError extends Error {
  constructor(
    readonly code: number,
    message: string,
    readonly reason: string = REASONS[code] ?? 'Unknown',
    readonly details?: KubeObject,
  ) {
    super(message);
  }

  toStatus(): KubeObject {
    return failureStatus(this.code, this.reason, this.message, this.details);
  }
}

export function failureStatus(code: number, reason: string, message: string, details?: KubeObject): KubeObject {
  const status: KubeObject = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason };
  if (details) status.details = details;
  status.code = code;
  return status;
}

/** `plural`: the resource's plural name (services). */
export function notFound(plural: string, name: string): ApiError {
  return new ApiError(404, `${plural} "${name}" not found`, 'NotFound', { name, kind: plural });
}

/** A read asked for a resourceVersion the server has not seen yet (storage.NewTooLargeResourceVersionError). */
export function tooLargeResourceVersion(rv: string, current: number): ApiError {
  return new ApiError(504, `Too large resource version: ${rv}, current: ${current}`, 'Timeout', {
    causes: [{ reason: 'ResourceVersionTooLarge', message: 'Too large resource version' }],
    retryAfterSeconds: 1,
  });
}

/** ListOptions that fail validation, worded as the real server words them. */
export function invalidListOptions(errors: string[]): ApiError {
  const what = errors.length === 1 ? errors[0]! : `[${errors.join(', ')}]`;
  return new ApiError(422, `ListOptions.meta.k8s.io "" is invalid: ${what}`, 'Invalid', {
    group: 'meta.k8s.io',
    kind: 'ListOptions',
  });
}

export function methodNotAllowed(): ApiError {
  return new ApiError(405, 'the server does not allow this method on the requested resource', 'MethodNotAllowed');
}

export function conflict(plural: string, name: string, why: string): ApiError {
  return new ApiError(409, `Operation cannot be fulfilled on ${plural} "${name}": ${why}`, 'Conflict', {
    name,
    kind: plural,
  });
}

/** The message of a 409 for a write based on an object that changed since it was read. */
export const MODIFIED_SINCE_READ =
  'the object has been modified; please apply your changes to the latest version and try again';
