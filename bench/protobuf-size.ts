// The size of a Service and of its watch event in Kubernetes' protobuf encoding
// (application/vnd.kubernetes.protobuf, what kube-proxy's client asks for), to set against
// JSON. A minimal encoder for the fields the benchmark's Services hold, with the field numbers
// of k8s.io/api core/v1 and k8s.io/apimachinery meta/v1 generated.proto. Every field number is
// below 16, so each tag is one byte whatever the number: the sizes do not hang on them.
//
// Wire format (api-concepts, "Protobuf encoding"): the object is the magic "k8s\0" followed by
// a runtime.Unknown {typeMeta {apiVersion, kind}, raw: the Service message}; a watch stream is
// frames of a 4-byte big-endian length and a metav1.WatchEvent {type, object: RawExtension{raw}}.

type Json = Record<string, any>;

class Writer {
  private readonly parts: Buffer[] = [];
  private size = 0;

  bytes(): Buffer {
    return Buffer.concat(this.parts, this.size);
  }

  private push(b: Buffer): void {
    this.parts.push(b);
    this.size += b.length;
  }

  private varint(n: number | bigint): void {
    let v = BigInt.asUintN(64, BigInt(n));
    const out: number[] = [];
    do {
      let byte = Number(v & 0x7fn);
      v >>= 7n;
      if (v !== 0n) byte |= 0x80;
      out.push(byte);
    } while (v !== 0n);
    this.push(Buffer.from(out));
  }

  private tag(field: number, wire: number): void {
    this.varint((field << 3) | wire);
  }

  int(field: number, value: number | undefined): this {
    if (value === undefined) return this;
    this.tag(field, 0);
    this.varint(value);
    return this;
  }

  bool(field: number, value: boolean | undefined): this {
    return value === undefined ? this : this.int(field, value ? 1 : 0);
  }

  bytesField(field: number, value: Buffer | undefined): this {
    if (value === undefined) return this;
    this.tag(field, 2);
    this.varint(value.length);
    this.push(value);
    return this;
  }

  string(field: number, value: string | undefined): this {
    return value === undefined ? this : this.bytesField(field, Buffer.from(value, 'utf8'));
  }

  strings(field: number, values: string[] | undefined): this {
    for (const v of values ?? []) this.string(field, v);
    return this;
  }

  message(field: number, value: Writer | undefined): this {
    return value === undefined ? this : this.bytesField(field, value.bytes());
  }

  /** map<string, string>: entries sorted by key, as Go's generated marshaller writes them. */
  map(field: number, value: Record<string, string> | undefined): this {
    for (const key of Object.keys(value ?? {}).sort()) {
      this.message(field, new Writer().string(1, key).string(2, value![key]));
    }
    return this;
  }
}

/** meta/v1 Time: {seconds = 1, nanos = 2}. */
function time(rfc3339: string | undefined): Writer | undefined {
  if (rfc3339 === undefined) return undefined;
  return new Writer().int(1, Math.floor(Date.parse(rfc3339) / 1000)).int(2, 0);
}

/** meta/v1 ObjectMeta. */
function objectMeta(m: Json): Writer {
  const w = new Writer()
    .string(1, m.name)
    .string(2, m.generateName)
    .string(3, m.namespace)
    .string(5, m.uid)
    .string(6, m.resourceVersion)
    .int(7, m.generation)
    .message(8, time(m.creationTimestamp))
    .map(11, m.labels)
    .map(12, m.annotations);
  for (const f of m.managedFields ?? []) {
    // ManagedFieldsEntry: manager 1, operation 2, apiVersion 3, time 4, fieldsType 6,
    // fieldsV1 7 (FieldsV1 {Raw = 1}: the JSON of the field set), subresource 8.
    w.message(
      17,
      new Writer()
        .string(1, f.manager)
        .string(2, f.operation)
        .string(3, f.apiVersion)
        .message(4, time(f.time))
        .string(6, f.fieldsType)
        .message(7, f.fieldsV1 === undefined ? undefined : new Writer().string(1, JSON.stringify(f.fieldsV1)))
        .string(8, f.subresource),
    );
  }
  return w;
}

/** intstr.IntOrString: {type = 1, intVal = 2, strVal = 3}. */
function intOrString(v: number | string | undefined): Writer | undefined {
  if (v === undefined) return undefined;
  return typeof v === 'number' ? new Writer().int(1, 0).int(2, v) : new Writer().int(1, 1).string(3, v);
}

/** core/v1 Service {metadata 1, spec 2, status 3}. */
export function encodeService(svc: Json): Buffer {
  const s = svc.spec ?? {};
  const spec = new Writer();
  for (const p of s.ports ?? []) {
    // ServicePort: name 1, protocol 2, port 3, targetPort 4, nodePort 5, appProtocol 6.
    spec.message(
      1,
      new Writer()
        .string(1, p.name)
        .string(2, p.protocol)
        .int(3, p.port)
        .message(4, intOrString(p.targetPort))
        .int(5, p.nodePort)
        .string(6, p.appProtocol),
    );
  }
  spec
    .map(2, s.selector)
    .string(3, s.clusterIP)
    .string(4, s.type)
    .strings(5, s.externalIPs)
    .string(7, s.sessionAffinity)
    .string(8, s.loadBalancerIP)
    .string(10, s.externalName)
    .string(11, s.externalTrafficPolicy)
    .int(12, s.healthCheckNodePort)
    .string(17, s.ipFamilyPolicy)
    .strings(18, s.clusterIPs)
    .strings(19, s.ipFamilies)
    .bool(20, s.allocateLoadBalancerNodePorts)
    .string(21, s.loadBalancerClass)
    .string(22, s.internalTrafficPolicy);
  // ServiceStatus {loadBalancer 1}; LoadBalancerStatus {ingress 1}; LoadBalancerIngress {ip 1, hostname 2, ipMode 3}.
  const lb = new Writer();
  for (const i of svc.status?.loadBalancer?.ingress ?? []) {
    lb.message(1, new Writer().string(1, i.ip).string(2, i.hostname).string(3, i.ipMode));
  }
  const status = new Writer().message(1, lb);
  return new Writer()
    .message(1, objectMeta(svc.metadata ?? {}))
    .message(2, spec)
    .message(3, status)
    .bytes();
}

const MAGIC = Buffer.from([0x6b, 0x38, 0x73, 0x00]);

/** The object as the API server sends it: magic, then runtime.Unknown {typeMeta 1, raw 2}. */
export function protobufObject(svc: Json): Buffer {
  const unknown = new Writer()
    .message(1, new Writer().string(1, 'v1').string(2, 'Service'))
    .bytesField(2, encodeService(svc))
    .bytes();
  return Buffer.concat([MAGIC, unknown]);
}

/** One watch event on a protobuf watch stream: its frame length and metav1.WatchEvent {type 1, object 2 (RawExtension {raw 1})}. */
export function protobufWatchEventBytes(type: string, svc: Json): number {
  const event = new Writer()
    .string(1, type)
    .message(2, new Writer().bytesField(1, protobufObject(svc)))
    .bytes();
  return 4 + event.length;
}

/** The same event on a JSON watch stream: one line. */
export function jsonWatchEventBytes(type: string, svc: Json): number {
  return Buffer.byteLength(JSON.stringify({ type, object: svc })) + 1;
}
