// The one netfilter netlink socket of the addons (netlink_socket.h): set up the same way for the
// element batches and dumps, the ruleset generation and the conntrack deletions, and one receive
// loop for all their answers.
//
// Set-up: SOCK_CLOEXEC (a command the controller runs meanwhile gets no copy); bound at once, so
// the port is ours before the first request; NETLINK_CAP_ACK, so that an ack or an error carries
// only the header of the message it answers, never the message (up to 64 KiB each); NETLINK_EXT_ACK,
// so that an error carries the kernel's message when it has one; SO_RCVTIMEO, so that no read waits
// for an answer that will not come longer than its owner allows. CAP_ACK and EXT_ACK are best
// effort (a kernel without them answers as before they came); a receive timeout that does not
// take fails the open.
//
// The receive loop reads one datagram at a time into the socket's buffer, passes over the
// datagrams not sent by the kernel (port 0) and the messages of other sequence numbers, and
// hands each other message on, its type decoded: an ack, an error with its errno and extended
// message, the end of a dump with its status, or data. Every read is bounded: a receive timeout
// each, at most so many datagrams and bytes, and a datagram cut short or holding no whole message
// ends it, as does a failed recvmsg; the socket is then closed (it is out of step).

#include "netlink_socket.h"

#include <linux/netlink.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace netlink {

double NowMs() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

namespace {

std::string Failed(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

// NLMSGERR_ATTR_MSG of an error message that NLMSG_OK accepted and that holds a whole nlmsgerr.
std::string ExtendedAckMessage(const nlmsghdr* h) {
  if ((h->nlmsg_flags & NLM_F_ACK_TLVS) == 0) return std::string();
  const auto* answer = static_cast<const nlmsgerr*>(NLMSG_DATA(h));
  // The attributes follow the error and the message it echoes: its header only when capped.
  size_t echoed = sizeof(nlmsgerr);
  if ((h->nlmsg_flags & NLM_F_CAPPED) == 0 && answer->msg.nlmsg_len > NLMSG_HDRLEN) {
    echoed += answer->msg.nlmsg_len - NLMSG_HDRLEN;
  }
  const size_t offset = NLMSG_ALIGN(echoed);
  if (h->nlmsg_len < NLMSG_HDRLEN + offset) return std::string();
  const char* at = reinterpret_cast<const char*>(answer) + offset;
  int remaining = static_cast<int>(h->nlmsg_len - NLMSG_HDRLEN - offset);
  std::string message;
  while (remaining >= static_cast<int>(sizeof(nlattr))) {
    nlattr attribute;
    std::memcpy(&attribute, at, sizeof attribute);
    if (attribute.nla_len < sizeof(nlattr) || attribute.nla_len > remaining) break;
    // A string with its NUL, as the kernel puts it.
    if ((attribute.nla_type & NLA_TYPE_MASK) == NLMSGERR_ATTR_MSG && attribute.nla_len > NLA_HDRLEN &&
        at[attribute.nla_len - 1] == '\0') {
      message = at + NLA_HDRLEN;
    }
    const int step = static_cast<int>(NLA_ALIGN(attribute.nla_len));
    at += step;
    remaining -= step;
  }
  return message;
}

}  // namespace

std::string Received::Why() const {
  switch (end) {
    case End::kStopped: return "no failure";
    case End::kSystem: return std::strerror(error);
    case End::kCutShort: return "a datagram was cut short";
    case End::kNotWhole: return "a datagram holds no whole message";
    case End::kTooManyDatagrams: return "the answer did not come (too many other datagrams)";
    case End::kTooManyBytes: return "the answer is longer than allowed (" + std::to_string(bytes) + " bytes read)";
  }
  return "unknown";
}

bool Socket::Open(int receiveTimeoutMs, size_t receiveBufferBytes, std::string& error) {
  if (fd_ >= 0) return true;
  fd_ = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER);
  if (fd_ < 0) {
    error = Failed("cannot open a netfilter netlink socket");
    return false;
  }
  sockaddr_nl local{};
  local.nl_family = AF_NETLINK;
  if (bind(fd_, reinterpret_cast<sockaddr*>(&local), sizeof local) < 0) {
    error = Failed("cannot bind a netfilter netlink socket");
    Close();
    return false;
  }
  const int on = 1;
  setsockopt(fd_, SOL_NETLINK, NETLINK_CAP_ACK, &on, sizeof on);
  setsockopt(fd_, SOL_NETLINK, NETLINK_EXT_ACK, &on, sizeof on);
  timeval timeout{receiveTimeoutMs / 1000, (receiveTimeoutMs % 1000) * 1000};
  if (setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout) < 0) {
    error = Failed("cannot set the receive timeout of a netfilter netlink socket");
    Close();
    return false;
  }
  if (seq_ == 0) seq_ = static_cast<uint32_t>(time(nullptr));
  buffer_.resize(receiveBufferBytes);
  return true;
}

