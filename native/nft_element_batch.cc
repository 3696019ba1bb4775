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
#include <time.h>
#include <unistd.h>

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

double NowMs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

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

ElementBatchWriter::~ElementBatchWriter() { Close(); }

void ElementBatchWriter::Close() {
  if (socket_ != nullptr) mnl_socket_close(socket_);
  socket_ = nullptr;
  sendBuffer_ = 0;
  receiveBuffer_ = 0;
}

bool ElementBatchWriter::Open(std::string& error) {
  if (socket_ != nullptr) return true;
  socket_ = mnl_socket_open2(NETLINK_NETFILTER, SOCK_CLOEXEC);
  if (socket_ == nullptr) {
    error = std::string("cannot open a netfilter netlink socket: ") + std::strerror(errno);
    return false;
  }
  if (mnl_socket_bind(socket_, 0, MNL_SOCKET_AUTOPID) < 0) {
    error = std::string("cannot bind a netfilter netlink socket: ") + std::strerror(errno);
    Close();
    return false;
  }
  const int fd = mnl_socket_get_fd(socket_);
  // Acks carry only the header of the message they answer, not the message (up to 64 KiB each);
  // errors carry the kernel's extended message when it has one.
  const int on = 1;
  setsockopt(fd, SOL_NETLINK, NETLINK_CAP_ACK, &on, sizeof on);
  setsockopt(fd, SOL_NETLINK, NETLINK_EXT_ACK, &on, sizeof on);
  // The kernel has answered when sendmsg returns; the timeout only bounds a socket out of step.
  timeval timeout{5, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  if (seq_ == 0) seq_ = static_cast<uint32_t>(time(nullptr));
  return true;
}

// The batch goes in one datagram, which must fit the socket's send buffer; the acks must fit its
// receive buffer (an ack that does not is dropped, and the write could not be told apart from a
// lost one). The *FORCE options pass the system's limits; they need CAP_NET_ADMIN, which a
// process that programs nf_tables has.
bool ElementBatchWriter::EnsureBuffers(size_t sendBytes, size_t acks, std::string& error) {
  const int fd = mnl_socket_get_fd(socket_);
  const size_t wantSend = sendBytes + 4096;
  if (wantSend > static_cast<size_t>(sendBuffer_)) {
    if (wantSend > static_cast<size_t>(INT32_MAX / 2)) {
      error = "the batch is too large for one netlink message (" + std::to_string(sendBytes) + " bytes)";
      return false;
    }
    const int value = static_cast<int>(wantSend);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &value, sizeof value) < 0 &&
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, sizeof value) < 0) {
      error = std::string("cannot size the netlink send buffer: ") + std::strerror(errno);
      return false;
    }
    sendBuffer_ = value;
  }
  // An ack takes about 1 KiB of buffer (the skb around its few bytes); 256 KiB at least.
  const size_t wantReceive = std::max<size_t>(256 << 10, acks * 2048);
  if (wantReceive > static_cast<size_t>(receiveBuffer_) && wantReceive <= static_cast<size_t>(INT32_MAX / 2)) {
    const int value = static_cast<int>(wantReceive);
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &value, sizeof value) < 0) {
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &value, sizeof value);
    }
    receiveBuffer_ = value;
  }
  return true;
}

