import { Reconciler } from '../../src/reconciler/reconciler.js';
import { expect } from 'chai';
import { rejectionOf } from '../support/assertions.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { EbpfDriver } from '../../src/backends/ebpf/ebpf-driver.js';
import {
  CAPABILITY,
  MINIMUM_KERNEL,
  atLeast,
  cgroup2MountPoint,
  effectiveCapabilities,
  kernelVersion,
  missingCapabilities,
} from '../../src/backends/ebpf/host-support.js';

const HYBRID = [
  'tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0',
  'cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0',
  'cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0',
  'cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0',
].join('\n');

const PURE_V2 = [
  'sysfs /sys sysfs rw,nosuid,nodev,noexec,relatime 0 0',
  'cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate,memory_recursiveprot 0 0',
  'bpf /sys/fs/bpf bpf rw,nosuid,nodev,noexec,relatime,mode=700 0 0',
].join('\n');

function caps(...bits: number[]): bigint {
  return bits.reduce((acc, b) => acc | (1n << BigInt(b)), 0n);
}

describe('ebpf host support', () => {
  it('finds the cgroup2 mount on a hybrid and on a pure v2 host', () => {
    expect(cgroup2MountPoint(HYBRID)).to.equal('/sys/fs/cgroup/unified');
    expect(cgroup2MountPoint(PURE_V2)).to.equal('/sys/fs/cgroup');
  });

  it('finds no cgroup2 mount on a v1-only host, and decodes escaped mount points', () => {
    expect(cgroup2MountPoint('cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n')).to.equal(undefined);
    expect(cgroup2MountPoint('none /run/my\\040cgroup cgroup2 rw 0 0\n')).to.equal('/run/my cgroup');
  });

  it('reads the effective capability set', () => {
    const status = 'Name:\tnode\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\nCapBnd:\t000001ffffffffff\n';
    expect(effectiveCapabilities(status)).to.equal(0x000001fffeffffffn);
    expect(effectiveCapabilities('Name:\tnode\n')).to.equal(undefined);
  });

  it('needs CAP_BPF with CAP_NET_ADMIN, or CAP_SYS_ADMIN', () => {
    expect(missingCapabilities(caps(CAPABILITY.CAP_BPF, CAPABILITY.CAP_NET_ADMIN))).to.deep.equal([]);
    expect(missingCapabilities(caps(CAPABILITY.CAP_SYS_ADMIN))).to.deep.equal([]);
    expect(missingCapabilities(caps(CAPABILITY.CAP_BPF))).to.deep.equal(['CAP_NET_ADMIN']);
    expect(missingCapabilities(caps(CAPABILITY.CAP_NET_ADMIN))).to.deep.equal(['CAP_BPF']);
    expect(missingCapabilities(0n)).to.deep.equal(['CAP_BPF', 'CAP_NET_ADMIN']);
  });

  it('compares kernel versions', () => {
    expect(kernelVersion('6.1.0-18-amd64')).to.deep.equal([6, 1]);
    expect(kernelVersion('5.10.209')).to.deep.equal([5, 10]);
    expect(kernelVersion('garbage')).to.equal(undefined);
    expect(atLeast([5, 10], MINIMUM_KERNEL)).to.equal(true);
    expect(atLeast([5, 8], MINIMUM_KERNEL)).to.equal(true);
    expect(atLeast([5, 7], MINIMUM_KERNEL)).to.equal(false);
    expect(atLeast([4, 19], MINIMUM_KERNEL)).to.equal(false);
  });

  it('probe names every missing piece in one line, without changing anything', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebpf-probe-'));
    try {
      const backend = new Reconciler(
        new EbpfDriver({
          cgroupPath: join(dir, 'no-such-cgroup'),
          bpffsPath: join(dir, 'pins'),
          objectPath: join(dir, 'missing.bpf.o'),
        }),
      );
      const probe = await backend.driver.probe();
      expect(probe.ok).to.equal(false);
      expect(probe.detail).to.not.match(/\n/);
      expect(probe.detail).to.match(/missing\.bpf\.o is not built/);
      expect(probe.detail).to.match(/no-such-cgroup is not a cgroup v2 directory/);
      expect(probe.detail).to.match(/pins is not on a bpffs mount/);
      expect(await backend.driver.hasState!()).to.equal(false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('cleanup where no bpffs is mounted fails and says so, rather than report a clean node', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebpf-cleanup-'));
    try {
      const backend = new Reconciler(new EbpfDriver({ cgroupPath: dir, bpffsPath: join(dir, 'never-created') }));
      const err = await rejectionOf(backend.cleanup());
      expect(err.message).to.match(
        new RegExp(
          `^ebpf cleanup: ${dir} is not on a bpffs mount, so the pins under ${dir}/never-created cannot be seen`,
        ),
      );
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
