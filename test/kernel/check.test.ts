// `ipvs-node-controller check`, the shipped command, on this kernel with real packets: a working
// path is reported as working, and each way it breaks (an entry missing, our hook after IPVS's,
// our jump displaced, kube-proxy's masquerade of the mark gone, a Service whose endpoints do not
// answer) as broken, with its cause and exit code 1; alone (the controller's flags) on every
// backend, and against a running controller (its /status).

import { expect } from 'chai';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { spawn, type ChildProcess } from 'node:child_process';
import { once } from 'node:events';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { NftDriver } from '../../src/backends/nft/nft-driver.js';
import { NftCliExecutor } from '../../src/backends/nft/executor.js';
import { IptablesDriver } from '../../src/backends/iptables/iptables-driver.js';
import { OUTPUT_CHAIN, TABLE_NAME } from '../../src/backends/nft/render.js';
import { buildDesiredState } from '../../src/model/desired-state.js';
import { Reconciler } from '../../src/reconciler/reconciler.js';
import { ApiStandIn } from '../../testbed/api-server.js';
import { probe, requireTools, sh } from '../../testbed/node-network.js';
import { shippedArgs } from '../../testbed/shipped-controller.js';
import {
  KUBE_PROXY_MASQUERADE,
  removeKubeProxyMasquerade,
  checkedFinding,
  checkedPath,
  reportText,
  runCheck,
  type Json,
} from '../../testbed/check-command.js';
import { eventually } from '../support/eventually.js';
import { CONFIG, LB_V4, LB_V6, NODE_INFO, SERVICES, Scenario, applyScenario } from './scenario.js';

const MASQUERADE_RULE = [
  '-t',
  'nat',
  '-D',
  'KUBE-POSTROUTING',
  '-m',
  'comment',
  '--comment',
  'kubernetes service traffic requiring SNAT',
  '-j',
  'MASQUERADE',
  '--random-fully',
];

const path = checkedPath;
const finding = checkedFinding;
const said = reportText;
const execFileAsync = promisify(execFile);

interface Backend {
  name: string;
  flag: string;
  make: () => Reconciler;
}

const BACKENDS: Backend[] = [
  { name: 'nft', flag: '--backend=nft', make: () => new Reconciler(new NftDriver(new NftCliExecutor())) },
  { name: 'iptables (nft)', flag: '--backend=iptables', make: () => new Reconciler(new IptablesDriver('nft')) },
];

