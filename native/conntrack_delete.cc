// Deletes conntrack entries by their original destination through ctnetlink, in the process
// (conntrack_addon runs it on a libuv worker thread). What `conntrack -D -f FAMILY -p PROTO --orig-dst IP
// --dport PORT [--reply-src IP]` does, for many tuples at once and without a process: one dump of
// the family's table (IPCTNL_MSG_CT_GET, NLM_F_DUMP), or one per protocol and port of the
// targets, filtered by the kernel (FILTERED_DUMPS_UP_TO), the entries matching a target kept (their
// original tuple and zone, copied as the kernel sent them), then one IPCTNL_MSG_CT_DELETE each.
// A process per tuple cost the controller's main thread milliseconds of fork and exec per change.
//
// A kernel that deletes by a filter (Linux 6.12 and later: CTA_FILTER on IPCTNL_MSG_CT_DELETE)
// is asked that instead, for a call of IPv4 targets only, up to FLUSHES_UP_TO: one deletion by
// filter each, no dump (see Flush).
//
// Bounds: the dump is read with a receive timeout and at most MAX_DUMPED entries. A call keeps
// (and deletes) at most `total` entries, and each target has a share of its own: at most
// min(perTarget, total / targets) of its entries, so that the flows of one target never take
// another's. A target that matched more than its share is reported truncated, with how many
// matched: its other entries stay, for the caller to delete (a further call, or the conntrack
// command). A deletion the kernel answers ENOENT (the entry went meanwhile) is not a failure.

#include "conntrack_delete.h"

#include <arpa/inet.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_conntrack.h>
#include <linux/netlink.h>
#include <sys/socket.h>

#include "netlink_socket.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <sstream>
#include <unordered_map>

