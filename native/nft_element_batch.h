// Map element writes as one nf_tables netlink batch built with libnftnl and libmnl: no JSON
// text, no parse by libnftables. See nft_element_batch.cc.

#ifndef IPVS_NODE_CONTROLLER_NFT_ELEMENT_BATCH_H_
#define IPVS_NODE_CONTROLLER_NFT_ELEMENT_BATCH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "netlink_socket.h"

namespace nft_batch {

struct ElementWrite {
  // AF_INET or AF_INET6 (the values of NFPROTO_IPV4 and NFPROTO_IPV6): the table's family, which
  // also says the address length.
  uint8_t family = 0;
  std::string table;
  std::string map;
  // One element a line, fields separated by one space: `address protocol port` for a removal,
  // `address protocol port value[ comment]` for an addition (the comment is the rest of the line).
  std::string removed;
  std::string added;
  // Every element of the map removed first (a DELSETELEM without elements, as `flush map`), in
  // the same transaction: the map then holds exactly `added`.
  bool flush = false;
  // A set of the map's key type that holds its keys (empty: none): every removal, addition and
  // the flush are made to it too, in the same batch (keys only, no data or comment).
  std::string keySet;
  // With keySetOwnLists, the key set gets these lists (`address protocol port` lines) instead of
  // the map's: a whole write's difference, where a changed value replaces the map's element but
  // the key set keeps its key untouched.
  bool keySetOwnLists = false;
  std::string keySetRemoved;
  std::string keySetAdded;
  // The ruleset generation (NFT_MSG_GETGEN) the lists were computed at, or -1: with one, the
  // kernel refuses the batch (ERESTART, generationChanged) when anything was committed since, so
  // a difference is never applied to a map it was not computed from.
  int64_t generation = -1;
};

struct ElementWriteResult {
  bool ok = false;
  // The failure in one line: what was refused and the kernel's reason (strerror, and its
  // extended ack message when it gave one).
  std::string error;
  // Timings of this write: parse and batch build, then sendmsg and reading the acks (the kernel
  // processes the whole batch inside sendmsg, so the second is the kernel's work).
  double buildMs = 0;
  double kernelMs = 0;
  size_t messages = 0;
  size_t bytes = 0;
  // Elements the batch removes and adds, of the map and of the key set.
  size_t removed = 0;
  size_t added = 0;
  size_t keysRemoved = 0;
  size_t keysAdded = 0;
  // The kernel refused the batch because the ruleset generation was no longer `generation`.
  bool generationChanged = false;
};

// Writes through one netlink socket (netlink_socket.h), opened at the first write and kept
// (reopened after a failure); not copyable, as the socket is not. Not thread-safe: the caller
// serialises writes.
class ElementBatchWriter {
 public:
  // Deletions then additions of one map's elements (and of its key set's), in one transaction.
  ElementWriteResult Write(const ElementWrite& write);

 private:
  bool EnsureBuffers(size_t sendBytes, size_t acks, std::string& error);

  netlink::Socket socket_;
  std::vector<char> batch_;
};

}  // namespace nft_batch

#endif  // IPVS_NODE_CONTROLLER_NFT_ELEMENT_BATCH_H_
