// How a kernel or container test process is isolated from the machine: a network and mount
// namespace of its own, a tmpfs on /run/netns inside it (the `ip netns` names the tests create
// never appear on the host, not even as dangling entries while the tests run), and a bpffs of
// the tests' own at /sys/fs/bpf, as a node has one (a cleanup fails where it finds none, and the
// host's pins, if any, are never seen). Used by test/run.mjs and scripts/repeat-kernel-test.mjs.

/** The command and arguments that run `command args…` isolated. */
export function isolated(command, args) {
  return {
    cmd: 'unshare',
    args: [
      '--net',
      '--mount',
      '--propagation',
      'private',
      '--',
      'sh',
      '-c',
      'mkdir -p /run/netns && mount -t tmpfs -o mode=0755 ipvs-node-controller-tests /run/netns && ' +
        'mount -t bpf ipvs-node-controller-tests /sys/fs/bpf && exec "$0" "$@"',
      command,
      ...args,
    ],
  };
}