namespace conntrack {

namespace {

constexpr size_t MAX_DUMPED = 8u << 20;   // entries read of one dump (a busy node: millions)
constexpr size_t MAX_TARGETS = 1u << 20;  // targets per call
// Delete messages per sendto. The kernel handles them all before the sendto returns and queues
// one acknowledgement each on our socket, an skb each, counted in full against its receive
// buffer. Batches of 60 KiB (about 750 messages) overflowed the default buffer (212,992 bytes)
// from the first one: ENOBUFS, the deletions done but not known, the whole family given to the
// conntrack command (300 entries to delete were enough, on Linux 6.18).
constexpr size_t MESSAGES_PER_SEND = 128;
// The buffer each datagram of a dump or of the acknowledgements is read into.
constexpr size_t DATAGRAM_BYTES = 64u << 10;
// Room for more acknowledgements than the default receive buffer holds (the kernel caps it at
// net.core.rmem_max): best effort.
constexpr int RECEIVE_BUFFER_BYTES = 1 << 20;
// A dump walks the whole hash table (262,144 buckets on a node with 16 GiB or more: 10-14 ms of
// the kernel's time for each, whatever it holds, measured on 6.18, softirqs off), so a call
// walks it as few times as it can: once per (protocol, port) of its targets, filtered by the
// kernel (CTA_FILTER, Linux 5.8 and later: only the entries of that protocol and destination port
// cross to us, of that destination address too when the group has one, in IPv4), up to this many
// groups; beyond, one dump of the family's whole table. Either way each entry is looked up among
// the targets. The old destination and the new one of a moved address share their ports: one
// walk. IPv6 dumps are never filtered by address: the kernels tried here (6.18) return no entry
// to an IPv6 address filter that the same filter in IPv4 finds.
constexpr size_t FILTERED_DUMPS_UP_TO = 8;
// The kernel's tuple filter flags (nf_internals.h): the original destination address, protocol
// and destination port.
constexpr uint32_t FILTER_IP_SRC = 1u << 0;
constexpr uint32_t FILTER_IP_DST = 1u << 1;
constexpr uint32_t FILTER_PROTO_NUM = 1u << 3;
constexpr uint32_t FILTER_PROTO_DST_PORT = 1u << 5;

// Deletions by filter per call, at most: beyond, one dump costs less than their walks.
constexpr size_t FLUSHES_UP_TO = 16;

// Whether the kernel deletes by a filter: learned from the first deletion asked (the kernel of a
// process does not change). 0 not known yet, 1 it does, -1 it refused.
std::atomic<int> flushSupport{0};

// One entry's parts that decide a match, and what its deletion repeats.
struct Tuple {
  const uint8_t* src = nullptr;
  const uint8_t* dst = nullptr;
  uint8_t protocol = 0;
  bool hasProtocol = false;
  uint16_t dport = 0;
  bool hasPort = false;
};

// A target's key: protocol, address, port (network order), as bytes.
std::string TargetKey(uint8_t protocol, const uint8_t* address, size_t addressLength, uint16_t port) {
  std::string key(1 + addressLength + 2, '\0');
  key[0] = static_cast<char>(protocol);
  std::memcpy(&key[1], address, addressLength);
  std::memcpy(&key[1 + addressLength], &port, 2);
  return key;
}

// One target (of one or more lines with the same key) in a call.
struct TargetState {
  size_t firstLine = 0;
  // Whether only untranslated entries go (false wins when a key is asked twice).
  bool untranslatedOnly = false;
  size_t matched = 0;  // entries seen that match
  size_t kept = 0;     // of which kept, to delete: at most the share
};

// The targets of one (protocol, destination port): one filtered dump.
struct Group {
  uint8_t protocol = 0;
  uint16_t port = 0;  // network byte order
  // The address of its first target, and whether every target of the group has it.
  const uint8_t* address = nullptr;
  bool oneAddress = true;
};

struct DumpState {
  int family = 0;
  size_t addressLength = 0;
  // Per target key: its index in `states`.
  std::unordered_map<std::string, size_t> targets;
  std::vector<TargetState> states;
  size_t share = 0;  // entries kept per target, at most
  // In a filtered dump, the group filtered for: a kernel without CTA_FILTER sends every entry,
  // which must not count for the other groups' targets (they have their own dump).
  const struct Group* only = nullptr;
  size_t dumped = 0;
  size_t dumps = 0;
  bool tooMany = false;
  // Per kept entry: its CTA_TUPLE_ORIG attribute and, when present, CTA_ZONE, as sent, one after
  // the other in `kept`; `keptEnds` holds where each ends.
  std::string kept;
  std::vector<size_t> keptEnds;
};

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// Calls `each` for every attribute nested in `nest` (libmnl's for-each macros assign void* and do
// not compile as C++).
template <typename Each>
void ForEachNested(const nlattr* nest, Each each) {
  const char* end = static_cast<const char*>(mnl_attr_get_payload(nest)) + mnl_attr_get_payload_len(nest);
  for (const nlattr* a = static_cast<const nlattr*>(mnl_attr_get_payload(nest));
       mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
    each(a);
  }
}

// CTA_TUPLE_* nest: the addresses (CTA_TUPLE_IP) and protocol with ports (CTA_TUPLE_PROTO).
bool ParseTuple(const nlattr* nest, size_t addressLength, Tuple& out) {
  ForEachNested(nest, [&](const nlattr* attr) {
    const uint16_t type = mnl_attr_get_type(attr);
    if (type == CTA_TUPLE_IP) {
      ForEachNested(attr, [&](const nlattr* ip) {
        const uint16_t t = mnl_attr_get_type(ip);
        if (mnl_attr_get_payload_len(ip) != addressLength) return;
        const auto* bytes = static_cast<const uint8_t*>(mnl_attr_get_payload(ip));
        if (t == CTA_IP_V4_SRC || t == CTA_IP_V6_SRC) out.src = bytes;
        if (t == CTA_IP_V4_DST || t == CTA_IP_V6_DST) out.dst = bytes;
      });
    } else if (type == CTA_TUPLE_PROTO) {
      ForEachNested(attr, [&](const nlattr* p) {
        const uint16_t t = mnl_attr_get_type(p);
        if (t == CTA_PROTO_NUM && mnl_attr_get_payload_len(p) >= 1) {
          out.protocol = mnl_attr_get_u8(p);
          out.hasProtocol = true;
        } else if (t == CTA_PROTO_DST_PORT && mnl_attr_get_payload_len(p) >= 2) {
          out.dport = mnl_attr_get_u16(p);
          out.hasPort = true;
        }
      });
    }
  });
  return out.src != nullptr && out.dst != nullptr && out.hasProtocol;
}

// One entry of a dump: kept when it matches a target within its share. False past MAX_DUMPED.
bool OnEntry(const nlmsghdr* nlh, DumpState* state) {
  if (++state->dumped > MAX_DUMPED) {
    state->tooMany = true;
    return false;
  }
  const nlattr* orig = nullptr;
  const nlattr* reply = nullptr;
  const nlattr* zone = nullptr;
  const char* end = reinterpret_cast<const char*>(nlh) + nlh->nlmsg_len;
  for (const nlattr* attr = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, sizeof(nfgenmsg)));
       mnl_attr_ok(attr, static_cast<int>(end - reinterpret_cast<const char*>(attr))); attr = mnl_attr_next(attr)) {
    switch (mnl_attr_get_type(attr)) {
      case CTA_TUPLE_ORIG: orig = attr; break;
      case CTA_TUPLE_REPLY: reply = attr; break;
      case CTA_ZONE: zone = attr; break;
      default: break;
    }
  }
  if (orig == nullptr) return true;
  Tuple o;
  if (!ParseTuple(orig, state->addressLength, o) || !o.hasPort) return true;
  Tuple r;
  const bool hasReply = reply != nullptr && ParseTuple(reply, state->addressLength, r);
  // One lookup per entry: a node's table holds up to millions, a sync asks for up to thousands.
  const auto target = state->targets.find(TargetKey(o.protocol, o.dst, state->addressLength, o.dport));
  if (target == state->targets.end()) return true;
  if (state->only != nullptr && (o.protocol != state->only->protocol || o.dport != state->only->port)) return true;
  TargetState& t = state->states[target->second];
  // Untranslated: the reply comes from the original destination itself.
  if (t.untranslatedOnly && (!hasReply || std::memcmp(r.src, o.dst, state->addressLength) != 0)) return true;
  ++t.matched;
  // Past its share, an entry is counted, not kept: the target is truncated.
  if (t.kept >= state->share) return true;
  ++t.kept;
  state->kept.append(reinterpret_cast<const char*>(orig), orig->nla_len);
  state->kept.resize(MNL_ALIGN(state->kept.size()), '\0');
  if (zone != nullptr) {
    state->kept.append(reinterpret_cast<const char*>(zone), zone->nla_len);
    state->kept.resize(MNL_ALIGN(state->kept.size()), '\0');
  }
  state->keptEnds.push_back(state->kept.size());
  return true;
}

