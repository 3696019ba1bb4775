# Stand-alone build of the eBPF addon (node-gyp --directory native/bpf rebuild), used until the
# target sits beside nftables_addon in the top-level binding.gyp.
{
  'variables': {
    'have_libbpf%': '<!(pkg-config --exists libbpf && echo 1 || echo 0)',
  },
  'conditions': [
    ['have_libbpf==1', {
      'targets': [
        {
          'target_name': 'ebpf_addon',
          'sources': ['ebpf_addon.cc', 'pinned_programs.cc', 'pinned_map.cc', 'bpf_errors.cc'],
          'dependencies': ["<!(node -p \"require('node-addon-api').targets\"):node_addon_api_except"],
          'defines': ['NAPI_VERSION=8'],
          'cflags_cc': ['-std=c++17', '<!@(pkg-config --cflags libbpf)'],
          'cflags_cc!': ['-std=gnu++17', '-std=gnu++20'],
          'libraries': ['<!@(pkg-config --libs libbpf)'],
        },
      ],
    }],
  ],
}
