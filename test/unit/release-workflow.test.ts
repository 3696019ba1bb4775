// The workflows (.github/workflows/*.yml) cannot run here (no registry, no GitHub): their syntax
// is checked with GitHub's own workflow parser (@actions/workflow-parser, the Actions language
// service's), and what they do is read from them. The release: on a version tag, a read-only
// build job runs .ci/run itself (so it runs every part of CI) with the release's arguments and
// uploads the tested files; a second job, the only one that may write or sign, runs no code of
// the project or of its dependencies: it checks the files' digests, pushes the archive unchanged,
// signs, attests and publishes. CI runs the same .ci/run on every pull request.

import { expect } from 'chai';
import { build } from 'esbuild';
import { mkdtemp, readFile, readdir, rm, writeFile } from 'node:fs/promises';
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
const WORKFLOWS = join('.github', 'workflows');
const RELEASE = join(WORKFLOWS, 'release.yml');
const CI = join(WORKFLOWS, 'ci.yml');

interface Step {
  name?: string;
  uses?: string;
  run?: string;
  if?: string;
  'continue-on-error'?: boolean;
  env?: Record<string, string>;
  with?: Record<string, string | boolean | number>;
}
type Permissions = Record<string, string> | string;
interface Job {
  name?: string;
  needs?: string | string[];
  permissions?: Permissions;
  steps: Step[];
  container?: { image: string; options?: string };
}
interface Workflow {
  on: Record<string, unknown>;
  permissions?: Permissions;
  jobs: Record<string, Job>;
}

const WRITE_SCOPES = ['contents', 'packages', 'id-token', 'attestations'];

/**
 * Whether a job may write or sign: a write scope in its permissions (its own, else the
 * workflow's; none at all is the repository's default token, which may write), or a step that
 * pushes, signs, attests or publishes.
 */
function writes(workflow: Workflow, job: Job): boolean {
  const permissions = job.permissions ?? workflow.permissions;
  if (permissions === undefined || typeof permissions === 'string') return permissions !== 'read-all';
  if (WRITE_SCOPES.some((scope) => permissions[scope] === 'write')) return true;
  return job.steps.some(
    (s) =>
      /\b(skopeo copy|cosign (sign|attest)|docker push|podman push|gh release)\b/.test(s.run ?? '') ||
      /^(sigstore\/cosign-installer|actions\/attest[\w-]*|softprops\/action-gh-release)@/.test(s.uses ?? ''),
  );
}