describe('ipvs-node-controller check (the shipped command, real packets)', function () {
  this.timeout(120_000);
  const scenario = new Scenario();
  let api: ApiStandIn;
  let dir: string;
  let kubeconfig: string;
  const flags = () => [`--kubeconfig=${kubeconfig}`, '--node-name=node-1'];

  before(async () => {
    requireTools('nft', 'iptables-nft', 'conntrack');
    await scenario.setUp();
    dir = await mkdtemp(join(tmpdir(), 'check-'));
    kubeconfig = join(dir, 'kubeconfig');
    api = await ApiStandIn.start();
    applyScenario(api);
    await api.writeKubeconfig(kubeconfig);
    sh('iptables-nft-restore', ['--noflush', '-w'], KUBE_PROXY_MASQUERADE);
    sh('ip6tables-nft-restore', ['--noflush', '-w'], KUBE_PROXY_MASQUERADE);
  });

  after(async () => {
    try {
      removeKubeProxyMasquerade('nft');
      sh(process.execPath, shippedArgs(['--cleanup']));
      await api?.stop();
    } finally {
      await scenario.tearDown();
      await rm(dir, { recursive: true, force: true });
    }
  });

  for (const backend of BACKENDS) {
    describe(`alone, ${backend.name} backend`, () => {
      let reconciler: Reconciler;
      const alone = (...more: string[]) => runCheck([...flags(), backend.flag, '--controller-address=', ...more]);

      before(async () => {
        reconciler = backend.make();
        await reconciler.sync(buildDesiredState(SERVICES, NODE_INFO, CONFIG), { full: true });
      });
      after(async () => {
        await reconciler.cleanup();
        await reconciler.close?.();
      });

      it('reports a working path as working: answered, translated, exit 0', async () => {
        const { code, report, stderr } = await alone('--service=default/svc-a');
        expect(code, stderr + said(report)).to.equal(0);
        expect(report.ok).to.equal(true);
        expect(report.controller.kind).to.equal('absent');
        for (const [address, protocol] of [
          [LB_V4, 'TCP'],
          [LB_V4, 'UDP'],
          [LB_V6, 'TCP'],
          [LB_V6, 'UDP'],
        ] as const) {
          const p = path(report, address, protocol, 80);
          expect(p, `${address} ${protocol}`).to.include({ ok: true, outcome: 'answered' });
          expect(p.conntrack.original.dst).to.equal(address);
          expect(p.conntrack.reply.src).to.equal(address === LB_V4 ? '10.96.0.10' : 'fd00::10');
        }
        for (const family of ['ipv4', 'ipv6']) {
          expect(finding(report, 'objects', family), family).to.include({ ok: true });
          expect(finding(report, 'hooks', family), family).to.include({ ok: true });
          expect(finding(report, 'masquerade', family), family).to.include({ ok: true });
        }
      });

      it("counts per path what conntrack holds to its address: the node's own connections, translated", async () => {
        // Three connections of the node's before the check (closed by the server: TIME_WAIT
        // entries stay), then the check's own try.
        for (let i = 0; i < 3; i++) expect(await probe(undefined, 'tcp', LB_V4, 80)).to.equal('svc-a');
        const { code, report, stderr } = await alone('--service=default/svc-a');
        expect(code, stderr + said(report)).to.equal(0);
        const tracked = path(report, LB_V4, 'TCP', 80).tracked as { connections: number; translated: number };
        expect(tracked.translated, said(report)).to.be.at.least(4);
        expect(tracked.connections).to.be.at.least(tracked.translated);
        // Not sh(): a synchronous child would hold up the API stand-in of this process.
        const { stdout: text } = await execFileAsync(
          process.execPath,
          shippedArgs(['check', ...flags(), backend.flag, '--controller-address=', '--service=default/svc-a']),
        );
        expect(text).to.match(
          /^tracked {5}default\/svc-a 192\.0\.2\.10 tcp\/80: \d+ connections in conntrack now, \d+ translated$/m,
        );
      });

      it('reports an entry missing from the kernel as broken: not translated', async () => {
        if (backend.name === 'nft') {
          sh('nft', ['delete', 'element', 'ip', TABLE_NAME, 'external-ip-to-cluster-ip', `{ ${LB_V4} . tcp . 80 }`]);
        } else {
          const bucket = sh('iptables-nft', ['-t', 'nat', '-S', 'IPVS_OUTPUT_10']).split('\n');
          const rule = bucket.find((l) => l.includes(`${LB_V4}/32`) && l.includes('--dport 80') && l.includes('DNAT'))!;
          sh('iptables-nft-restore', ['--noflush', '-w'], `*nat\n${rule.replace(/^-A /, '-D ')}\nCOMMIT\n`);
        }
        try {
          const { code, report } = await alone('--service=default/svc-a');
          expect(code).to.equal(1);
          expect(finding(report, 'objects', 'ipv4')).to.include({ ok: false });
          const p = path(report, LB_V4, 'TCP', 80);
          expect(p).to.include({ ok: false, outcome: 'answered' });
          expect(p.detail).to.match(/NOT translated/);
          expect(path(report, LB_V6, 'TCP', 80)).to.include({ ok: true });
        } finally {
          await reconciler.sync(buildDesiredState(SERVICES, NODE_INFO, CONFIG), { full: true });
        }
      });

      it("reports kube-proxy's masquerade of the mark gone as broken", async () => {
        sh('iptables-nft', MASQUERADE_RULE);
        try {
          const { code, report } = await alone('--service=default/svc-a');
          expect(code).to.equal(1);
          expect(finding(report, 'masquerade', 'ipv4')).to.include({ ok: false });
          expect(finding(report, 'masquerade', 'ipv4').detail).to.match(/does not masquerade packets marked 0x4000/);
          expect(finding(report, 'masquerade', 'ipv6')).to.include({ ok: true });
        } finally {
          sh('iptables-nft', ['-t', 'nat', '-A', 'KUBE-POSTROUTING', ...MASQUERADE_RULE.slice(4)]);
        }
      });

      it('reports a Service whose endpoints do not answer as broken, after translation', async () => {
        await scenario.stopServer('10.96.0.11', 8080);
        try {
          const { code, report } = await alone('--service=default/svc-b');
          expect(code).to.equal(1);
          const p = path(report, LB_V4, 'TCP', 8080);
          expect(p).to.include({ ok: false, outcome: 'refused' });
          // The local refusal (an RST) takes the conntrack entry with it; IPVS refuses with an
          // ICMP error and the entry stays (the VM layer shows the cause it gives).
          expect(p.detail, said(report)).to.match(/^refused; whether it was translated is not known/);
        } finally {
          await scenario.startServer('10.96.0.11', 8080);
        }
      });

      if (backend.name === 'nft') {
        it("reports our output hook after IPVS's as broken", async () => {
          const listed = sh('nft', ['list', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN]);
          sh('nft', ['delete', 'chain', 'ip', TABLE_NAME, OUTPUT_CHAIN]);
          sh('nft', ['-f', '-'], listed.replace(/priority [^;]+;/, 'priority 0;'));
          try {
            const { code, report, stderr } = await alone('--service=default/svc-a');
            expect(code, stderr).to.equal(1);
            expect(finding(report, 'hooks', 'ipv4')).to.include({ ok: false });
            expect(finding(report, 'hooks', 'ipv4')['detail']).to.match(/priority 0, not before IPVS \(-98\)/);
          } finally {
            await reconciler.sync(buildDesiredState(SERVICES, NODE_INFO, CONFIG), { full: true });
          }
        });
      } else {
        it('reports our jump displaced from rule 1 as broken', async () => {
          // The driver that wrote them puts our jumps back within a second: it is closed meanwhile.
          await reconciler.close?.();
          sh('iptables-nft', ['-t', 'nat', '-I', 'OUTPUT', '1', '-p', 'sctp', '-j', 'RETURN']);
          try {
            const { code, report } = await alone('--service=default/svc-a');
            expect(code).to.equal(1);
            expect(finding(report, 'hooks', 'ipv4')['detail']).to.match(/rule 1 of nat OUTPUT is not our jump/);
          } finally {
            sh('iptables-nft', ['-t', 'nat', '-D', 'OUTPUT', '-p', 'sctp', '-j', 'RETURN']);
            reconciler = backend.make();
            await reconciler.sync(buildDesiredState(SERVICES, NODE_INFO, CONFIG), { full: true });
          }
        });
      }
    });
  }

  describe('against the running controller', () => {
    let controller: ChildProcess | undefined;
    after(async () => {
      if (controller && controller.exitCode === null) {
        controller.kill('SIGTERM');
        await once(controller, 'exit');
      }
    });

    it("reads the controller's /status and derives what it programs; a sample without --service", async () => {
      controller = spawn(
        process.execPath,
        shippedArgs([...flags(), '--backend=nft', '--healthz-bind-address=127.0.0.1:9478', '--metrics-bind-address=']),
        { stdio: ['ignore', 'ignore', 'inherit'] },
      );
      // Given only what `kubectl exec` gives: the kubeconfig (in a pod: in-cluster) and the node.
      const result = await eventually('the controller ready, as check sees it', async () => {
        const r = await runCheck(flags());
        return r.report.controller?.readiness?.ok === true && r;
      });
      expect(result.code, result.stderr).to.equal(0);
      const { report } = result;
      expect(report.controller).to.include({ kind: 'running', address: '127.0.0.1:9478' });
      expect(report.backend.name).to.equal('nft');
      expect(report.skips).to.deep.equal({ ipModeProxy: 1, hostnameOnly: 1 });
      expect(report.entries).to.deep.equal({ ipv4: 4, ipv6: 2 });
      expect(finding(report, 'objects', 'ipv4')).to.include({ ok: true });
      expect(report.paths.filter((p: Json) => !p.skipped).every((p: Json) => p.ok)).to.equal(true);
      expect(report.translated.map((t: Json) => `${t.family} ${t.source}`)).to.have.members([
        'ipv4 pods',
        'ipv4 node',
        'ipv6 pods',
        'ipv6 node',
      ]);
    });
  });

  it('says why it cannot check: no Service of that name (exit 3)', async () => {
    const { code, report } = await runCheck([...flags(), '--controller-address=', '--service=default/nope']);
    expect(code).to.equal(3);
    expect(report.cannotCheck).to.match(/no Service default\/nope on the API server/);
  });
});