nlmsghdr* PutHeader(char* buffer, uint16_t type, uint16_t flags, int family, uint32_t seq) {
  nlmsghdr* nlh = mnl_nlmsg_put_header(buffer);
  nlh->nlmsg_type = (NFNL_SUBSYS_CTNETLINK << 8) | type;
  nlh->nlmsg_flags = NLM_F_REQUEST | flags;
  nlh->nlmsg_seq = seq;
  auto* nfg = static_cast<nfgenmsg*>(mnl_nlmsg_put_extra_header(nlh, sizeof(nfgenmsg)));
  nfg->nfgen_family = static_cast<uint8_t>(family);
  nfg->version = NFNETLINK_V0;
  nfg->res_id = 0;
  return nlh;
}

// Why a receive loop of `what` (e.g. "reading conntrack's entries") did not end well.
std::string ReceiveFailure(const char* what, const netlink::Received& received) {
  const bool timedOut = received.end == netlink::Received::End::kSystem && received.error == EAGAIN;
  return std::string(what) + ": " + (timedOut ? "no answer within the timeout" : received.Why());
}

// The original destination a dump or a deletion by filter matches, and the CTA_FILTER that says
// so: protocol and destination port, the address when given (IPv4 only), and, when
// `replySource` is given, the reply's source address (IPv4 only).
void PutFilter(nlmsghdr* nlh, const uint8_t* address, uint8_t protocol, uint16_t port, const uint8_t* replySource) {
  nlattr* tuple = mnl_attr_nest_start(nlh, CTA_TUPLE_ORIG);
  if (address != nullptr) {
    nlattr* ip = mnl_attr_nest_start(nlh, CTA_TUPLE_IP);
    mnl_attr_put(nlh, CTA_IP_V4_DST, 4, address);
    mnl_attr_nest_end(nlh, ip);
  }
  nlattr* proto = mnl_attr_nest_start(nlh, CTA_TUPLE_PROTO);
  mnl_attr_put_u8(nlh, CTA_PROTO_NUM, protocol);
  mnl_attr_put_u16(nlh, CTA_PROTO_DST_PORT, port);
  mnl_attr_nest_end(nlh, proto);
  mnl_attr_nest_end(nlh, tuple);
  if (replySource != nullptr) {
    nlattr* reply = mnl_attr_nest_start(nlh, CTA_TUPLE_REPLY);
    nlattr* ip = mnl_attr_nest_start(nlh, CTA_TUPLE_IP);
    mnl_attr_put(nlh, CTA_IP_V4_SRC, 4, replySource);
    mnl_attr_nest_end(nlh, ip);
    mnl_attr_nest_end(nlh, reply);
  }
  nlattr* flags = mnl_attr_nest_start(nlh, CTA_FILTER);
  const uint32_t orig = (address != nullptr ? FILTER_IP_DST : 0) | FILTER_PROTO_NUM | FILTER_PROTO_DST_PORT;
  mnl_attr_put_u32(nlh, CTA_FILTER_ORIG_FLAGS, orig);
  mnl_attr_put_u32(nlh, CTA_FILTER_REPLY_FLAGS, replySource != nullptr ? FILTER_IP_SRC : 0);
  mnl_attr_nest_end(nlh, flags);
}

