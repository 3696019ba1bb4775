// The elements of one map or set of ours, read with a netlink dump (NFT_MSG_GETSETELEM) built and
// parsed with libnftnl: what a whole write compares with what the map must hold, so that it
// writes only the difference. See nft_element_dump.cc.

#ifndef IPVS_NODE_CONTROLLER_NFT_ELEMENT_DUMP_H_
#define IPVS_NODE_CONTROLLER_NFT_ELEMENT_DUMP_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "netlink_socket.h"

namespace nft_batch {

struct ElementRead {
  // AF_INET or AF_INET6: the table's family, which also says the address length.
  uint8_t family = 0;
  std::string table;
  std::string set;
  // What the set is, and so its lines: a map (`address protocol port value[ comment]`), a set of
  // its keys (`address protocol port`), a set of keys each with a source address (`address
  // protocol port source`), or a verdict map of keys (`address protocol port verdict[ chain]`).
  enum class Kind { kMap, kKeys, kSourced, kVerdicts };
  Kind kind = Kind::kMap;
  // More elements than this is an error (tooMany): the set is not what the controller writes.
  size_t maxElements = 0;
};

struct ElementReadResult {
  bool ok = false;
  // The table or the set does not exist (ok is false, error says so).
  bool missing = false;
  // The set holds more than maxElements (ok is false, error says so).
  bool tooMany = false;
  std::string error;
  // One element a line, in the line format writeElements takes (nft_element_batch.h).
  std::string lines;
  size_t elements = 0;
  // The dump was found interrupted by a commit (NLM_F_DUMP_INTR): the caller reads again.
  bool interrupted = false;
  double ms = 0;
};

// Reads through one netlink socket (netlink_socket.h), opened at the first read and kept
// (reopened after a failure); not copyable, as the socket is not. Not thread-safe: the caller
// serialises reads.
class ElementReader {
 public:
  ElementReadResult Read(const ElementRead& read);

 private:
  netlink::Socket socket_;
};

}  // namespace nft_batch

#endif  // IPVS_NODE_CONTROLLER_NFT_ELEMENT_DUMP_H_
