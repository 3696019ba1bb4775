// The elements of one map or set read with a netlink dump: one NFT_MSG_GETSETELEM request with
// NLM_F_DUMP (built by libnftnl, as nft builds it), answered by NEWSETELEM messages of a few
// hundred elements each and NLMSG_DONE. Each message is parsed by libnftnl into a set of its own,
// written out as lines and freed, so that memory holds one message's elements, never the map's.
//
// The lines are those writeElements takes (nft_element_batch.h): `address protocol port
// value[ comment]` for a map, `address protocol port` for a set of its keys; `address protocol
// port source` for a set of keys each with a source address (the ranged entries' own-address
// set); and `address protocol port verdict[ chain]` for a verdict map (`jump source-ranges-…`).
// Addresses are printed as the model writes them (AppendAddress: RFC 5952, never mixed notation,
// where nft and inet_ntop print `::1.2.3.4`); protocols tcp, udp and sctp by name, others by number.
// A comment's control characters are printed as '?': such a line is no line the controller
// writes, so the element is replaced.
//
// Every read is bounded: at most maxElements elements (more: tooMany, and the set is not read
// further), at most so many bytes of datagrams, each datagram read with a receive timeout. A
// dump that a commit interrupted (NLM_F_DUMP_INTR) is reported so (interrupted): the caller
// reads again.

#include "nft_element_dump.h"

#include <libmnl/libmnl.h>
#include <libnftnl/common.h>
#include <libnftnl/set.h>
#include <libnftnl/udata.h>

#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace nft_batch {

namespace {

// The most bytes one element takes in a dump: key, data and comment with their attribute headers
// and nests (about 200 at most), rounded up generously.
constexpr size_t kMaxElementDumpBytes = 512;
// A dump datagram is at most 32 KiB (the kernel sizes it to the reader's buffer, up to that).
constexpr size_t kDatagramBytes = 64 << 10;
// The kernel answers a dump as fast as it is read; the timeout only bounds a socket out of step.
constexpr int kReceiveTimeoutMs = 5000;

struct Formatter {
  int af = AF_INET;
  size_t addressBytes = 4;
  ElementRead::Kind kind = ElementRead::Kind::kMap;
  size_t maxElements = 0;
  std::string* lines = nullptr;
  size_t* elements = nullptr;
  std::string error;
  bool tooMany = false;
};

int CommentOf(const nftnl_udata* attr, void* data) {
  if (nftnl_udata_type(attr) == NFTNL_UDATA_SET_ELEM_COMMENT) *static_cast<const nftnl_udata**>(data) = attr;
  return MNL_CB_OK;
}

// Addresses as the model writes them (src/model/ip.ts, canonicalAddress), so that a line of an
// element that stays is the very line the controller wants: the dotted quad; IPv6 as RFC 5952
// section 4 has it (lower-case groups without leading zeros, the longest run of two or more zero
// groups as `::`, the first of equal runs) and never in mixed notation. inet_ntop writes
// `::1.2.3.4` and `::ffff:1.2.3.4` where the model writes `::102:304` and `::ffff:102:304`: such
// an element was deleted and added back by every whole write. By hand for IPv4 too: glibc's
// inet_ntop prints it with sprintf, which was most of a dump's own time.
void AppendAddress(std::string& out, int af, const void* bytes) {
  const auto* b = static_cast<const uint8_t*>(bytes);
  char text[48];
  size_t at = 0;
  if (af == AF_INET) {
    for (int i = 0; i < 4; ++i) {
      const unsigned v = b[i];
      if (v >= 100) text[at++] = static_cast<char>('0' + v / 100);
      if (v >= 10) text[at++] = static_cast<char>('0' + v / 10 % 10);
      text[at++] = static_cast<char>('0' + v % 10);
      if (i < 3) text[at++] = '.';
    }
    out.append(text, at);
    return;
  }
  unsigned groups[8];
  for (int i = 0; i < 8; ++i) groups[i] = static_cast<unsigned>(b[2 * i]) << 8 | b[2 * i + 1];
  int bestStart = -1;
  int bestLength = 1;
  for (int i = 0; i < 8;) {
    if (groups[i] != 0) {
      ++i;
      continue;
    }
    int end = i;
    while (end < 8 && groups[end] == 0) ++end;
    if (end - i > bestLength) {
      bestStart = i;
      bestLength = end - i;
    }
    i = end;
  }
  static const char kHex[] = "0123456789abcdef";
  for (int i = 0; i < 8; ++i) {
    if (i == bestStart) {
      text[at++] = ':';
      text[at++] = ':';
      i += bestLength - 1;
      continue;
    }
    if (i > 0 && i != bestStart + bestLength) text[at++] = ':';
    const unsigned g = groups[i];
    bool digits = false;
    for (int shift = 12; shift >= 0; shift -= 4) {
      const unsigned digit = (g >> shift) & 0xf;
      if (digit != 0 || digits || shift == 0) {
        text[at++] = kHex[digit];
        digits = true;
      }
    }
  }
  out.append(text, at);
}

// A verdict as nft writes it: `accept`, `return`, `jump CHAIN`, ...; false for one it does not name.
bool AppendVerdict(std::string& out, nftnl_set_elem* e) {
  if (!nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_VERDICT)) return false;
  const auto verdict = static_cast<int32_t>(nftnl_set_elem_get_u32(e, NFTNL_SET_ELEM_VERDICT));
  const char* chain = nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_CHAIN) ? nftnl_set_elem_get_str(e, NFTNL_SET_ELEM_CHAIN) : nullptr;
  switch (verdict) {
    case NF_ACCEPT: out += "accept"; return true;
    case NF_DROP: out += "drop"; return true;
    case NFT_CONTINUE: out += "continue"; return true;
    case NFT_RETURN: out += "return"; return true;
    case NFT_JUMP:
    case NFT_GOTO:
      if (chain == nullptr) return false;
      out += verdict == NFT_JUMP ? "jump " : "goto ";
      for (const char* c = chain; *c != '\0'; ++c) out += static_cast<unsigned char>(*c) <= 0x20 ? '?' : *c;
      return true;
    default:
      return false;
  }
}