/** What runs code of the project or of its dependencies, or builds: never in a job that writes. */
const PROJECT_CODE: [RegExp, string][] = [
  [/\bnpm\s+(ci|install|i|test|t|run|run-script|exec|rebuild|start|pack|publish)\b/, 'npm'],
  [/\b(npx|yarn|pnpm|corepack)\b/, 'a package manager'],
  [/(^|[\s;&|(])node(\s|$)/m, 'node'],
  [/\.ci\/run|\bscripts\/|\bbin\/|\btest\/|\.\/[\w.-]/, "the repository's scripts"],
  [/\b(make|tsc|esbuild|node-gyp|buildah|podman build|docker build|docker buildx)\b/, 'a build'],
];
function projectCode(step: Step): string[] {
  const found: string[] = [];
  for (const [pattern, what] of PROJECT_CODE) if (pattern.test(step.run ?? '')) found.push(what);
  const uses = step.uses ?? '';
  if (uses.startsWith('./') || uses.startsWith('.github/')) found.push("the repository's own action");
  // A checkout puts the repository's code on the runner; setup-node is there to run it.
  if (uses.startsWith('actions/checkout@')) found.push('a checkout');
  if (uses.startsWith('actions/setup-node@')) found.push('setup-node');
  return found;
}
/** Every step of a writing job that runs project code, as `job: step: what`. */
function violations(workflow: Workflow): string[] {
  const out: string[] = [];
  for (const [id, job] of Object.entries(workflow.jobs)) {
    if (!writes(workflow, job)) continue;
    for (const step of job.steps)
      for (const what of projectCode(step)) out.push(`${id}: ${step.name ?? step.uses ?? step.run}: ${what}`);
  }
  return out;
}

/** The commands of a shell script: its lines without comments, blank lines and `start=`/`echo` timing. */
function commands(script: string): string[] {
  return script
    .split('\n')
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#') && !/^(start=|echo )/.test(l) && l !== 'set -euo pipefail');
}

describe('the workflows (.github/workflows/*.yml)', function () {
  let parser: Parser;
  const texts = new Map<string, string>();
  const workflows = new Map<string, Workflow>();
  let release: Workflow;
  let ci: Workflow;
  let ciRun: string;

  before(async () => {
    parser = await loadParser();
    const files = (await readdir(join(repoRoot, WORKFLOWS))).filter((f) => /\.ya?ml$/.test(f)).sort();
    for (const f of files) {
      const text = await readFile(join(repoRoot, WORKFLOWS, f), 'utf8');
      texts.set(join(WORKFLOWS, f), text);
      workflows.set(join(WORKFLOWS, f), YAML.parse(text) as Workflow);
    }
    release = workflows.get(RELEASE)!;
    ci = workflows.get(CI)!;
    ciRun = await readFile(join(repoRoot, '.ci', 'run'), 'utf8');
  });

  it('are the release and the pull-request workflow', () => {
    expect([...workflows.keys()]).to.deep.equal([CI, RELEASE]);
  });

  it("are each valid to GitHub's parser: no schema or expression error", async () => {
    const jobs: Record<string, string[]> = {};
    for (const [name, content] of texts) {
      const parsed = parser.parseWorkflow({ name, content }, new parser.NoOperationTraceWriter());
      expect(
        parsed.context.errors.getErrors().map((e) => e.message),
        name,
      ).to.deep.equal([]);
      expect(parsed.value, name).to.not.equal(undefined);
      const template = await parser.convertWorkflowTemplate(parsed.context, parsed.value!);
      expect(
        (template.errors ?? []).map((e) => e.Message),
        name,
      ).to.deep.equal([]);
      jobs[name] = template.jobs.map((j) => j.id.value);
    }
    expect(jobs).to.deep.equal({ [CI]: ['ci'], [RELEASE]: ['build', 'publish'] });
  });

  it('the parser finds errors where there are some (a job without runs-on, an unknown key)', () => {
    for (const [name, text] of texts) {
      const broken = text.replace('    runs-on: ubuntu-24.04\n', '    runs-onn: ubuntu-24.04\n');
      expect(broken, name).to.not.equal(text);
      const parsed = parser.parseWorkflow({ name, content: broken }, new parser.NoOperationTraceWriter());
      expect(parsed.context.errors.getErrors().length, name).to.be.greaterThan(0);
    }
  });

  it('a job that may write or sign runs no code of the project or its dependencies, in every workflow', () => {
    for (const [name, workflow] of workflows) expect(violations(workflow), name).to.deep.equal([]);
    // The check fires: the single job the release once was (npm ci, npm test, then the signing)
    // and any of those commands added to the publish job.
    const publish = release.jobs.publish!;
    const merged: Workflow = {
      ...release,
      jobs: { release: { ...publish, steps: [...release.jobs.build!.steps, ...publish.steps] } },
    };
    expect(violations(merged)).to.include.members([
      `release: .ci/run, with the release's arguments (lint, typecheck, -Werror, npm run release, npm test, npm run test:vm): the repository's scripts`,
      'release: actions/checkout@11bd71901bbe5b1630ceea73d27597364c9af683: a checkout',
    ]);
    for (const run of [
      'npm ci',
      'npm test',
      'npm run release',
      'version=$(node -p \'require("./package.json").version\')',
      'bash scripts/install-system-packages.sh',
      'make',
      './build.sh',
    ]) {
      const added: Workflow = { ...release, jobs: { publish: { ...publish, steps: [...publish.steps, { run }] } } };
      expect(violations(added), run).to.not.deep.equal([]);
    }
    // A job without write permissions that signs is a writing job all the same.
    const signing: Workflow = {
      permissions: { contents: 'read' },
      on: {},
      jobs: { j: { steps: [{ run: 'npm ci' }, { run: 'cosign sign --yes x' }] } },
    };
    expect(violations(signing)).to.deep.equal(['j: npm ci: npm']);
  });

  it('names its permissions in every workflow and job: none falls back to the default token', () => {
    for (const [name, workflow] of workflows) {
      expect(workflow.permissions, `${name}: workflow permissions`).to.not.equal(undefined);
      for (const job of Object.values(workflow.jobs))
        expect(job.permissions ?? workflow.permissions).to.not.be.a('string');
    }
  });

  it('the release runs on a version tag: a read-only build, then the one job that writes', () => {
    expect(release.on).to.deep.equal({ push: { tags: ['v*.*.*'] } });
    expect(release.permissions).to.deep.equal({});
    expect(release.jobs.build!.permissions).to.deep.equal({ contents: 'read' });
    expect(release.jobs.publish!.permissions).to.deep.equal({
      contents: 'write',
      packages: 'write',
      'id-token': 'write',
      attestations: 'write',
    });
    expect(release.jobs.publish!.needs).to.equal('build');
    // Only the publish job of the release workflow may get the OIDC token: the certificate names
    // the workflow file (README's identity), not the job.
    const signers = [...workflows].flatMap(([name, w]) =>
      Object.entries(w.jobs)
        .filter(([, j]) => typeof j.permissions === 'object' && j.permissions['id-token'] === 'write')
        .map(([id]) => `${name}:${id}`),
    );
    expect(signers).to.deep.equal([`${RELEASE}:publish`]);
  });

  it('.ci/run has every part of CI, and passes its arguments to npm run release', () => {
    expect(commands(ciRun)).to.deep.equal([
      'cd "$(dirname "$0")/.."',
      'bash scripts/install-system-packages.sh',
      'npm ci',
      'npm run lint',
      'npm run typecheck',
      'CXXFLAGS=-Werror npm run build:native',
      'release_args=("$@")',
      '[ "${#release_args[@]}" -gt 0 ] || release_args=(--registry ghcr.io/ipvs-node-controller/ipvs-node-controller)',
      'npm run release -- "${release_args[@]}"',
      'npm run image:previous',
      'IPVS_NODE_CONTROLLER_REQUIRE_IMAGE=1 npm test',
      'npm run test:vm',
    ]);
  });

  it("the release's build job runs .ci/run itself, with the release's arguments, and skips none of it", () => {
    const { steps, container } = release.jobs.build!;
    // Debian bookworm, pinned by the digest of its multi-arch index; privileged (root, binfmt,
    // and the runner's /dev/kvm for the VM layer).
    expect(container?.image).to.match(/^debian:bookworm(-slim)?@sha256:[0-9a-f]{64}$/);
    expect(container?.options).to.equal('--privileged');
    const ciSteps = steps.filter((s) => (s.run ?? '').includes('.ci/run'));
    expect(ciSteps).to.have.length(1);
    const step = ciSteps[0]!;
    expect(step.run).to.equal(
      'bash .ci/run --registry "$REPOSITORY" --source-repository "$SOURCE_REPOSITORY" --node-dist https://nodejs.org/dist',
    );
    // Nothing lets it fail, skips it, or tells a suite to skip.
    expect(step.if).to.equal(undefined);
    expect(step['continue-on-error']).to.equal(undefined);
    expect(step.env).to.deep.equal({ SOURCE_REPOSITORY: '${{ github.server_url }}/${{ github.repository }}' });
    const runs = steps.map((s) => s.run ?? '').join('\n');
    expect(runs, 'the tag must be the version the manifests carry').to.include('test "$TAG" = "v$version"');
    // Nothing after .ci/run builds again: the artifact is the files the tests ran on.
    const at = steps.indexOf(step);
    for (const s of steps.slice(at + 1))
      expect(s.run ?? '', s.name).to.not.match(/npm |buildah|podman build|scripts\/image\.mjs/);
    expect(steps[at + 1]!.run).to.equal('cd dist/release && sha256sum --check --strict SHA256SUMS');
    const upload = steps[at + 2]!;
    expect(upload.uses).to.match(/^actions\/upload-artifact@/);
    expect(upload.with).to.include({ name: 'release', path: 'dist/release/', 'if-no-files-found': 'error' });
    for (const s of steps) expect(s.run ?? '').to.not.include('${{ secrets.');
  });

  it('publishes every manifest npm run release renders, and the README names each', async () => {
    const script = await readFile(join(repoRoot, 'scripts', 'release.mjs'), 'utf8');
    const rendered = [
      .../const rendered = \{([\s\S]*?)\n {2}\};/.exec(script)![1]!.matchAll(/^ {4}'([\w-]+\.yaml)': \[/gm),
    ].map((m) => m[1]!);
    expect(rendered).to.include.members(['monitoring.yaml', 'monitoring-kube-prometheus-stack.yaml']);
    const publish = release.jobs.publish!.steps.find((s) => s.uses?.startsWith('softprops/action-gh-release@'))!;
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

  it('the publish job checks the files the build job tested, pushes that archive unchanged, signs both architectures', () => {
    const steps = release.jobs.publish!.steps;
    const at = (what: (s: Step) => boolean, label: string) => {
      const i = steps.findIndex(what);
      expect(i, label).to.be.greaterThan(-1);
      return i;
    };
    const download = at((s) => (s.uses ?? '').startsWith('actions/download-artifact@'), 'the download');
    expect(download).to.equal(0);
    expect(steps[download]!.with).to.deep.equal({ name: 'release', path: 'dist/release' });
    const check = at((s) => s.run === 'cd dist/release && sha256sum --check --strict SHA256SUMS', 'the check');
    const push = at((s) => (s.run ?? '').includes('skopeo copy'), 'the push');
    const sign = at((s) => (s.run ?? '').includes('cosign sign'), 'the signing');
    const attest = at((s) => (s.uses ?? '').startsWith('actions/attest-build-provenance@'), 'the provenance');
    const publish = at((s) => (s.uses ?? '').startsWith('softprops/action-gh-release@'), 'the publication');
    expect(download).to.be.lessThan(check);
    expect(check).to.be.lessThan(push);
    expect(push).to.be.lessThan(sign);
    expect(sign).to.be.lessThan(attest);
    expect(attest).to.be.lessThan(publish);
    // Checked again right before the copy of that archive; the registry must serve its digest.
    expect(steps[push]!.run).to.match(
      /sha256sum --check --strict SHA256SUMS[\s\S]*skopeo copy --all --preserve-digests \\\n\s+"oci-archive:dist\/release\//,
    );
    expect(steps[push]!.run).to.match(/test "\$pushed" = "\$digest"/);
    expect(steps[push]!.run).to.include('digest=$(jq -r .digest dist/release/release.json)');
    expect(steps[sign]!.run).to.include('cosign sign --yes --recursive "$REPOSITORY@$DIGEST"');
    expect(steps[sign]!.run).to.include('cosign attest --yes --type cyclonedx --predicate dist/release/sbom.cdx.json');
    // Secrets reach commands through the environment, never spliced into a script.
    for (const step of steps) expect(step.run ?? '').to.not.include('${{ secrets.');
  });

  it('attests build provenance of the pushed digest and of the release files, beside the SBOM', () => {
    const provenance = release.jobs.publish!.steps.filter((s) =>
      s.uses?.startsWith('actions/attest-build-provenance@'),
    );
    expect(provenance.map((s) => s.with)).to.deep.equal([
      { 'subject-name': '${{ env.REPOSITORY }}', 'subject-digest': '${{ env.DIGEST }}', 'push-to-registry': true },
      { 'subject-checksums': 'dist/release/SHA256SUMS' },
    ]);
  });

  it('the pull-request workflow runs .ci/run as the release does, read-only', () => {
    expect(ci.on).to.deep.equal({ pull_request: null, push: { branches: ['main'] } });
    expect(ci.permissions).to.deep.equal({ contents: 'read' });
    const job = ci.jobs.ci!;
    expect(job.permissions).to.equal(undefined);
    expect(job.container).to.deep.equal(release.jobs.build!.container);
    const ciSteps = job.steps.filter((s) => (s.run ?? '').includes('.ci/run'));
    expect(ciSteps.map((s) => s.run)).to.deep.equal(['bash .ci/run']);
    expect(ciSteps[0]!.if).to.equal(undefined);
    expect(ciSteps[0]!['continue-on-error']).to.equal(undefined);
    // The steps before .ci/run are the release build job's, but for the tag check.
    const before = (steps: Step[]) =>
      steps
        .slice(
          0,
          steps.findIndex((s) => (s.run ?? '').includes('.ci/run')),
        )
        .filter((s) => !s.env?.TAG);
    expect(before(job.steps)).to.deep.equal(before(release.jobs.build!.steps));
  });

  it('pins every action by a full commit with its tag beside it, and keeps the checkout token off disk', () => {
    for (const [name, workflow] of workflows) {
      const steps = Object.values(workflow.jobs).flatMap((j) => j.steps);
      for (const s of steps.filter((s) => s.uses))
        expect(s.uses, `${name}: owner/repo@<40 hex>`).to.match(/^[\w.-]+\/[\w.-]+(\/[\w.-]+)*@[0-9a-f]{40}$/);
      for (const line of texts
        .get(name)!
        .split('\n')
        .filter((l) => /^\s*(- )?uses: /.test(l)))
        expect(line, name).to.match(/@[0-9a-f]{40} # v\d+\.\d+\.\d+$/);
      for (const checkout of steps.filter((s) => s.uses?.startsWith('actions/checkout@')))
        expect(checkout.with?.['persist-credentials'], name).to.equal(false);
    }
  });

  it('sets up Node.js 24 or later wherever it sets one up', () => {
    let setups = 0;
    for (const [name, workflow] of workflows) {
      for (const s of Object.values(workflow.jobs).flatMap((j) => j.steps)) {
        if (!s.uses?.startsWith('actions/setup-node@')) continue;
        setups++;
        const version = String(s.with?.['node-version'] ?? '');
        expect(version, `${name}: node-version`).to.match(/^\d+(\.\d+){0,2}$/);
        expect(Number(version.split('.')[0]), `${name}: node-version ${version}`).to.be.at.least(24);
      }
      // No other way of naming a version (node-version-file, a matrix) slips past.
      expect(texts.get(name)!).to.not.match(/node-version-file|matrix:/);
    }
    expect(setups).to.equal(2);
  });

  it('Dependabot watches the actions, the npm packages and the Dockerfile', async () => {
    const config = YAML.parse(await readFile(join(repoRoot, '.github', 'dependabot.yml'), 'utf8')) as {
      version: number;
      updates: { 'package-ecosystem': string; directory: string }[];
    };
    expect(config.version).to.equal(2);
    expect(config.updates.map((u) => [u['package-ecosystem'], u.directory])).to.deep.equal([
      ['github-actions', '/'],
      ['npm', '/'],
      ['docker', '/'],
    ]);
  });

  it('README tells users to trust the identity the publish job signs with: release.yml at the tag', async () => {
    const readme = await readFile(join(repoRoot, 'README.md'), 'utf8');
    const pkg = JSON.parse(await readFile(join(repoRoot, 'package.json'), 'utf8')) as { version: string };
    const identities = [...readme.matchAll(/--certificate-identity '([^']+)'/g)].map((m) => m[1]);
    expect(identities.length).to.be.greaterThan(1);
    for (const identity of identities)
      expect(identity).to.equal(`https://github.com/OWNER/REPO/${RELEASE}@refs/tags/v${pkg.version}`);
    const script = await readFile(join(repoRoot, 'scripts', 'release.mjs'), 'utf8');
    expect(script).to.include(
      'certificateIdentity: `${sourceRepository}/.github/workflows/release.yml@refs/tags/v${version}`',
    );
  });

  it("the Dockerfile's base images are pinned by digest, the build image at the Node.js version of the image", async () => {
    const dockerfile = await readFile(join(repoRoot, 'Dockerfile'), 'utf8');
    const arg = (name: string) => new RegExp(`^ARG ${name}=(\\S+)$`, 'm').exec(dockerfile)?.[1];
    expect(arg('RUNTIME_IMAGE')).to.match(/^debian:trixie-slim@sha256:[0-9a-f]{64}$/);
    expect(arg('BUILD_IMAGE')).to.match(/^node:[\d.]+-trixie(-slim)?@sha256:[0-9a-f]{64}$/);
    expect(arg('BUILD_IMAGE')!.split(':')[1]!.split('-')[0]).to.equal(arg('NODE_VERSION'));
  });
});
