// Map element writes as one nf_tables netlink batch: BATCH_BEGIN, the DELSETELEM messages of the
// removals, the NEWSETELEM messages of the additions, BATCH_END, sent in one sendmsg. nfnetlink
// runs the whole batch as one transaction inside that sendmsg (all or nothing), then queues one
// ack per message on our socket. The messages are what `nft add element` sends for the same
// elements (libnftables builds them with libnftnl the same way): the key as the concatenation's
// fields each padded to 4 bytes, the data, the comment as element user data. So a listing by nft
// shows them as it shows the JSON path's, and the two paths are interchangeable.
//
// A whole write sends the difference between what the map holds (read by nft_element_dump.cc)
// and what it must hold, with the generation it was read at in BATCH_BEGIN (NFNL_BATCH_GENID):
// the kernel refuses the batch (ERESTART) if anything was committed since, so the difference is
// never applied to a map it was not computed from.
//
// What it saves against the JSON path, per element: the JSON text, jansson's parse into a tree,
// libnftables' expressions and their evaluation; the parse alone held about 4.4 KiB per element.
//
// Every read is bounded: one ack per message is expected, at most that many datagrams (and a
// few late ones) are read, each with a receive timeout, and a datagram that is cut short or not
// from the kernel ends the read.

#include "nft_element_batch.h"

#include <libmnl/libmnl.h>
#include <libnftnl/common.h>
#include <libnftnl/udata.h>

#include <arpa/inet.h>
#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace nft_batch {

namespace {

// The elements nest of one message carries a 16-bit length: a message is closed before its
// nest reaches this, and a new one opened.
constexpr size_t kMaxNestBytes = 60000;
// The most bytes one element takes in a message: a 24-byte key and 16-byte data with their
// attribute headers and nests, and 2 + 129 bytes of comment, rounded up.
constexpr size_t kMaxElementBytes = 256;
constexpr size_t kMaxMessageBytes = kMaxNestBytes + kMaxElementBytes + 512;
// Late datagrams (answers to a write whose read failed) read beyond the expected acks.
constexpr size_t kExtraDatagrams = 64;
// The kernel has answered when sendmsg returns; the timeout only bounds a socket out of step.
constexpr int kReceiveTimeoutMs = 5000;
// 8192 bytes, as netlink(7) advises; acks are 36 bytes, errors with a message a little more.
constexpr size_t kDatagramBytes = 8192;

struct ParsedElement {
  uint8_t key[24] = {};
  uint8_t data[16] = {};
  const char* comment = nullptr;
  size_t commentLength = 0;
};

// One field, ended by a space or the end of the line.
bool NextField(const char*& at, const char* end, const char*& field, size_t& length) {
  field = at;
  while (at < end && *at != ' ') ++at;
  length = static_cast<size_t>(at - field);
  if (at < end) ++at;  // the space
  return length > 0;
}

bool ParseAddress(int af, const char* field, size_t length, uint8_t* out) {
  char text[INET6_ADDRSTRLEN];
  if (length >= sizeof text) return false;
  std::memcpy(text, field, length);
  text[length] = '\0';
  return inet_pton(af, text, out) == 1;
}

bool ParseNumber(const char* field, size_t length, unsigned long max, unsigned long& value) {
  if (length == 0 || length > 5) return false;
  value = 0;
  for (size_t i = 0; i < length; ++i) {
    if (field[i] < '0' || field[i] > '9') return false;
    value = value * 10 + static_cast<unsigned long>(field[i] - '0');
  }
  return value <= max;
}

bool ParseProtocol(const char* field, size_t length, uint8_t& protocol) {
  auto is = [&](const char* name) { return std::strlen(name) == length && std::memcmp(field, name, length) == 0; };
  if (is("tcp")) protocol = IPPROTO_TCP;
  else if (is("udp")) protocol = IPPROTO_UDP;
  else if (is("sctp")) protocol = IPPROTO_SCTP;
  else {
    unsigned long number;
    if (!ParseNumber(field, length, 255, number)) return false;
    protocol = static_cast<uint8_t>(number);
  }
  return true;
}

// One line: `address protocol port` (withData false) or `address protocol port value[ comment]`.
// The key is laid out as nft lays out a concatenation: each field in a 4-byte register.
bool ParseElement(int af, const char* line, const char* end, bool withData, ParsedElement& e, std::string& error) {
  const size_t addressBytes = af == AF_INET ? 4 : 16;
  const char* at = line;
  const char* field;
  size_t length;
  uint8_t protocol;
  unsigned long port;
  if (!NextField(at, end, field, length) || !ParseAddress(af, field, length, e.key)) {
    error = "bad address '" + std::string(field, length) + "'";
    return false;
  }
  if (!NextField(at, end, field, length) || !ParseProtocol(field, length, protocol)) {
    error = "bad protocol '" + std::string(field, length) + "'";
    return false;
  }
  e.key[addressBytes] = protocol;
  if (!NextField(at, end, field, length) || !ParseNumber(field, length, 65535, port)) {
    error = "bad port '" + std::string(field, length) + "'";
    return false;
  }
  const uint16_t networkPort = htons(static_cast<uint16_t>(port));
  std::memcpy(e.key + addressBytes + 4, &networkPort, sizeof networkPort);
  if (!withData) {
    if (at != end) {
      error = "a removal or a key names only address, protocol and port";
      return false;
    }
    return true;
  }
  if (!NextField(at, end, field, length) || !ParseAddress(af, field, length, e.data)) {
    error = "bad value '" + std::string(field, length) + "'";
    return false;
  }
  if (at < end) {
    e.comment = at;
    e.commentLength = static_cast<size_t>(end - at);
    // nft refuses longer comments ("comment too long").
    if (e.commentLength > NFTNL_UDATA_COMMENT_MAXLEN) {
      error = "comment longer than " + std::to_string(NFTNL_UDATA_COMMENT_MAXLEN) + " bytes";
      return false;
    }
    if (std::memchr(e.comment, '\0', e.commentLength) != nullptr) {
      error = "comment holds a NUL byte";
      return false;
    }
  } else if (at > line && at[-1] == ' ') {
    // A line ending in a space would be an empty comment, which the JSON path writes otherwise.
    error = "empty comment";
    return false;
  }
  return true;
}

void PutData(nlmsghdr* nlh, uint16_t type, const void* bytes, size_t length) {
  nlattr* nest = mnl_attr_nest_start(nlh, type);
  mnl_attr_put(nlh, NFTA_DATA_VALUE, length, bytes);
  mnl_attr_nest_end(nlh, nest);
}

}  // namespace