int FormatElement(nftnl_set_elem* e, void* data) {
  auto& f = *static_cast<Formatter*>(data);
  if (*f.elements >= f.maxElements) {
    f.tooMany = true;
    return -1;
  }
  const bool sourced = f.kind == ElementRead::Kind::kSourced;
  // Each field of a concatenation takes a multiple of 4 bytes: address, protocol, port (, source).
  const size_t keyBytes = f.addressBytes + 4 + 4 + (sourced ? f.addressBytes : 0);
  uint32_t length = 0;
  const auto* key = static_cast<const uint8_t*>(nftnl_set_elem_get(e, NFTNL_SET_ELEM_KEY, &length));
  if (key == nullptr || length != keyBytes) {
    f.error = "an element's key is " + std::to_string(key == nullptr ? 0 : length) + " bytes, not " +
              std::to_string(keyBytes) + (sourced ? " (address, protocol, port, source)" : " (address, protocol, port)");
    return -1;
  }
  if (nftnl_set_elem_is_set(e, NFTNL_SET_ELEM_FLAGS) &&
      (nftnl_set_elem_get_u32(e, NFTNL_SET_ELEM_FLAGS) & NFT_SET_ELEM_INTERVAL_END) != 0) {
    f.error = "the set holds intervals of single keys";
    return -1;
  }
  std::string& out = *f.lines;
  AppendAddress(out, f.af, key);
  const uint8_t protocol = key[f.addressBytes];
  out += ' ';
  if (protocol == IPPROTO_TCP) out += "tcp";
  else if (protocol == IPPROTO_UDP) out += "udp";
  else if (protocol == IPPROTO_SCTP) out += "sctp";
  else out += std::to_string(protocol);
  uint16_t port;
  std::memcpy(&port, key + f.addressBytes + 4, sizeof port);
  out += ' ';
  out += std::to_string(ntohs(port));
  if (sourced) {
    out += ' ';
    AppendAddress(out, f.af, key + f.addressBytes + 8);
  }
  if (f.kind == ElementRead::Kind::kVerdicts) {
    out += ' ';
    if (!AppendVerdict(out, e)) {
      f.error = "a verdict map element has no verdict the controller writes";
      return -1;
    }
  }
  if (f.kind == ElementRead::Kind::kMap) {
    const void* value = nftnl_set_elem_get(e, NFTNL_SET_ELEM_DATA, &length);
    if (value == nullptr || length != f.addressBytes) {
      f.error = "a map element has no address as its value";
      return -1;
    }
    out += ' ';
    AppendAddress(out, f.af, value);
    const void* user = nftnl_set_elem_get(e, NFTNL_SET_ELEM_USERDATA, &length);
    const nftnl_udata* comment = nullptr;
    if (user != nullptr) nftnl_udata_parse(user, length, CommentOf, &comment);
    if (comment != nullptr) {
      const auto* text = static_cast<const char*>(nftnl_udata_get(comment));
      const size_t bytes = strnlen(text, nftnl_udata_len(comment));
      if (bytes > 0) {
        out += ' ';
        for (size_t i = 0; i < bytes; ++i) out += static_cast<unsigned char>(text[i]) < 0x20 ? '?' : text[i];
      }
    }
  }
  out += '\n';
  ++*f.elements;
  return 0;
}

}  // namespace

