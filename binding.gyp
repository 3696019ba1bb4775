# Native addons, one target per system library. A target whose library pkg-config cannot find
# becomes an empty target (type none, no .node file), so a machine without one -dev package
# still builds the others and `node-gyp rebuild` never fails for a missing library; the
# TypeScript side then uses its fallback (the nft CLI for libnftables).
# A further addon goes beside nftables_addon the same way: a have_<library> variable and a
# target whose sources and libraries sit under the condition that the variable is 1.
# Warnings: -Wall -Wextra (and unused parameters, which node's common.gypi turns off) build
# without one warning; CI adds -Werror through CXXFLAGS (.ci/run), so that a compiler this
# project has not seen (the image's gcc 14, a user's) only warns and never fails an install.
# Hardening, for every build (CI's, the image's, a user's): stack protector, read-only
# relocations resolved at load (full RELRO), and glibc's checked variants of memcpy, snprintf and
# the like (_FORTIFY_SOURCE, which needs optimisation: Release only, where node's common.gypi
# compiles with -O3; -U first, as some compilers define it already and a redefinition warns).
{
  'target_defaults': {
    'cflags': ['-fstack-protector-strong'],
    'ldflags': ['-Wl,-z,relro', '-Wl,-z,now'],
    'configurations': {
      'Release': {
        'cflags': ['-U_FORTIFY_SOURCE', '-D_FORTIFY_SOURCE=2'],
      },
    },
  },
  'variables': {
    'have_libnftables%': '<!(pkg-config --exists libnftables && echo 1 || echo 0)',
    'have_libbpf%': '<!(pkg-config --exists libbpf && echo 1 || echo 0)',
    'have_libnftnl%': '<!(pkg-config --exists libnftnl libmnl && echo 1 || echo 0)',
    'have_libmnl%': '<!(pkg-config --exists libmnl && echo 1 || echo 0)',
  },
  'targets': [
    {
      'target_name': 'nftables_addon',
      'conditions': [
        ['have_libnftables==1', {
          # netlink_socket.cc: the netfilter netlink socket of every addon that talks to the
          # kernel (set-up, sends, the receive loop) and their clock; libc only.
          'sources': ['native/nftables_addon.cc', 'native/nft_session.cc', 'native/netlink_socket.cc'],
          'dependencies': ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
          'defines': [
            'NAPI_VERSION=8',
            'LIBNFTABLES_VERSION="<!(pkg-config --modversion libnftables)"',
          ],
          'cflags_cc': ['-std=c++17', '-Wall', '-Wextra', '-Wunused-parameter', '<!@(pkg-config --cflags libnftables)'],
          'cflags_cc!': ['-std=gnu++17'],
          'libraries': ['<!@(pkg-config --libs libnftables)'],
          'conditions': [
            # Map element writes as netlink batches (writeElements) and reads as netlink dumps
            # (readSets), and those two calls (nft_element_calls.cc); without libnftnl-dev and
            # libmnl-dev the addon has neither, and elements go through libnftables' JSON.
            ['have_libnftnl==1', {
              'sources': ['native/nft_element_batch.cc', 'native/nft_element_dump.cc', 'native/nft_element_calls.cc'],
              'defines': ['NFT_ELEMENT_BATCH=1'],
              'cflags_cc': ['<!@(pkg-config --cflags libnftnl libmnl)'],
              'libraries': ['<!@(pkg-config --libs libnftnl libmnl)'],
            }],
          ],
        }, {
          'type': 'none',
        }],
      ],
    },
    {
      # Conntrack entries deleted through ctnetlink, in the process (src/conntrack/): without
      # libmnl-dev, the conntrack command does it, a process per tuple.
      'target_name': 'conntrack_addon',
      'conditions': [
        ['have_libmnl==1', {
          'sources': ['native/conntrack_addon.cc', 'native/conntrack_delete.cc', 'native/netlink_socket.cc'],
          'dependencies': ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
          'defines': ['NAPI_VERSION=8'],
          'cflags_cc': ['-std=c++17', '-Wall', '-Wextra', '-Wunused-parameter', '<!@(pkg-config --cflags libmnl)'],
          'cflags_cc!': ['-std=gnu++17'],
          'libraries': ['<!@(pkg-config --libs libmnl)'],
        }, {
          'type': 'none',
        }],
      ],
    },
    {
      # The pages of the files the process maps handed back after the start (src/cli/): libc
      # only, so always built.
      'target_name': 'memory_addon',
      'sources': ['native/memory_addon.cc'],
      'dependencies': ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
      'defines': ['NAPI_VERSION=8'],
      'cflags_cc': ['-std=c++17', '-Wall', '-Wextra', '-Wunused-parameter'],
      'cflags_cc!': ['-std=gnu++17'],
    },
    {
      # The eBPF backend: load, attach and pin the programs of bpf/, batch map updates.
      'target_name': 'ebpf_addon',
      'conditions': [
        ['have_libbpf==1', {
          'sources': [
            'native/bpf/ebpf_addon.cc',
            'native/bpf/pinned_programs.cc',
            'native/bpf/pinned_map.cc',
            'native/bpf/bpf_errors.cc',
          ],
          'dependencies': ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
          'defines': ['NAPI_VERSION=8'],
          'cflags_cc': ['-std=c++17', '-Wall', '-Wextra', '-Wunused-parameter', '<!@(pkg-config --cflags libbpf)'],
          'cflags_cc!': ['-std=gnu++17'],
          'libraries': ['<!@(pkg-config --libs libbpf)'],
        }, {
          'type': 'none',
        }],
      ],
    },
  ],
}
