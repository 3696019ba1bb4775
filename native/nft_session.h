// The libnftables context of one nftables_addon instance, with the netlink readers and writers
// beside it: the JSON transactions, the ruleset generation read around them, the element batches
// and dumps. See nft_session.cc.

#ifndef IPVS_NODE_CONTROLLER_NFT_SESSION_H_
#define IPVS_NODE_CONTROLLER_NFT_SESSION_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "netlink_socket.h"

#ifdef NFT_ELEMENT_BATCH
#include "nft_element_batch.h"
#include "nft_element_dump.h"
#endif

struct nft_ctx;
struct nlmsghdr;

namespace nft_addon {

struct CommandResult {
  int rc = 0;
  std::string output;
  std::string error;
  // Ruleset generation before and after the command; -1 when it could not be read.
  int64_t generationBefore = -1;
  int64_t generationAfter = -1;
};

// Reads the nf_tables ruleset generation over a netlink socket of its own (NFT_MSG_GETGEN).
class GenerationReader {
 public:
  // The generation, or -1 when it cannot be read (the caller then trusts nothing).
  int64_t Read();

 private:
  static constexpr int kReceiveTimeoutMs = 1000;
  // 8192 bytes, as netlink(7) advises: no answer of the kernel is truncated on pages of 8 KiB.
  static constexpr size_t kDatagramBytes = 8192;
  // At most this many datagrams are read for one answer: late answers to earlier requests
  // (after a timeout) are a few; more is a socket out of step.
  static constexpr size_t kMaxDatagramsPerRead = 16;

  static int64_t GenerationId(const nlmsghdr* h);

  netlink::Socket socket_;
};

// The context of one addon instance, created at its first use (on a worker thread). Every call
// holds one process-wide lock (nft_session.cc).
class NftSession {
 public:
  NftSession() = default;
  NftSession(const NftSession&) = delete;
  NftSession& operator=(const NftSession&) = delete;
  ~NftSession();

  // Runs one document (JSON, because the context's output flags say JSON).
  CommandResult Run(const std::string& document, bool dryRun);

  int64_t Generation();

#ifdef NFT_ELEMENT_BATCH
  // The commit is libnftables-free, but the lock keeps it in order with the JSON transactions and
  // the generation readings around it meaningful.
  nft_batch::ElementWriteResult WriteElements(const nft_batch::ElementWrite& write, int64_t& before, int64_t& after);

  // Sets read at one generation: the generation is read before and after all the dumps, and the
  // dumps are taken again while it moves (another process committing) or one was interrupted, a
  // few times at most.
  struct SetsRead {
    std::vector<nft_batch::ElementReadResult> sets;
    int64_t generation = -1;
    std::string error;
    bool tooMany = false;
  };
  SetsRead ReadSets(const std::vector<nft_batch::ElementRead>& reads);
#endif

 private:
  nft_ctx* ctx_ = nullptr;
  GenerationReader generation_;
#ifdef NFT_ELEMENT_BATCH
  nft_batch::ElementBatchWriter elements_;
  nft_batch::ElementReader reader_;
#endif
};

using SharedSession = std::shared_ptr<NftSession>;

}  // namespace nft_addon

#endif  // IPVS_NODE_CONTROLLER_NFT_SESSION_H_
