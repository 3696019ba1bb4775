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
}

describe('the release workflow (.github/workflows/release.yml)', function () {
  this.timeout(30_000);
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
    expect(workflow.permissions).to.deep.equal({ contents: 'write', packages: 'write', 'id-token': 'write' });
  });

  it('runs npm run release as CI does, on Debian bookworm with the project install script', () => {
    const { steps, container } = workflow.jobs.release!;
    expect(container?.image).to.equal('debian:bookworm');
    const runs = steps.map((s) => s.run ?? '').join('\n');
    expect(runs).to.include('bash scripts/install-system-packages.sh');
    expect(runs).to.match(/npm ci && npm run build/);
    expect(runs).to.match(/npm run release -- --registry "\$REPOSITORY" --runbooks "\$RUNBOOKS"/);
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
});