// One dump of the family's table into `state`: every entry, or (`filter`) only those of the
// group's protocol and destination port (and address, in IPv4, when it has one). A kernel without
// CTA_FILTER sends every entry; the lookup among the targets decides either way.
bool Dump(netlink::Socket& sock, int family, const Group* filter, DumpState& state, std::string& error) {
  // The header, the nfgenmsg, the tuple and the filter: about 100 bytes.
  alignas(nlmsghdr) char request[512];
  const uint32_t seq = sock.NextSeq();
  nlmsghdr* dump = PutHeader(request, IPCTNL_MSG_CT_GET, NLM_F_DUMP, family, seq);
  if (filter != nullptr) {
    const bool byAddress = family == AF_INET && filter->oneAddress;
    PutFilter(dump, byAddress ? filter->address : nullptr, filter->protocol, filter->port, nullptr);
  }
  if (!sock.Send(dump, dump->nlmsg_len)) return error = Errno("asking conntrack for its entries"), false;
  ++state.dumps;
  const netlink::Received received = sock.Receive(seq, seq, netlink::Limits(), [&](const netlink::Message& m) {
    using Type = netlink::Message::Type;
    if ((m.header->nlmsg_flags & NLM_F_DUMP_INTR) != 0) {
      error = std::string("reading conntrack's entries: ") + std::strerror(EINTR);
      return netlink::Next::kStop;
    }
    if (m.type == Type::kError) error = std::string("reading conntrack's entries: ") + std::strerror(m.error);
    // The end of the dump (an ack ends it too, as libmnl's mnl_cb_run has it).
    if (m.type != Type::kData) return netlink::Next::kStop;
    if (m.header->nlmsg_type < NLMSG_MIN_TYPE) return netlink::Next::kMore;
    return OnEntry(m.header, &state) ? netlink::Next::kMore : netlink::Next::kStop;
  });
  if (state.tooMany) {
    error = "conntrack holds more than " + std::to_string(MAX_DUMPED) + " entries: not read further";
    return false;
  }
  if (!received.ok()) {
    error = ReceiveFailure("reading conntrack's entries", received);
    return false;
  }
  return error.empty();
}

