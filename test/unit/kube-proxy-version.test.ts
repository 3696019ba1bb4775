// kube-proxy's version and its known bugs: the version as Kubernetes stamps it (and what is no
// version), its order, the rule of kubernetes#131765 at the boundary releases, the build info line
// of /metrics, and the /metrics client against real HTTP servers on loopback (kube-proxy's
// answer, older label names, garbage, endless and stalled answers).

import { expect } from 'chai';
import { closedLoopbackPort, LocalHttpServer } from '../support/local-http-server.js';
import http from 'node:http';
import { KNOWN_ISSUE_IDS, knownIssues } from '../../src/kubeproxy/known-issues.js';
import {
  MAX_METRICS_BYTES,
  buildInfoVersionLabel,
  compareVersions,
  fetchKubeProxyVersion,
  parseKubeProxyVersion,
} from '../../src/kubeproxy/version.js';
import { kubeProxyMetricsText } from '../support/kube-proxy-stand-in.js';

const version = (text: string) => {
  const v = parseKubeProxyVersion(text);
  if (!v) expect.fail(`${text} does not parse`);
  return v;
};

describe('kube-proxy version: parsing', () => {
  it('reads releases, pre-releases, builds between tags and vendor builds', () => {
    expect(parseKubeProxyVersion('v1.33.2')).to.deep.equal({
      text: 'v1.33.2',
      major: 1,
      minor: 33,
      patch: 2,
      prerelease: [],
    });
    expect(version('v1.34.0-beta.0').prerelease).to.deep.equal(['beta', 0]);
    expect(version('v1.34.0-alpha.3.45+0123456789abcd').prerelease).to.deep.equal(['alpha', 3, 45]);
    expect(version('v1.33.6-rc.0').prerelease).to.deep.equal(['rc', 0]);
    // A vendor's build of a release is that release.
    expect(version('v1.33.5-eks-5d4a308').prerelease).to.deep.equal([]);
    expect(version('v1.32.3-gke.1080000').prerelease).to.deep.equal([]);
    expect(version('v1.32.3+k3s1')).to.include({ major: 1, minor: 32, patch: 3 });
  });

  it('takes nothing that is no vMAJOR.MINOR.PATCH[-suffix][+build], nor anything longer than 128', () => {
    for (const text of [
      '',
      '1.33.2',
      'v1.33',
      'v1.33.2 ',
      ' v1.33.2',
      'v1.33.2\n',
      'v1.33.x',
      'v1.33.2-',
      'v1.33.2-<script>',
      'v1.33.2-rc.0"',
      'v1.33.2+',
      'v12345.1.1',
      'v1.١.2', // Arabic-Indic digit
      `v1.33.2-${'a'.repeat(121)}`, // 129 characters
      `v1.33.2-${'a'.repeat(60)}+${'b'.repeat(60)}`, // each part fits, the whole does not
      'v0.0.0-master+$Format:%H$', // a build from a source archive without its version
    ])
      expect(parseKubeProxyVersion(text), JSON.stringify(text)).to.equal(undefined);
  });

  it('orders as semantic versions: a pre-release before its release, build metadata ignored', () => {
    const order = [
      'v1.9.9',
      'v1.33.5',
      'v1.33.6-alpha.0',
      'v1.33.6-rc.0',
      'v1.33.6-rc.0.12',
      'v1.33.6-rc.1',
      'v1.33.6',
      'v1.34.0-alpha.3',
      'v1.34.0-alpha.3.45',
      'v1.34.0-beta.0',
      'v1.34.0-rc.1',
      'v1.34.0',
      'v1.100.0',
      'v2.0.0',
    ];
    for (let i = 0; i < order.length; i++) {
      for (let j = 0; j < order.length; j++) {
        const c = Math.sign(compareVersions(version(order[i]!), version(order[j]!)));
        expect(c, `${order[i]} vs ${order[j]}`).to.equal(Math.sign(i - j));
      }
    }
    expect(compareVersions(version('v1.33.6+k3s1'), version('v1.33.6'))).to.equal(0);
    expect(compareVersions(version('v1.33.6-eks-abc'), version('v1.33.6'))).to.equal(0);
  });
});

