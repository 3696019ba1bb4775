// The netfilter netlink plumbing of the native addons is written once, in native/netlink_socket.h
// and .cc: the socket's set-up (open, bind, extended and capped acks, the receive timeout, its
// buffers), its sends, the receive loop that walks the kernel's messages, and the clock the addons
// time their work with. Any other file of native/ that opens a netlink socket, sets such an
// option, reads or walks datagrams itself, or keeps a clock of its own fails here; so does a
// target of binding.gyp that compiles a user of the helper without the helper. Nothing here is
// built or run: the sources are read as text, comments and string literals left out.

import { expect } from 'chai';
import { readdirSync, readFileSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const NATIVE = join(ROOT, 'native');
const HELPER = ['native/netlink_socket.h', 'native/netlink_socket.cc'];

/** `path:line: ...` in the order of the files, then of their lines. */
const byPlace = (a: string, b: string) => a.localeCompare(b, 'en', { numeric: true });

/** What only the helper may write, each with the words a failure names it by. */
const RULES: Array<{ pattern: RegExp; what: string }> = [
  { pattern: /\bsocket\s*\(\s*(AF|PF)_NETLINK\b/, what: 'opens a netlink socket (socket(AF_NETLINK, ...))' },
  { pattern: /\bmnl_socket_open2?\s*\(/, what: "opens a netlink socket (libmnl's mnl_socket_open)" },
  { pattern: /\bmnl_socket_bind\s*\(/, what: "binds a netlink socket (libmnl's mnl_socket_bind)" },
  {
    pattern:
      /\bsetsockopt\s*\([^;]*\b(NETLINK_EXT_ACK|NETLINK_CAP_ACK|SO_RCVTIMEO|SO_SNDTIMEO|SO_(SND|RCV)BUF(FORCE)?)\b/,
    what: 'sets a netlink socket option (setsockopt of NETLINK_EXT_ACK, NETLINK_CAP_ACK, SO_RCVTIMEO, a buffer size)',
  },
  {
    pattern: /\b(recvmsg|recvfrom|recv|mnl_socket_recvfrom)\s*\(/,
    what: 'reads datagrams itself (recvmsg, recv, ...)',
  },
  { pattern: /\b(sendto|sendmsg|mnl_socket_sendto)\s*\(/, what: 'sends datagrams itself (sendto, sendmsg, ...)' },
  { pattern: /\b(NLMSG_NEXT|mnl_nlmsg_next|mnl_cb_run2?)\s*\(/, what: 'walks the messages of a datagram itself' },
  { pattern: /\bclock_gettime\s*\(|\bstd::chrono::|\b(steady|system|high_resolution)_clock\b/, what: 'reads a clock' },
  { pattern: /\bNowMs\s*\([^()]*\)\s*(const\s*)?\{/, what: 'defines a NowMs of its own' },
];

/** The code of a C or C++ source: comments and the contents of string and character literals blanked. */
function codeOf(text: string): string {
  let out = '';
  for (let i = 0; i < text.length;) {
    const two = text.slice(i, i + 2);
    if (two === '//') {
      while (i < text.length && text[i] !== '\n') i += 1;
    } else if (two === '/*') {
      const end = text.indexOf('*/', i + 2);
      const stop = end < 0 ? text.length : end + 2;
      out += text.slice(i, stop).replace(/[^\n]/g, ' ');
      i = stop;
    } else if (text[i] === '"' || text[i] === "'") {
      const quote = text[i]!;
      out += quote;
      i += 1;
      while (i < text.length && text[i] !== quote && text[i] !== '\n') {
        out += ' ';
        i += text[i] === '\\' ? 2 : 1;
      }
      if (i < text.length && text[i] === quote) out += quote;
      i += 1;
    } else {
      out += text[i];
      i += 1;
    }
  }
  return out;
}

/** Each line of `text` that breaks a rule, as `path:line: what it does`. */
function violationsIn(path: string, text: string): string[] {
  if (HELPER.includes(path)) return [];
  const found: string[] = [];
  // Statements may span lines: each rule is matched on the code with its lines joined, and the
  // line of the match's start is named.
  const code = codeOf(text);
  for (const { pattern, what } of RULES) {
    const global = new RegExp(pattern.source, 'g');
    for (const match of code.matchAll(global)) {
      const line = code.slice(0, match.index).split('\n').length;
      found.push(`${path}:${line}: ${what}`);
    }
  }
  return found.sort(byPlace);
}

function sourcesOf(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return sourcesOf(path);
    return /\.(c|cc|cpp|h|hh|hpp)$/.test(entry.name) ? [relative(ROOT, path)] : [];
  });
}

/** The files `path` includes with quotes, and theirs (paths relative to the checkout). */
function includedBy(path: string, seen = new Set<string>()): Set<string> {
  for (const match of readFileSync(join(ROOT, path), 'utf8').matchAll(/^\s*#\s*include\s+"([^"]+)"/gm)) {
    const included = relative(ROOT, join(ROOT, path, '..', match[1]!));
    if (seen.has(included)) continue;
    seen.add(included);
    includedBy(included, seen);
  }
  return seen;
}

describe('native netlink plumbing: written once, in native/netlink_socket.{h,cc}', () => {
  it('finds what the addons wrote before the helper, and passes over comments and strings', () => {
    // Lines as nft_element_dump.cc, conntrack_addon.cc and nftables_addon.cc had them.
    const before = [
      'double NowMs() {',
      '  timespec now{};',
      '  clock_gettime(CLOCK_MONOTONIC, &now);',
      '}',
      '  socket_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);',
      '  if (mnl_socket_bind(socket_, 0, MNL_SOCKET_AUTOPID) < 0) {',
      '  setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &on, sizeof on);',
      '  setsockopt(mnl_socket_get_fd(socket_), SOL_SOCKET,',
      '             SO_RCVTIMEO, &tv, sizeof tv);',
      '      fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);',
      '    const ssize_t received = recvmsg(fd, &message, 0);',
      '    for (; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {',
      '    const int rc = mnl_cb_run(buffer.data(), n, seq, portid, OnEntry, &state);',
      '  if (mnl_socket_sendto(sock, dump, dump->nlmsg_len) < 0) return false;',
    ].join('\n');
    expect(violationsIn('native/old.cc', before)).to.deep.equal(
      [
        'native/old.cc:1: defines a NowMs of its own',
        'native/old.cc:3: reads a clock',
        "native/old.cc:5: opens a netlink socket (libmnl's mnl_socket_open)",
        "native/old.cc:6: binds a netlink socket (libmnl's mnl_socket_bind)",
        'native/old.cc:7: sets a netlink socket option (setsockopt of NETLINK_EXT_ACK, NETLINK_CAP_ACK, SO_RCVTIMEO, a buffer size)',
        'native/old.cc:8: sets a netlink socket option (setsockopt of NETLINK_EXT_ACK, NETLINK_CAP_ACK, SO_RCVTIMEO, a buffer size)',
        'native/old.cc:10: opens a netlink socket (socket(AF_NETLINK, ...))',
        'native/old.cc:11: reads datagrams itself (recvmsg, recv, ...)',
        'native/old.cc:12: walks the messages of a datagram itself',
        'native/old.cc:13: walks the messages of a datagram itself',
        'native/old.cc:14: sends datagrams itself (sendto, sendmsg, ...)',
      ].sort(byPlace),
    );
    const mentions = [
      '// Delete messages per sendto(2): setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, ...) in the helper.',
      '/* recvmsg(fd, &m, 0) and clock_gettime(CLOCK_MONOTONIC, &t) */',
      'error = "cannot recvmsg(): no socket(AF_NETLINK)";',
      "const char quote = '\"'; const double t = netlink::NowMs();",
    ].join('\n');
    expect(violationsIn('native/new.cc', mentions)).to.deep.equal([]);
    expect(violationsIn('native/netlink_socket.cc', before)).to.deep.equal([]);
  });

  it('no file of native/ but the helper sets up a netlink socket, reads its answers or keeps a clock', () => {
    const files = sourcesOf(NATIVE);
    expect(files).to.include.members([...HELPER, 'native/nftables_addon.cc', 'native/conntrack_addon.cc']);
    const found = files.flatMap((path) => violationsIn(path, readFileSync(join(ROOT, path), 'utf8')));
    expect(
      found,
      `use netlink::Socket and netlink::NowMs (native/netlink_socket.h):\n${found.join('\n')}`,
    ).to.deep.equal([]);
  });

  it('every binding.gyp target that compiles a user of the helper compiles the helper', () => {
    const gyp = readFileSync(join(ROOT, 'binding.gyp'), 'utf8');
    const targets = gyp.split(/'target_name':\s*/).slice(1);
    let users = 0;
    for (const target of targets) {
      const name = /^'([^']+)'/.exec(target)![1]!;
      // The sources of every condition of the target (binding.gyp's comments start with #).
      const compiled = [...target.replace(/#.*$/gm, '').matchAll(/'(native\/[^']+\.cc)'/g)].map((m) => m[1]!);
      const needs = compiled.filter((path) => path !== HELPER[1] && includedBy(path).has(HELPER[0]!));
      if (needs.length === 0) continue;
      users += 1;
      expect(compiled, `${name} compiles ${needs.join(', ')} but not ${HELPER[1]}`).to.include(HELPER[1]);
    }
    // The nftables and conntrack addons.
    expect(users).to.equal(2);
  });
});
