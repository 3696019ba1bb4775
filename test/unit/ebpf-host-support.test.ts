import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import { EbpfBackend } from '../../src/backends/ebpf/ebpf-backend.js';
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
    assert.equal(cgroup2MountPoint(HYBRID), '/sys/fs/cgroup/unified');
    assert.equal(cgroup2MountPoint(PURE_V2), '/sys/fs/cgroup');
  });

  it('finds no cgroup2 mount on a v1-only host, and decodes escaped mount points', () => {
    assert.equal(cgroup2MountPoint('cgroup /sys/fs/cgroup/cpu cgroup rw 0 0\n'), undefined);
    assert.equal(cgroup2MountPoint('none /run/my\\040cgroup cgroup2 rw 0 0\n'), '/run/my cgroup');
  });

  it('reads the effective capability set', () => {
    const status = 'Name:\tnode\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffffff\nCapBnd:\t000001ffffffffff\n';
    assert.equal(effectiveCapabilities(status), 0x000001fffeffffffn);
    assert.equal(effectiveCapabilities('Name:\tnode\n'), undefined);
  });

  it('needs CAP_BPF with CAP_NET_ADMIN, or CAP_SYS_ADMIN', () => {
    assert.deepEqual(missingCapabilities(caps(CAPABILITY.CAP_BPF, CAPABILITY.CAP_NET_ADMIN)), []);
    assert.deepEqual(missingCapabilities(caps(CAPABILITY.CAP_SYS_ADMIN)), []);
    assert.deepEqual(missingCapabilities(caps(CAPABILITY.CAP_BPF)), ['CAP_NET_ADMIN']);
    assert.deepEqual(missingCapabilities(caps(CAPABILITY.CAP_NET_ADMIN)), ['CAP_BPF']);
    assert.deepEqual(missingCapabilities(0n), ['CAP_BPF', 'CAP_NET_ADMIN']);
  });

  it('compares kernel versions', () => {
    assert.deepEqual(kernelVersion('6.1.0-18-amd64'), [6, 1]);
    assert.deepEqual(kernelVersion('5.10.209'), [5, 10]);
    assert.equal(kernelVersion('garbage'), undefined);
    assert.equal(atLeast([5, 10], MINIMUM_KERNEL), true);
    assert.equal(atLeast([5, 8], MINIMUM_KERNEL), true);
    assert.equal(atLeast([5, 7], MINIMUM_KERNEL), false);
    assert.equal(atLeast([4, 19], MINIMUM_KERNEL), false);
  });

  it('probe names every missing piece in one line, without changing anything', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebpf-probe-'));
    try {
      const backend = new EbpfBackend({
        cgroupPath: join(dir, 'no-such-cgroup'),
        bpffsPath: join(dir, 'pins'),
        objectPath: join(dir, 'missing.bpf.o'),
      });
      const probe = await backend.probe();
      assert.equal(probe.ok, false);
      assert.doesNotMatch(probe.detail, /\n/);
      assert.match(probe.detail, /missing\.bpf\.o is not built/);
      assert.match(probe.detail, /no-such-cgroup is not a cgroup v2 directory/);
      assert.match(probe.detail, /pins is not on a bpffs mount/);
      assert.equal(await backend.hasState(), false);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('cleanup where no bpffs is mounted fails and says so, rather than report a clean node', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'ebpf-cleanup-'));
    try {
      const backend = new EbpfBackend({ cgroupPath: dir, bpffsPath: join(dir, 'never-created') });
      await assert.rejects(backend.cleanup(), {
        message: new RegExp(
          `^ebpf cleanup: ${dir} is not on a bpffs mount, so the pins under ${dir}/never-created cannot be seen`,
        ),
      });
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