describe('kube-proxy known bugs: kubernetes#131765 (nftables mode, eTP=Local external addresses)', () => {
  const affected = (mode: string, v: string | undefined) =>
    knownIssues(mode, v)
      .map((i) => i.id)
      .includes('kubernetes#131765');

  it('is known by id', () => {
    expect(KNOWN_ISSUE_IDS).to.deep.equal(['kubernetes#131765']);
  });

  it('applies before v1.33.6 on the 1.33 line, to every older release and to 1.34 before its fix', () => {
    for (const v of [
      'v1.29.0',
      'v1.31.14',
      'v1.32.0',
      'v1.32.11',
      'v1.32.99', // no backport to 1.32 is known: every 1.32 release counts as affected
      'v1.33.0',
      'v1.33.2',
      'v1.33.5',
      'v1.33.5-eks-5d4a308',
      'v1.33.5+k3s1',
      'v1.33.6-rc.0', // built from release-1.33 after 1.33.5: the cherry-pick may not be in
      'v1.33.6-rc.0.3+0123456789abcd',
      'v1.34.0-alpha.3',
      'v1.34.0-alpha.3.120+0123456789abcd',
    ])
      expect(affected('nftables', v), v).to.equal(true);
  });

  it('does not apply from v1.33.6 on the 1.33 line, nor from v1.34.0-beta.0 on (every 1.34 release)', () => {
    for (const v of [
      'v1.33.6',
      'v1.33.6-eks-1a2b3c4',
      'v1.33.6+k3s1',
      'v1.33.7',
      'v1.33.10',
      'v1.34.0-beta.0',
      'v1.34.0-rc.1',
      'v1.34.0',
      'v1.34.3',
      'v1.35.0',
      'v1.36.2',
      'v2.0.0',
    ])
      expect(affected('nftables', v), v).to.equal(false);
  });

  it('applies only in nftables mode, and never to a version that is unknown or no version', () => {
    for (const mode of ['ipvs', 'iptables', 'kernelspace', 'unknown'])
      expect(affected(mode, 'v1.33.2'), mode).to.equal(false);
    expect(affected('nftables', undefined)).to.equal(false);
    expect(affected('nftables', 'v1.33.2 and more')).to.equal(false);
    expect(affected('nftables', '')).to.equal(false);
  });

  it('says what it breaks, which versions have it and which fix it', () => {
    const [issue] = knownIssues('nftables', 'v1.33.2');
    expect(issue?.effect).to.match(/pods.*externalTrafficPolicy: Local/);
    expect(issue?.versions).to.include('v1.33.6').and.to.include('v1.34.0');
  });
});

describe('kube-proxy version: the kubernetes_build_info line', () => {
  it('reads git_version, and gitVersion (kube-proxy before 1.19)', () => {
    const current = kubeProxyMetricsText('v1.33.2')
      .split('\n')
      .find((l) => l.startsWith('kubernetes_build_info{'))!;
    expect(buildInfoVersionLabel(current)).to.equal('v1.33.2');
    expect(
      buildInfoVersionLabel(
        'kubernetes_build_info{buildDate="2020-01-01T00:00:00Z",compiler="gc",gitCommit="abc",gitTreeState="clean",gitVersion="v1.18.20",goVersion="go1.13",major="1",minor="18",platform="linux/amd64"} 1',
      ),
    ).to.equal('v1.18.20');
  });

  it('undoes the exposition escapes, and parses quotes and commas inside values', () => {
    expect(
      buildInfoVersionLabel('kubernetes_build_info{a="x\\",git_version=\\"v9.9.9",git_version="v1.2.3"} 1'),
    ).to.equal('v1.2.3');
    expect(buildInfoVersionLabel('kubernetes_build_info{git_version="v1.2.3\\n"} 1')).to.equal('v1.2.3\n');
  });

  it('is undefined for other lines, and empty for a build info line without a version that parses', () => {
    for (const line of [
      '',
      '# HELP kubernetes_build_info x',
      'kubernetes_build_info_x{git_version="v1.2.3"} 1',
      'go_goroutines 5',
    ])
      expect(buildInfoVersionLabel(line), line).to.equal(undefined);
    for (const line of [
      'kubernetes_build_info{major="1"} 1',
      'kubernetes_build_info{git_version="v1.2.3" 1',
      'kubernetes_build_info{git_version=v1.2.3} 1',
      'kubernetes_build_info{git_version="v1.2.3}',
    ])
      expect(buildInfoVersionLabel(line), line).to.equal('');
  });
});

/** Writes `text` in chunks of `size` bytes, each in its own write, then ends. */
function inChunks(res: http.ServerResponse, text: string, size: number): void {
  res.writeHead(200, { 'content-type': 'text/plain; version=0.0.4' });
  const write = (from: number) => {
    if (from >= text.length) return void res.end();
    res.write(text.slice(from, from + size), () => write(from + size));
  };
  write(0);
}