// The batch goes in one datagram, which must fit the socket's send buffer; the acks must fit its
// receive buffer (an ack that does not is dropped, and the write could not be told apart from a
// lost one). The *FORCE options pass the system's limits; they need CAP_NET_ADMIN, which a
// process that programs nf_tables has.
bool ElementBatchWriter::EnsureBuffers(size_t sendBytes, size_t acks, std::string& error) {
  const size_t wantSend = sendBytes + 4096;
  if (wantSend > static_cast<size_t>(INT32_MAX / 2)) {
    error = "the batch is too large for one netlink message (" + std::to_string(sendBytes) + " bytes)";
    return false;
  }
  if (!socket_.GrowSendBuffer(static_cast<int>(wantSend))) {
    error = std::string("cannot size the netlink send buffer: ") + std::strerror(errno);
    return false;
  }
  // An ack takes about 1 KiB of buffer (the skb around its few bytes); 256 KiB at least.
  const size_t wantReceive = std::max<size_t>(256 << 10, acks * 2048);
  if (wantReceive <= static_cast<size_t>(INT32_MAX / 2)) socket_.GrowReceiveBuffer(static_cast<int>(wantReceive), true);
  return true;
}

ElementWriteResult ElementBatchWriter::Write(const ElementWrite& write) {
  ElementWriteResult result;
  const double started = netlink::NowMs();
  const int af = write.family == AF_INET6 ? AF_INET6 : AF_INET;
  if (write.family != AF_INET && write.family != AF_INET6) {
    result.error = "the family must be ip or ip6";
    return result;
  }
  const size_t addressBytes = af == AF_INET ? 4 : 16;
  const size_t keyBytes = addressBytes + 4 + 4;
  if (write.table.empty() || write.table.size() >= 256 || write.map.empty() || write.map.size() >= 256 ||
      write.keySet.size() >= 256) {
    result.error = "bad table, map or key set name";
    return result;
  }
  if (!socket_.Open(kReceiveTimeoutMs, kDatagramBytes, result.error)) return result;

  // Build: BATCH_BEGIN, the messages, BATCH_END, laid end to end in one buffer.
  size_t used = 0;
  auto reserve = [&](size_t bytes) {
    if (batch_.size() < used + bytes) batch_.resize(std::max(batch_.size() * 2, used + bytes));
  };
  const uint32_t beginSeq = socket_.NextSeq();
  reserve(NLMSG_ALIGN(sizeof(nlmsghdr) + sizeof(nfgenmsg)) + MNL_ATTR_HDRLEN + sizeof(uint32_t));
  nlmsghdr* begin = nftnl_batch_begin(batch_.data() + used, beginSeq);
  // The generation the lists were computed at: the kernel compares it with its own under the
  // commit lock and refuses the whole batch (ERESTART) when they differ. 0 would mean no check.
  if (write.generation > 0) {
    mnl_attr_put_u32(begin, NFNL_BATCH_GENID, htonl(static_cast<uint32_t>(write.generation)));
  }
  used += NLMSG_ALIGN(begin->nlmsg_len);
  const uint32_t firstSeq = socket_.LastSeq() + 1;
  const bool withKeySet = !write.keySet.empty();
  if (write.flush) {
    for (const std::string* set : {&write.map, withKeySet ? &write.keySet : nullptr}) {
      if (set == nullptr) continue;
      reserve(kMaxMessageBytes);
      nlmsghdr* flush =
          nftnl_nlmsg_build_hdr(batch_.data() + used, NFT_MSG_DELSETELEM, write.family, NLM_F_ACK, socket_.NextSeq());
      mnl_attr_put_strz(flush, NFTA_SET_ELEM_LIST_TABLE, write.table.c_str());
      mnl_attr_put_strz(flush, NFTA_SET_ELEM_LIST_SET, set->c_str());
      used += NLMSG_ALIGN(flush->nlmsg_len);
      ++result.messages;
    }
  }
  // Each list is one or more messages of one type; removals first, so that an element removed
  // and added back in one write ends up added. With a key set, each list is written to it too
  // (keys only).
  // The key set gets the map's lists, or lists of its own (keySetOwnLists).
  struct Part {
    const std::string* text;
    bool add;
    const std::string* set;
    bool keysOnly;
    size_t* count;
  };
  const std::string& keysRemoved = write.keySetOwnLists ? write.keySetRemoved : write.removed;
  const std::string& keysAdded = write.keySetOwnLists ? write.keySetAdded : write.added;
  Part parts[4];
  size_t partCount = 0;
  parts[partCount++] = {&write.removed, false, &write.map, false, &result.removed};
  if (withKeySet) parts[partCount++] = {&keysRemoved, false, &write.keySet, true, &result.keysRemoved};
  parts[partCount++] = {&write.added, true, &write.map, false, &result.added};
  if (withKeySet) parts[partCount++] = {&keysAdded, true, &write.keySet, true, &result.keysAdded};
  uint32_t removalsLastSeq = 0;
  for (size_t p = 0; p < partCount; ++p) {
    const Part& part = parts[p];
    size_t line = 0;
    const char* at = part.text->data();
    const char* end = at + part.text->size();
    nlmsghdr* nlh = nullptr;
    nlattr* list = nullptr;
    auto closeMessage = [&] {
      if (nlh == nullptr) return;
      mnl_attr_nest_end(nlh, list);
      used += NLMSG_ALIGN(nlh->nlmsg_len);
      nlh = nullptr;
      ++result.messages;
    };
    while (at < end) {
      const char* lineEnd = static_cast<const char*>(std::memchr(at, '\n', static_cast<size_t>(end - at)));
      if (lineEnd == nullptr) lineEnd = end;
      ++line;
      ParsedElement e;
      std::string why;
      // Lines with values: the map's additions, which are also the key set's unless it has its own.
      const bool withData = part.add && !(part.keysOnly && write.keySetOwnLists);
      if (!ParseElement(af, at, lineEnd, withData, e, why)) {
        result.error = "map element " + std::to_string(line) + ": " + why;
        return result;
      }
      at = lineEnd < end ? lineEnd + 1 : end;
      if (nlh != nullptr) {
        const auto nestBytes = static_cast<size_t>(static_cast<char*>(mnl_nlmsg_get_payload_tail(nlh)) -
                                                   reinterpret_cast<char*>(list));
        if (nestBytes + kMaxElementBytes > kMaxNestBytes) closeMessage();
      }
      if (nlh == nullptr) {
        // Grown only between messages: the open message points into the buffer.
        reserve(kMaxMessageBytes);
        nlh = nftnl_nlmsg_build_hdr(batch_.data() + used, part.add ? NFT_MSG_NEWSETELEM : NFT_MSG_DELSETELEM,
                                    write.family, part.add ? (NLM_F_CREATE | NLM_F_ACK) : NLM_F_ACK, socket_.NextSeq());
        mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_TABLE, write.table.c_str());
        mnl_attr_put_strz(nlh, NFTA_SET_ELEM_LIST_SET, part.set->c_str());
        list = mnl_attr_nest_start(nlh, NFTA_SET_ELEM_LIST_ELEMENTS);
      }
      nlattr* element = mnl_attr_nest_start(nlh, NFTA_LIST_ELEM);
      PutData(nlh, NFTA_SET_ELEM_KEY, e.key, keyBytes);
      if (part.add && !part.keysOnly) {
        PutData(nlh, NFTA_SET_ELEM_DATA, e.data, addressBytes);
        if (e.comment != nullptr) {
          // libnftnl's user data layout (nftnl_udata_put_strz): type, length, the text and its NUL.
          uint8_t userData[2 + NFTNL_UDATA_COMMENT_MAXLEN + 1];
          userData[0] = NFTNL_UDATA_SET_ELEM_COMMENT;
          userData[1] = static_cast<uint8_t>(e.commentLength + 1);
          std::memcpy(userData + 2, e.comment, e.commentLength);
          userData[2 + e.commentLength] = '\0';
          mnl_attr_put(nlh, NFTA_SET_ELEM_USERDATA, 2 + e.commentLength + 1, userData);
        }
      }
      mnl_attr_nest_end(nlh, element);
      ++*part.count;
    }
    closeMessage();
    if (!part.add) removalsLastSeq = socket_.LastSeq();
  }
  const uint32_t lastSeq = socket_.LastSeq();
  reserve(NLMSG_ALIGN(sizeof(nlmsghdr) + sizeof(nfgenmsg)));
  used += NLMSG_ALIGN(nftnl_batch_end(batch_.data() + used, socket_.NextSeq())->nlmsg_len);
  result.bytes = used;
  result.buildMs = netlink::NowMs() - started;
  if (result.messages == 0) {
    result.ok = true;
    return result;
  }

  // Send, then read one ack per message (and the batch's own error, when it is refused whole).
  const double sent = netlink::NowMs();
  if (!EnsureBuffers(used, result.messages, result.error)) return result;
  if (!socket_.Send(batch_.data(), used)) {
    result.error = std::string("cannot send the batch to the kernel: ") + std::strerror(errno);
    return result;
  }
  size_t acked = 0;
  int firstError = 0;
  uint32_t errorSeq = 0;
  std::string kernelMessage;
  netlink::Limits limits;
  limits.maxDatagrams = result.messages + kExtraDatagrams;
  const netlink::Received received = socket_.Receive(beginSeq, lastSeq, limits, [&](const netlink::Message& m) {
    using Type = netlink::Message::Type;
    if (m.type != Type::kAck && m.type != Type::kError) return netlink::Next::kMore;
    const bool isBatch = m.header->nlmsg_seq == beginSeq;
    if (!isBatch) ++acked;
    if (m.type == Type::kError && firstError == 0) {
      firstError = m.error;
      errorSeq = m.header->nlmsg_seq;
      kernelMessage = m.kernelMessage;
    }
    // The batch refused as a whole: no per-message acks follow.
    const bool refused = isBatch && m.type == Type::kError;
    return refused || acked >= result.messages ? netlink::Next::kStop : netlink::Next::kMore;
  });
  if (!received.ok()) {
    result.error = received.end == netlink::Received::End::kTooManyDatagrams
                       ? "the kernel's answer to the batch did not come (too many other datagrams)"
                       : "reading the kernel's answer to the batch: " + received.Why();
    return result;
  }
  result.kernelMs = netlink::NowMs() - sent;
  if (firstError != 0 && errorSeq == beginSeq && firstError == ERESTART && write.generation > 0) {
    result.generationChanged = true;
    result.error = "the ruleset changed since generation " + std::to_string(write.generation) +
                   " (another commit): the changes to " + write.map + " were not applied";
    return result;
  }
  if (firstError != 0) {
    std::string what = errorSeq == beginSeq                        ? "Could not process the batch for "
                       : errorSeq >= firstSeq && errorSeq <= removalsLastSeq ? "Could not delete elements of map "
                                                                             : "Could not add elements to map ";
    result.error = what + std::string(af == AF_INET ? "ip " : "ip6 ") + write.table + " " + write.map + ": " +
                   std::strerror(firstError);
    if (!kernelMessage.empty()) result.error += " (" + kernelMessage + ")";
    // The kernel's ENFILE: more elements than the map's declared size.
    if (firstError == ENFILE) result.error += " (the map is full: it holds as many elements as its size)";
    return result;
  }
  result.ok = true;
  return result;
}

}  // namespace nft_batch
