// .github/workflows/release.yml cannot run here (no registry, no GitHub): its syntax is checked
// with GitHub's own workflow parser (@actions/workflow-parser, the Actions language service's),
// and what it does is read from it: on a version tag, the same `npm run release`, the archive
// pushed unchanged with its digest checked, both architectures signed, the files published.

import { expect } from 'chai';
import { build } from 'esbuild';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import YAML from 'yaml';

type Parser = typeof import('@actions/workflow-parser');

/**
 * The parser, bundled by esbuild: its modules import its JSON schema without the import attribute
 * Node requires (it is written for bundlers).
 */
async function loadParser(): Promise<Parser> {
  const dir = await mkdtemp(join(tmpdir(), 'workflow-parser-'));
  try {
    const out = await build({
      stdin: { contents: "export * from '@actions/workflow-parser';", resolveDir: repoRoot },
      bundle: true,
      format: 'esm',
      platform: 'node',
      write: false,
      logLevel: 'silent',
      // Its CommonJS dependencies (yaml) call require().
      banner: { js: "import { createRequire } from 'node:module'; const require = createRequire(import.meta.url);" },
    });
    const file = join(dir, 'parser.mjs');
    await writeFile(file, out.outputFiles[0]!.text);
    return (await import(pathToFileURL(file).href)) as Parser;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const repoRoot = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const WORKFLOW = join('.github', 'workflows', 'release.yml');

interface Step {
  name?: string;
  uses?: string;
  run?: string;
  with?: Record<string, string | boolean>;
}

describe('the release workflow (.github/workflows/release.yml)', function () {
  let parser: Parser;
  let text: string;
  let workflow: {
    on: { push: { tags: string[] } };
    permissions: Record<string, string>;
    jobs: Record<string, { steps: Step[]; container?: { image: string; options?: string } }>;
  };

  before(async () => {
    parser = await loadParser();
    text = await readFile(join(repoRoot, WORKFLOW), 'utf8');
    workflow = YAML.parse(text) as typeof workflow;
  });

  it("is a valid workflow to GitHub's parser: no schema or expression error", async () => {
    const parsed = parser.parseWorkflow({ name: WORKFLOW, content: text }, new parser.NoOperationTraceWriter());
    expect(parsed.context.errors.getErrors().map((e) => e.message)).to.deep.equal([]);
    expect(parsed.value).to.not.equal(undefined);
    const template = await parser.convertWorkflowTemplate(parsed.context, parsed.value!);
    expect((template.errors ?? []).map((e) => e.Message)).to.deep.equal([]);
    expect(template.jobs.map((j) => j.id.value)).to.deep.equal(['release']);
  });

  it('the parser finds errors where there are some (a job without runs-on, an unknown key)', () => {
    const broken = text.replace('    runs-on: ubuntu-24.04\n', '    runs-onn: ubuntu-24.04\n');
    expect(broken).to.not.equal(text);
    const parsed = parser.parseWorkflow({ name: WORKFLOW, content: broken }, new parser.NoOperationTraceWriter());
    expect(parsed.context.errors.getErrors().length).to.be.greaterThan(0);
  });

  it('runs on a version tag with the permissions it needs and no more', () => {
    expect(workflow.on.push.tags).to.deep.equal(['v*.*.*']);
    expect(workflow.permissions).to.deep.equal({
      contents: 'write',
      packages: 'write',
      'id-token': 'write',
      attestations: 'write',
    });
  });

  it('runs npm run release as CI does, on Debian bookworm with the project install script', () => {
    const { steps, container } = workflow.jobs.release!;
    // Debian bookworm, pinned by the digest of its multi-arch index.
    expect(container?.image).to.match(/^debian:bookworm(-slim)?@sha256:[0-9a-f]{64}$/);
    const runs = steps.map((s) => s.run ?? '').join('\n');
    expect(runs).to.include('bash scripts/install-system-packages.sh');
    expect(runs).to.match(/npm ci && npm run build/);
    expect(runs).to.match(
      /npm run release -- --registry "\$REPOSITORY" --source-repository "\$SOURCE_REPOSITORY" --node-dist https:\/\/nodejs\.org\/dist/,
    );
    const release = steps.find((s) => s.run?.includes('npm run release'))!;
    expect((release as { env?: Record<string, string> }).env?.SOURCE_REPOSITORY).to.equal(
      '${{ github.server_url }}/${{ github.repository }}',
    );
    expect(runs, 'the tag must be the version the manifests carry').to.include('test "$TAG" = "v$version"');
  });

  it('pushes the archive unchanged, checks the registry serves the pinned digest, signs both architectures', () => {
    const runs = workflow.jobs.release!.steps.map((s) => s.run ?? '').join('\n');
    expect(runs).to.include('skopeo copy --all --preserve-digests');
    expect(runs).to.match(/test "\$pushed" = "\$digest"/);
    expect(runs).to.include('cosign sign --yes --recursive "$REPOSITORY@$DIGEST"');
    expect(runs).to.include('cosign attest --yes --type cyclonedx --predicate dist/release/sbom.cdx.json');
    const publish = workflow.jobs.release!.steps.find((s) => s.uses?.startsWith('softprops/action-gh-release@'));
    expect(publish, 'the files are published').to.not.equal(undefined);
    // Secrets reach commands through the environment, never spliced into a script.
    for (const step of workflow.jobs.release!.steps) expect(step.run ?? '').to.not.include('${{ secrets.');
  });
  it('publishes every manifest npm run release renders, and the README names each', async () => {
    const script = await readFile(join(repoRoot, 'scripts', 'release.mjs'), 'utf8');
    const rendered = [
      .../const rendered = \{([\s\S]*?)\n {2}\};/.exec(script)![1]!.matchAll(/^ {4}'([\w-]+\.yaml)': \[/gm),
    ].map((m) => m[1]!);
    expect(rendered).to.include.members(['monitoring.yaml', 'monitoring-kube-prometheus-stack.yaml']);
    const publish = workflow.jobs.release!.steps.find((s) => s.uses?.startsWith('softprops/action-gh-release@'))!;
    const files = String(publish.with?.files ?? '')
      .split('\n')
      .map((f) => f.trim());
    const readme = await readFile(join(repoRoot, 'README.md'), 'utf8');
    const header = /^(?:#!.*\n)?((?:\/\/.*\n)+)/.exec(script)![1]!;
    for (const file of rendered) {
      expect(files, file).to.include(`dist/release/${file}`);
      expect(header, `release.mjs's header names ${file}`).to.match(new RegExp(`\\b${file.replace('.', '\\.')}\\b`));
      expect(readme, `README names ${file}`).to.include(`\`${file}\``);
    }
  });

  it('tests the very files it pushes: one release build, then the tests CI runs on them, then the unchanged archive pushed', () => {
    const steps = workflow.jobs.release!.steps;
    const at = (what: (s: Step) => boolean, label: string) => {
      const i = steps.findIndex(what);
      expect(i, label).to.be.greaterThan(-1);
      return i;
    };
    const build = at((s) => /npm run release\b/.test(s.run ?? ''), 'the release step');
    const test = at((s) => /IPVS_NODE_CONTROLLER_REQUIRE_IMAGE=1 npm test/.test(s.run ?? ''), 'the test step');
    const push = at((s) => (s.run ?? '').includes('skopeo copy'), 'the push step');
    const sign = at((s) => (s.run ?? '').includes('cosign sign'), 'the sign step');
    expect(build).to.be.lessThan(test);
    expect(test).to.be.lessThan(push);
    expect(push).to.be.lessThan(sign);
    // Nothing between the release and the push builds images or release files again.
    for (const s of steps.slice(build + 1, push + 1))
      expect(s.run ?? '', s.name).to.not.match(/npm run (release|image)\b|buildah|podman build|scripts\/image\.mjs/);
    // The files are checked unchanged after the tests and again right before the push, which
    // copies that archive (what the tests installed by digest) and checks the registry serves its digest.
    expect(steps[test]!.run).to.include('sha256sum --check --strict SHA256SUMS');
    expect(steps[push]!.run).to.match(
      /sha256sum --check --strict SHA256SUMS[\s\S]*skopeo copy --all --preserve-digests \\\n\s+"oci-archive:dist\/release\//,
    );
  });

  it('pins every action by a full commit, and keeps the checkout token off disk', () => {
    const uses = workflow.jobs.release!.steps.filter((s) => s.uses).map((s) => s.uses!);
    expect(uses.length).to.be.greaterThan(4);
    for (const u of uses) expect(u, 'owner/repo@<40 hex>').to.match(/^[\w.-]+\/[\w.-]+@[0-9a-f]{40}$/);
    // The tag each was taken at stays readable beside it.
    for (const line of text.split('\n').filter((l) => /^\s*(- )?uses: /.test(l)))
      expect(line).to.match(/@[0-9a-f]{40} # v\d+\.\d+\.\d+$/);
    const checkout = workflow.jobs.release!.steps.find((s) => s.uses?.startsWith('actions/checkout@'))!;
    expect(checkout.with?.['persist-credentials']).to.equal(false);
  });

  it('attests build provenance of the pushed digest and of the release files, beside the SBOM', () => {
    const steps = workflow.jobs.release!.steps;
    const provenance = steps.filter((s) => s.uses?.startsWith('actions/attest-build-provenance@'));
    expect(provenance.map((s) => s.with)).to.deep.equal([
      { 'subject-name': '${{ env.REPOSITORY }}', 'subject-digest': '${{ env.DIGEST }}', 'push-to-registry': true },
      { 'subject-checksums': 'dist/release/SHA256SUMS' },
    ]);
  });
  it("the Dockerfile's base images are pinned by digest, the build image at the Node.js version of the image", async () => {
    const dockerfile = await readFile(join(repoRoot, 'Dockerfile'), 'utf8');
    const arg = (name: string) => new RegExp(`^ARG ${name}=(\\S+)$`, 'm').exec(dockerfile)?.[1];
    expect(arg('RUNTIME_IMAGE')).to.match(/^debian:trixie-slim@sha256:[0-9a-f]{64}$/);
    expect(arg('BUILD_IMAGE')).to.match(/^node:[\d.]+-trixie(-slim)?@sha256:[0-9a-f]{64}$/);
    expect(arg('BUILD_IMAGE')!.split(':')[1]!.split('-')[0]).to.equal(arg('NODE_VERSION'));
  });
});