// Deletes in the kernel every IPv4 entry whose original destination is the target's (address,
// protocol, port) and, untranslated only, whose reply comes from that address: one
// IPCTNL_MSG_CT_DELETE carrying CTA_FILTER and no source. Linux 6.12 and later delete by the
// filter: the kernel walks its table itself, preemptibly, taking a bucket's lock only where the
// bucket holds entries (0.3-0.6 ms for 262,144 buckets on 6.18, where a dump takes 10-14 ms with
// softirqs off from its first bucket to its last). Before 6.12 the same message is a deletion of
// one whole tuple, which the kernel refuses (no source address: EINVAL): never a flush of more
// than the filter, on any kernel. IPv6 is never asked: its address filter is not to be trusted
// (see FILTERED_DUMPS_UP_TO). 0 when the kernel acknowledged it, else its errno; -1 (`error`
// set) when the socket failed.
int Flush(netlink::Socket& sock, const Target& t, bool untranslatedOnly, std::string& error) {
  alignas(nlmsghdr) char request[512];
  const uint32_t seq = sock.NextSeq();
  nlmsghdr* nlh = PutHeader(request, IPCTNL_MSG_CT_DELETE, NLM_F_ACK, AF_INET, seq);
  PutFilter(nlh, t.address, t.protocol, t.port, untranslatedOnly ? t.address : nullptr);
  if (!sock.Send(nlh, nlh->nlmsg_len)) return error = Errno("deleting conntrack entries by a filter"), -1;
  int answer = 0;
  const netlink::Received received = sock.Receive(seq, seq, netlink::Limits(), [&](const netlink::Message& m) {
    using Type = netlink::Message::Type;
    if (m.type == Type::kError) answer = m.error;
    return m.type == Type::kAck || m.type == Type::kError ? netlink::Next::kStop : netlink::Next::kMore;
  });
  if (!received.ok()) {
    error = ReceiveFailure("deleting conntrack entries by a filter", received);
    return -1;
  }
  return answer;
}

// The call's targets deleted by filter, when the kernel does that and the call is one for it
// (IPv4, FLUSHES_UP_TO targets at most, not turned off): true when they all went so; false for
// the dumps to do it (nothing deleted yet) or with `result.error` set.
bool FlushAll(netlink::Socket& sock, int family, const std::vector<Target>& targets, const DumpState& state,
              const Limits& limits, Result& result) {
  if (family != AF_INET || !limits.flush || state.states.size() > FLUSHES_UP_TO || flushSupport.load() < 0) {
    return false;
  }
  for (const TargetState& s : state.states) {
    const int answer = Flush(sock, targets[s.firstLine], s.untranslatedOnly, result.error);
    if (answer < 0) return false;
    if (answer == 0) {
      flushSupport.store(1);
      ++result.flushes;
      continue;
    }
    // Refused by a kernel that did so before: a failure. Refused by the first: it does not (so
    // nothing was deleted yet: the first answer decides), and the dumps do it from now on.
    if (flushSupport.load() == 1) {
      result.error = std::string("deleting conntrack entries by a filter: ") + std::strerror(answer);
      return false;
    }
    flushSupport.store(-1);
    result.flushRefused = std::strerror(answer);
    return false;
  }
  return true;
}

}  // namespace