ElementReadResult ElementReader::Read(const ElementRead& read) {
  ElementReadResult result;
  const double started = netlink::NowMs();
  if (read.family != AF_INET && read.family != AF_INET6) {
    result.error = "the family must be ip or ip6";
    return result;
  }
  if (read.table.empty() || read.table.size() >= 256 || read.set.empty() || read.set.size() >= 256) {
    result.error = "bad table or set name";
    return result;
  }
  if (!socket_.Open(kReceiveTimeoutMs, kDatagramBytes, result.error)) return result;

  alignas(nlmsghdr) char request[1024];
  const uint32_t seq = socket_.NextSeq();
  nlmsghdr* nlh = nftnl_nlmsg_build_hdr(request, NFT_MSG_GETSETELEM, read.family, NLM_F_DUMP, seq);
  nftnl_set* named = nftnl_set_alloc();
  if (named == nullptr) {
    result.error = "out of memory";
    return result;
  }
  nftnl_set_set_str(named, NFTNL_SET_TABLE, read.table.c_str());
  nftnl_set_set_str(named, NFTNL_SET_NAME, read.set.c_str());
  nftnl_set_elems_nlmsg_build_payload(nlh, named);
  nftnl_set_free(named);
  if (!socket_.Send(nlh, nlh->nlmsg_len)) {
    result.error = std::string("cannot send the dump request: ") + std::strerror(errno);
    return result;
  }

  Formatter f;
  f.af = read.family == AF_INET6 ? AF_INET6 : AF_INET;
  f.addressBytes = f.af == AF_INET ? 4 : 16;
  f.kind = read.kind;
  f.maxElements = read.maxElements;
  f.lines = &result.lines;
  f.elements = &result.elements;
  netlink::Limits limits;
  limits.maxBytes = read.maxElements * kMaxElementDumpBytes + (1 << 20);
  // Any failure below leaves the rest of the dump on the socket: it is closed, and reopened at
  // the next read.
  std::string error;
  const netlink::Received received = socket_.Receive(seq, seq, limits, [&](const netlink::Message& m) {
    using Type = netlink::Message::Type;
    if ((m.header->nlmsg_flags & NLM_F_DUMP_INTR) != 0) result.interrupted = true;
    if (m.type == Type::kDone) {
      if (m.error != 0) error = "the dump of " + read.set + " failed: " + std::strerror(m.error);
      return netlink::Next::kStop;
    }
    if (m.type == Type::kAck) return netlink::Next::kMore;
    if (m.type == Type::kError) {
      result.missing = m.error == ENOENT;
      error = "cannot read " + read.set + ": " + std::strerror(m.error);
      return netlink::Next::kStop;
    }
    if (m.header->nlmsg_type != ((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWSETELEM)) return netlink::Next::kMore;
    nftnl_set* elements = nftnl_set_alloc();
    if (elements == nullptr) {
      error = "out of memory";
      return netlink::Next::kStop;
    }
    const bool parsed = nftnl_set_elems_nlmsg_parse(m.header, elements) >= 0;
    if (parsed) nftnl_set_elem_foreach(elements, FormatElement, &f);
    nftnl_set_free(elements);
    if (!parsed) {
      error = "libnftnl could not parse the elements of " + read.set;
    } else if (f.tooMany) {
      result.tooMany = true;
      error = read.set + " holds more than " + std::to_string(read.maxElements) +
              " elements, more than the controller writes: it was not read";
    } else if (!f.error.empty()) {
      error = read.set + ": " + f.error;
    }
    return error.empty() ? netlink::Next::kMore : netlink::Next::kStop;
  });
  if (received.end == netlink::Received::End::kTooManyBytes) {
    result.tooMany = true;
    error = "the dump of " + read.set + " is longer than " + std::to_string(limits.maxBytes) + " bytes, more than " +
            std::to_string(read.maxElements) + " elements take";
  } else if (!received.ok()) {
    error = "reading the dump of " + read.set + ": " + received.Why();
  }
  if (!error.empty()) {
    result.error = std::move(error);
    result.lines.clear();
    socket_.Close();
    return result;
  }
  result.ok = true;
  result.ms = netlink::NowMs() - started;
  return result;
}

}  // namespace nft_batch