void Socket::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
  sendBuffer_ = 0;
  receiveBuffer_ = 0;
}

bool Socket::GrowSendBuffer(int bytes) {
  if (bytes <= sendBuffer_) return true;
  if (setsockopt(fd_, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof bytes) < 0 &&
      setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof bytes) < 0) {
    return false;
  }
  sendBuffer_ = bytes;
  return true;
}

void Socket::GrowReceiveBuffer(int bytes, bool force) {
  if (bytes <= receiveBuffer_) return;
  if (!force || setsockopt(fd_, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof bytes) < 0) {
    setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof bytes);
  }
  receiveBuffer_ = bytes;
}

bool Socket::Send(const void* data, size_t length) {
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  if (sendto(fd_, data, length, 0, reinterpret_cast<sockaddr*>(&kernel), sizeof kernel) >= 0) return true;
  const int error = errno;
  Close();
  errno = error;
  return false;
}

Received Socket::ReceiveLoop(uint32_t firstSeq, uint32_t lastSeq, const Limits& limits, Callback callback,
                             void* each) {
  Received received;
  auto end = [&](Received::End why, int error) {
    received.end = why;
    received.error = error;
    Close();
    return received;
  };
  for (size_t datagram = 0;; ++datagram) {
    if (datagram >= limits.maxDatagrams) return end(Received::End::kTooManyDatagrams, 0);
    sockaddr_nl sender{};
    iovec part{buffer_.data(), buffer_.size()};
    msghdr header{};
    header.msg_name = &sender;
    header.msg_namelen = sizeof sender;
    header.msg_iov = &part;
    header.msg_iovlen = 1;
    const ssize_t bytes = recvmsg(fd_, &header, 0);
    if (bytes < 0) return end(Received::End::kSystem, errno);
    // Cut to the buffer: what was lost may have been the answer.
    if ((header.msg_flags & MSG_TRUNC) != 0) return end(Received::End::kCutShort, 0);
    received.bytes += static_cast<size_t>(bytes);
    if (received.bytes > limits.maxBytes) return end(Received::End::kTooManyBytes, 0);
    // Only the kernel (port 0) answers; a datagram from another socket is passed over.
    if (header.msg_namelen != sizeof sender || sender.nl_family != AF_NETLINK || sender.nl_pid != 0) continue;
    // Signed, as NLMSG_OK and NLMSG_NEXT expect (netlink(7)): NLMSG_NEXT may take it below zero
    // after a last message whose length is not aligned, and NLMSG_OK then stops.
    int left = static_cast<int>(bytes);
    for (auto* h = reinterpret_cast<nlmsghdr*>(buffer_.data()); NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
      if (h->nlmsg_seq < firstSeq || h->nlmsg_seq > lastSeq) continue;  // a late answer to an earlier request
      Message message;
      message.header = h;
      if (h->nlmsg_type == NLMSG_ERROR) {
        if (h->nlmsg_len < NLMSG_LENGTH(sizeof(nlmsgerr))) return end(Received::End::kNotWhole, 0);
        const int code = static_cast<const nlmsgerr*>(NLMSG_DATA(h))->error;
        message.error = code < 0 ? -code : code;
        message.type = message.error == 0 ? Message::Type::kAck : Message::Type::kError;
        if (message.error != 0) message.kernelMessage = ExtendedAckMessage(h);
      } else if (h->nlmsg_type == NLMSG_DONE) {
        message.type = Message::Type::kDone;
        int status = 0;
        if (h->nlmsg_len >= NLMSG_LENGTH(sizeof status)) std::memcpy(&status, NLMSG_DATA(h), sizeof status);
        message.error = status < 0 ? -status : 0;
      }
      if (callback(message, each) == Next::kStop) return received;
    }
    // Bytes left that make no whole message (a header cut short, or a length beyond what was
    // received): the datagram is not what the kernel sends.
    if (left > 0) return end(Received::End::kNotWhole, 0);
  }
}

}  // namespace netlink
