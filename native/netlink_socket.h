// The netfilter netlink plumbing every addon shares: one socket class that opens, binds and sets
// up the socket the same way for all (close-on-exec, capped acks, extended acks, a receive
// timeout), numbers the requests, sends them to the kernel and reads the kernel's answers in one
// bounded receive loop; and the monotonic clock the addons time their work with. libc only (no
// libmnl): the nftables addon reads the ruleset generation through it when it is built without
// libmnl. See netlink_socket.cc.

#ifndef IPVS_NODE_CONTROLLER_NETLINK_SOCKET_H_
#define IPVS_NODE_CONTROLLER_NETLINK_SOCKET_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

struct nlmsghdr;

namespace netlink {

// Milliseconds of CLOCK_MONOTONIC: what every addon times its work with.
double NowMs();

// One message of the kernel's answer, as the receive loop hands it on.
struct Message {
  enum class Type {
    kData,   // any other message type (the answer itself: NEWSETELEM, NEWGEN, a conntrack entry)
    kAck,    // NLMSG_ERROR with error 0
    kError,  // NLMSG_ERROR with an error: `error` (an errno, positive) and `kernelMessage`
    kDone,   // NLMSG_DONE, the end of a dump; `error` is its status when the dump failed, else 0
  };
  Type type = Type::kData;
  const nlmsghdr* header = nullptr;
  int error = 0;
  // The kernel's extended ack message (NLMSGERR_ATTR_MSG) of an error, when it gave one.
  std::string kernelMessage;
};

// What the callback of a receive loop answers for each message.
enum class Next { kMore, kStop };

// How a receive loop ended.
struct Received {
  enum class End {
    kStopped,          // the callback said kStop: the answer is read
    kSystem,           // recvmsg failed: `error` is its errno (EAGAIN: the receive timeout)
    kCutShort,         // a datagram was larger than the buffer (MSG_TRUNC)
    kNotWhole,         // bytes of a datagram that make no whole message (or an error message cut short)
    kTooManyDatagrams, // the answer did not come within the datagrams allowed
    kTooManyBytes,     // the answer came to more bytes than allowed
  };
  End end = End::kStopped;
  int error = 0;
  size_t bytes = 0;  // of every datagram read, from the kernel or not
  bool ok() const { return end == End::kStopped; }
  // The reason in a few words: strerror, "a datagram was cut short", ...
  std::string Why() const;
};

// Bounds of one receive loop: at most so many datagrams are read, at most so many bytes.
struct Limits {
  size_t maxDatagrams = SIZE_MAX;
  size_t maxBytes = SIZE_MAX;
};

// A NETLINK_NETFILTER socket. Not thread-safe: each owner serialises its calls. A send or a read
// that fails leaves the socket out of step with the kernel: it is closed, and the next Open
// makes a new one.
class Socket {
 public:
  Socket() = default;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  // Opens and binds the socket, unless it is open: close-on-exec, acks capped to the header of
  // the message they answer, extended acks, reads timed out after receiveTimeoutMs, a buffer of
  // receiveBufferBytes for each datagram read. The first sequence number is the time of the first
  // open; reopening goes on from the last.
  bool Open(int receiveTimeoutMs, size_t receiveBufferBytes, std::string& error);
  void Close();
  bool IsOpen() const { return fd_ >= 0; }

  // The next sequence number (one per request message).
  uint32_t NextSeq() { return ++seq_; }
  uint32_t LastSeq() const { return seq_; }

  // Grows the send buffer to `bytes` (one datagram must fit in it), past the system's limit
  // (SO_SNDBUFFORCE, which needs CAP_NET_ADMIN) or else up to it: false (errno set) when neither
  // took. A size once set is remembered until the socket closes.
  bool GrowSendBuffer(int bytes);
  // Grows the receive buffer to `bytes`, best effort: with force past the system's limit
  // (SO_RCVBUFFORCE), else (or when that fails) up to it (SO_RCVBUF).
  void GrowReceiveBuffer(int bytes, bool force);

  // One datagram to the kernel; false (errno set, the socket closed) when it was not sent.
  bool Send(const void* data, size_t length);

  // Reads datagrams until `each` answers kStop, within `limits`. Only datagrams of the kernel
  // count (another socket's are passed over); of their messages, only those whose sequence number
  // is from firstSeq to lastSeq reach `each` (late answers to earlier requests are passed over).
  // Any end but kStopped closes the socket.
  template <typename Each>
  Received Receive(uint32_t firstSeq, uint32_t lastSeq, const Limits& limits, Each&& each) {
    return ReceiveLoop(firstSeq, lastSeq, limits, &Call<Each>, &each);
  }

 private:
  using Callback = Next (*)(const Message&, void*);
  template <typename Each>
  static Next Call(const Message& message, void* each) {
    return (*static_cast<typename std::remove_reference<Each>::type*>(each))(message);
  }
  Received ReceiveLoop(uint32_t firstSeq, uint32_t lastSeq, const Limits& limits, Callback callback, void* each);

  int fd_ = -1;
  uint32_t seq_ = 0;
  int sendBuffer_ = 0;
  int receiveBuffer_ = 0;
  std::vector<char> buffer_;
};

}  // namespace netlink

#endif  // IPVS_NODE_CONTROLLER_NETLINK_SOCKET_H_