ElementWriteResult ElementBatchWriter::Write(const ElementWrite& write) {
  ElementWriteResult result;
  const double started = NowMs();
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
  if (!Open(result.error)) return result;

  // Build: BATCH_BEGIN, the messages, BATCH_END, laid end to end in one buffer.
  size_t used = 0;
  auto reserve = [&](size_t bytes) {
    if (batch_.size() < used + bytes) batch_.resize(std::max(batch_.size() * 2, used + bytes));
  };
  const uint32_t beginSeq = ++seq_;
  reserve(NLMSG_ALIGN(sizeof(nlmsghdr) + sizeof(nfgenmsg)) + MNL_ATTR_HDRLEN + sizeof(uint32_t));
  nlmsghdr* begin = nftnl_batch_begin(batch_.data() + used, beginSeq);
  // The generation the lists were computed at: the kernel compares it with its own under the
  // commit lock and refuses the whole batch (ERESTART) when they differ. 0 would mean no check.
  if (write.generation > 0) {
    mnl_attr_put_u32(begin, NFNL_BATCH_GENID, htonl(static_cast<uint32_t>(write.generation)));
  }
  used += NLMSG_ALIGN(begin->nlmsg_len);
  const uint32_t firstSeq = seq_ + 1;
  const bool withKeySet = !write.keySet.empty();
  if (write.flush) {
    for (const std::string* set : {&write.map, withKeySet ? &write.keySet : nullptr}) {
      if (set == nullptr) continue;
      reserve(kMaxMessageBytes);
      nlmsghdr* flush =
          nftnl_nlmsg_build_hdr(batch_.data() + used, NFT_MSG_DELSETELEM, write.family, NLM_F_ACK, ++seq_);
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
                                    write.family, part.add ? (NLM_F_CREATE | NLM_F_ACK) : NLM_F_ACK, ++seq_);
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
    if (!part.add) removalsLastSeq = seq_;
  }
  const uint32_t lastSeq = seq_;
  reserve(NLMSG_ALIGN(sizeof(nlmsghdr) + sizeof(nfgenmsg)));
  used += NLMSG_ALIGN(nftnl_batch_end(batch_.data() + used, ++seq_)->nlmsg_len);
  result.bytes = used;
  result.buildMs = NowMs() - started;
  if (result.messages == 0) {
    result.ok = true;
    return result;
  }

  // Send, then read one ack per message.
  const double sent = NowMs();
  if (!EnsureBuffers(used, result.messages, result.error)) return result;
  if (mnl_socket_sendto(socket_, batch_.data(), used) < 0) {
    result.error = std::string("cannot send the batch to the kernel: ") + std::strerror(errno);
    Close();
    return result;
  }
  const int fd = mnl_socket_get_fd(socket_);
  size_t acked = 0;
  int firstError = 0;
  uint32_t errorSeq = 0;
  std::string kernelMessage;
  bool refused = false;
  // 8192 bytes, as netlink(7) advises; acks are 36 bytes, errors with a message a little more.
  alignas(nlmsghdr) char buffer[8192];
  for (size_t datagram = 0; acked < result.messages && !refused; ++datagram) {
    if (datagram >= result.messages + kExtraDatagrams) {
      result.error = "the kernel's answer to the batch did not come (too many other datagrams)";
      Close();
      return result;
    }
    sockaddr_nl sender{};
    iovec part{buffer, sizeof buffer};
    msghdr message{};
    message.msg_name = &sender;
    message.msg_namelen = sizeof sender;
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    const ssize_t received = recvmsg(fd, &message, 0);
    if (received < 0 || (message.msg_flags & MSG_TRUNC) != 0) {
      result.error = std::string("reading the kernel's answer to the batch: ") +
                     (received < 0 ? std::strerror(errno) : "a datagram was cut short");
      Close();
      return result;
    }
    if (message.msg_namelen != sizeof sender || sender.nl_family != AF_NETLINK || sender.nl_pid != 0) continue;
    int left = static_cast<int>(received);
    for (nlmsghdr* h = reinterpret_cast<nlmsghdr*>(buffer); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_type != NLMSG_ERROR) continue;
      if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) continue;
      const auto* answer = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
      const bool isBatch = h->nlmsg_seq == beginSeq;
      const bool isOurs = h->nlmsg_seq >= firstSeq && h->nlmsg_seq <= lastSeq;
      if (!isBatch && !isOurs) continue;  // a late answer to an earlier write
      if (isOurs) ++acked;
      if (answer->error == 0) continue;
      if (firstError == 0) {
        firstError = -answer->error;
        errorSeq = h->nlmsg_seq;
        // Extended ack attributes follow the error and the header it echoes.
        if ((h->nlmsg_flags & NLM_F_ACK_TLVS) != 0) {
          const size_t offset = NLMSG_ALIGN(sizeof(nlmsgerr));
          const char* at = reinterpret_cast<const char*>(answer) + offset;
          int remaining = static_cast<int>(h->nlmsg_len) - static_cast<int>(NLMSG_HDRLEN + offset);
          while (remaining >= static_cast<int>(sizeof(nlattr))) {
            const auto* attr = reinterpret_cast<const nlattr*>(at);
            if (!mnl_attr_ok(attr, remaining)) break;
            if (mnl_attr_get_type(attr) == NLMSGERR_ATTR_MSG && mnl_attr_validate(attr, MNL_TYPE_NUL_STRING) == 0) {
              kernelMessage = mnl_attr_get_str(attr);
            }
            const int step = static_cast<int>(MNL_ALIGN(attr->nla_len));
            at += step;
            remaining -= step;
          }
        }
      }
      if (isBatch) refused = true;  // the batch as a whole: no per-message acks follow
    }
    if (left > 0) {
      result.error = "reading the kernel's answer to the batch: a datagram holds no whole message";
      Close();
      return result;
    }
  }
  result.kernelMs = NowMs() - sent;
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