Result DeleteMatching(int family, const std::vector<Target>& targets, int timeoutMs, const Limits& limits) {
  Result result;
  const double started = netlink::NowMs();
  DumpState state;
  state.family = family;
  state.addressLength = family == AF_INET ? 4 : 16;
  for (size_t line = 0; line < targets.size(); ++line) {
    const Target& t = targets[line];
    auto [at, inserted] =
        state.targets.emplace(TargetKey(t.protocol, t.address, state.addressLength, t.port), state.states.size());
    if (inserted) {
      TargetState s;
      s.firstLine = line;
      s.untranslatedOnly = t.untranslatedOnly;
      state.states.push_back(s);
    } else {
      TargetState& s = state.states[at->second];
      s.untranslatedOnly = s.untranslatedOnly && t.untranslatedOnly;
    }
  }
  // Each target's own share of the call's entries: one target's flows never use another's.
  const size_t distinct = state.states.empty() ? 1 : state.states.size();
  state.share = std::max<size_t>(1, std::min(limits.perTarget, limits.total / distinct));
  result.share = state.share;
  netlink::Socket sock;
  if (!sock.Open(timeoutMs, DATAGRAM_BYTES, result.error)) return result;
  sock.GrowReceiveBuffer(RECEIVE_BUFFER_BYTES, false);
  const bool flushed = FlushAll(sock, family, targets, state, limits, result);
  result.refusesFlush = flushSupport.load() < 0;
  if (flushed) {
    result.ms = netlink::NowMs() - started;
    return result;
  }
  if (!result.error.empty()) return result;

  // The groups, in the order of their first target; a key asked twice counts once.
  std::vector<Group> groups;
  std::unordered_map<uint32_t, size_t> groupOf;
  for (const TargetState& s : state.states) {
    const Target& t = targets[s.firstLine];
    auto [at, inserted] = groupOf.emplace((uint32_t{t.protocol} << 16) | t.port, groups.size());
    if (inserted) {
      Group g;
      g.protocol = t.protocol;
      g.port = t.port;
      g.address = t.address;
      groups.push_back(g);
    } else if (std::memcmp(groups[at->second].address, t.address, state.addressLength) != 0) {
      groups[at->second].oneAddress = false;
    }
  }
  if (groups.size() <= FILTERED_DUMPS_UP_TO) {
    for (const Group& g : groups) {
      state.only = &g;
      if (!Dump(sock, family, &g, state, result.error)) return result;
    }
    state.only = nullptr;
  } else if (!Dump(sock, family, nullptr, state, result.error)) {
    return result;
  }
  result.dumped = state.dumped;
  result.dumps = state.dumps;
  for (const TargetState& t : state.states) {
    result.matched += t.matched;
    if (t.matched > t.kept) result.truncated.push_back(Truncated{t.firstLine, t.matched, t.kept});
  }

  // Deletions, MESSAGES_PER_SEND at a time, each acknowledged.
  size_t next = 0;
  while (next < state.keptEnds.size()) {
    std::vector<char> batch;
    batch.reserve(MESSAGES_PER_SEND * 128);
    uint32_t first = 0;
    size_t messages = 0;
    while (next < state.keptEnds.size() && messages < MESSAGES_PER_SEND) {
      const size_t from = next == 0 ? 0 : state.keptEnds[next - 1];
      const size_t length = state.keptEnds[next++] - from;
      const size_t at = batch.size();
      batch.resize(at + MNL_ALIGN(sizeof(nlmsghdr)) + MNL_ALIGN(sizeof(nfgenmsg)) + length);
      const uint32_t seq = sock.NextSeq();
      if (messages == 0) first = seq;
      nlmsghdr* nlh = PutHeader(batch.data() + at, IPCTNL_MSG_CT_DELETE, NLM_F_ACK, family, seq);
      std::memcpy(static_cast<char*>(mnl_nlmsg_get_payload_tail(nlh)), state.kept.data() + from, length);
      nlh->nlmsg_len += static_cast<uint32_t>(length);
      ++messages;
    }
    if (!sock.Send(batch.data(), batch.size())) {
      result.error = Errno("deleting conntrack entries");
      return result;
    }
    size_t acked = 0;
    const netlink::Received received =
        sock.Receive(first, sock.LastSeq(), netlink::Limits(), [&](const netlink::Message& m) {
          using Type = netlink::Message::Type;
          if (m.type == Type::kAck) {
            ++result.deleted;
          } else if (m.type == Type::kError) {
            // ENOENT: the entry went meanwhile.
            if (m.error != ENOENT && result.error.empty()) {
              result.error = std::string("deleting a conntrack entry: ") + std::strerror(m.error);
            }
          } else {
            return netlink::Next::kMore;
          }
          return ++acked < messages ? netlink::Next::kMore : netlink::Next::kStop;
        });
    if (!received.ok()) {
      result.error = ReceiveFailure("deleting conntrack entries", received);
      return result;
    }
  }
  result.ms = netlink::NowMs() - started;
  return result;
}

bool ParseTargets(const std::string& text, int family, std::vector<Target>& out, std::string& error) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty()) continue;
    if (out.size() >= MAX_TARGETS) return error = "too many targets", false;
    std::istringstream fields(line);
    unsigned protocol = 0, port = 0, untranslated = 0;
    std::string address;
    if (!(fields >> protocol >> address >> port >> untranslated) || protocol > 255 || port > 65535 ||
        untranslated > 1) {
      return error = "not a target: '" + line + "'", false;
    }
    Target t;
    t.protocol = static_cast<uint8_t>(protocol);
    t.port = htons(static_cast<uint16_t>(port));
    t.untranslatedOnly = untranslated == 1;
    if (inet_pton(family, address.c_str(), t.address) != 1) return error = "not an address: '" + address + "'", false;
    out.push_back(t);
  }
  return true;
}

}  // namespace conntrack
