// The stand-in's HTTPS identity: a throw-away CA and a serving certificate for 127.0.0.1 /
// localhost (plus the host it listens on), made with openssl at start; and the kubeconfig that
// trusts that CA and carries a bearer token.

import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { isIP } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import YAML from 'yaml';

export interface ServingCertificate {
  caPem: string;
  certPem: string;
  keyPem: string;
}

const run = promisify(execFile);

export async function makeServingCertificate(host: string): Promise<ServingCertificate> {
  const dir = await mkdtemp(join(tmpdir(), 'api-stand-in-'));
  try {
    const names = new Set(['IP:127.0.0.1', 'IP:::1', 'DNS:localhost']);
    names.add(isIP(host) ? `IP:${host}` : `DNS:${host}`);
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    await run('openssl', [
      'req',
      '-x509',
      ...ec,
      '-keyout',
      join(dir, 'ca.key'),
      '-out',
      join(dir, 'ca.crt'),
      '-days',
      '3650',
      '-subj',
      '/CN=api-stand-in-ca',
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
    await run('openssl', [
      'req',
      ...ec,
      '-keyout',
      join(dir, 'server.key'),
      '-out',
      join(dir, 'server.csr'),
      '-subj',
      '/CN=localhost',
    ]);
    await writeFile(
      join(dir, 'server.ext'),
      [
        'basicConstraints=CA:FALSE',
        'keyUsage=critical,digitalSignature,keyEncipherment',
        'extendedKeyUsage=serverAuth',
        `subjectAltName=${[...names].join(',')}`,
        '',
      ].join('\n'),
    );
    await run('openssl', [
      'x509',
      '-req',
      '-in',
      join(dir, 'server.csr'),
      '-CA',
      join(dir, 'ca.crt'),
      '-CAkey',
      join(dir, 'ca.key'),
      '-CAcreateserial',
      '-out',
      join(dir, 'server.crt'),
      '-days',
      '3650',
      '-extfile',
      join(dir, 'server.ext'),
    ]);
    return {
      caPem: await readFile(join(dir, 'ca.crt'), 'utf8'),
      certPem: await readFile(join(dir, 'server.crt'), 'utf8'),
      keyPem: await readFile(join(dir, 'server.key'), 'utf8'),
    };
  } catch (err) {
    const stderr = (err as { stderr?: string }).stderr ?? '';
    throw new Error(`cannot create the API stand-in's certificate with openssl: ${stderr || String(err)}`);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

/** A kubeconfig (YAML) for the server at `url`, trusting `caPem`, authenticating with `token`. */
export function kubeconfigYaml(url: string, caPem: string, token: string): string {
  return YAML.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [
      {
        name: 'stand-in',
        cluster: { server: url, 'certificate-authority-data': Buffer.from(caPem).toString('base64') },
      },
    ],
    users: [{ name: 'stand-in', user: { token } }],
    contexts: [{ name: 'stand-in', context: { cluster: 'stand-in', user: 'stand-in', namespace: 'default' } }],
    'current-context': 'stand-in',
  });
}