describe('kube-proxy version: GET /metrics', function () {
  let server: LocalHttpServer;
  before(async () => (server = await LocalHttpServer.start()));
  after(() => server.stop());

  it("reads kube-proxy's answer, asking for the text format on /metrics, in chunks that split lines", async () => {
    let asked: http.IncomingHttpHeaders | undefined;
    let path: string | undefined;
    const text = kubeProxyMetricsText('v1.33.2', 200); // about 200 KiB before the build info
    expect(text.indexOf('kubernetes_build_info{')).to.be.above(150_000);
    server.handler = (req, res) => {
      asked = req.headers;
      path = req.url;
      inChunks(res, text, 997);
    };
    const r = await fetchKubeProxyVersion(server.address, 5000);
    expect(r.version?.text, r.problem).to.equal('v1.33.2');
    expect(path).to.equal('/metrics');
    expect(asked?.accept).to.equal('text/plain;version=0.0.4');
    expect(asked?.['accept-encoding']).to.equal(undefined);
  });

  it('takes the build info line that ends the answer without a newline', async () => {
    server.handler = (_req, res) =>
      res.end('go_goroutines 5\nkubernetes_build_info{git_version="v1.34.1",major="1",minor="34"} 1');
    expect((await fetchKubeProxyVersion(server.address, 1000)).version?.text).to.equal('v1.34.1');
  });

  it('skips lines too long to be the build info line and still finds it after them', async () => {
    server.handler = (_req, res) =>
      inChunks(res, `# HELP x ${'y'.repeat(100_000)}\n${kubeProxyMetricsText('v1.32.4', 1)}`, 4096);
    expect((await fetchKubeProxyVersion(server.address, 5000)).version?.text).to.equal('v1.32.4');
  });

  it('garbage, errors, endless answers and silence are "no version", each within its bound', async () => {
    const long = `kubernetes_build_info{git_version="v1.33.2-${'a'.repeat(200)}"} 1\n`;
    const cases: Array<[(req: http.IncomingMessage, res: http.ServerResponse) => void, RegExp]> = [
      [(_q, res) => res.end('<html>hello</html>'), /^no kubernetes_build_info$/],
      [(_q, res) => res.end(''), /^no kubernetes_build_info$/],
      [(_q, res) => res.end('kubernetes_build_info{major="1"} 1\n'), /carries no version: ""/],
      [(_q, res) => res.end('kubernetes_build_info{git_version="<script>"} 1\n'), /carries no version: "<script>"/],
      [(_q, res) => res.end(long), /carries no version: "v1\.33\.2-a{32}"$/], // quoted, cut to 40
      [
        (_q, res) => res.end(`kubernetes_build_info{git_version="${'v'.repeat(20_000)}"} 1\n`),
        /^no kubernetes_build_info$/,
      ],
      [(_q, res) => res.writeHead(500).end(kubeProxyMetricsText('v1.33.2')), /^HTTP 500$/],
      [(_q, res) => res.writeHead(404).end(), /^HTTP 404$/],
      [(_q, res) => res.end(Buffer.from([0xff, 0xfe, 0x00, 0x0a, 0x01])), /^no kubernetes_build_info$/],
      [() => undefined, /^no answer within 300ms$/], // accepts and never answers
      [(_q, res) => res.socket?.destroy(), /ECONNRESET|socket hang up/],
      [
        (_q, res) => {
          res.writeHead(200);
          res.write('go_goroutines 5\nkubernetes_build_info{git_ver'); // then stalls mid-line
        },
        /^no answer within 300ms$/,
      ],
    ];
    for (const [behaviour, problem] of cases) {
      server.handler = behaviour;
      const r = await fetchKubeProxyVersion(server.address, 300);
      expect(r.version, String(behaviour)).to.equal(undefined);
      expect(r.problem, String(behaviour)).to.match(problem);
    }
  });

  it('stops reading an answer without the build info after MAX_METRICS_BYTES, before it ends', async () => {
    let written = 0;
    let closed = false;
    server.handler = (_req, res) => {
      res.writeHead(200);
      const line = `go_thing{a="${'b'.repeat(1000)}"} 1\n`;
      const more = () => {
        // Endless, unless the client goes: then the socket closes and writes stop.
        while (!closed && res.write(line)) written += line.length;
        if (!closed) res.once('drain', more);
      };
      res.on('close', () => (closed = true));
      more();
    };
    const r = await fetchKubeProxyVersion(server.address, 15_000);
    expect(r.problem).to.equal(`no kubernetes_build_info in the first ${MAX_METRICS_BYTES} bytes`);
    await new Promise((resolve) => setImmediate(resolve));
    expect(written, 'the server was cut off').to.be.below(MAX_METRICS_BYTES * 4);
  });

  it('nothing listening is "connection refused"', async () => {
    const port = await closedLoopbackPort();
    expect(await fetchKubeProxyVersion({ host: '127.0.0.1', port }, 1000)).to.deep.equal({
      problem: 'connection refused',
    });
  });
});
