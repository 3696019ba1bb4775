// The libnftables context of one addon instance (nft_session.h).
//
// One long-lived nft_ctx per addon instance, all calls serialised by one process-wide lock:
// - Freeing a context after a transaction costs about 6 ms (its netlink socket is closed),
//   against about 0.1 ms for a single-element transaction on a kept context: a context per
//   call would make every partial sync 50 times slower.
// - libnftables keeps unsynchronised process-wide state (a one-time initialisation inside
//   nft_ctx_new, an interface cache released at the end of every command), so even separate
//   contexts must not run at the same time: a pool of several would buy no parallelism.
// - A kept context stays correct when others change the ruleset: libnftables compares the
//   ruleset generation before each command and refetches its cache when it moved, and drops
//   its cache after a failed command. Dry-run is set on every call.
// The netlink socket belongs to the network namespace the process was in at the first call.
//
// Each transaction also reports the ruleset generation (NFT_MSG_GETGEN) read just before and
// just after it, over a netlink socket of the session's own (netlink_socket.h): when the two
// differ by exactly one, the commit between them was ours. The element batches and dumps hold
// the same lock and read the generation around them the same way.

#include "nft_session.h"

#include <nftables/libnftables.h>

#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <arpa/inet.h>
#include <sys/socket.h>

#include <cstring>
#include <mutex>

namespace nft_addon {

namespace {

// Guards libnftables' process-wide state: one lock for every addon instance in the process.
std::mutex& LibnftablesLock() {
  static std::mutex lock;
  return lock;
}

std::string TrimTrailingNewlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

int64_t GenerationReader::Read() {
  std::string error;
  if (!socket_.Open(kReceiveTimeoutMs, kDatagramBytes, error)) return -1;
  struct {
    nlmsghdr header;
    nfgenmsg body;
  } request{};
  request.header.nlmsg_len = sizeof request;
  request.header.nlmsg_type = (NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_GETGEN;
  request.header.nlmsg_flags = NLM_F_REQUEST;
  request.header.nlmsg_seq = socket_.NextSeq();
  request.body.nfgen_family = AF_UNSPEC;
  request.body.version = NFNETLINK_V0;
  if (!socket_.Send(&request, sizeof request)) return -1;
  netlink::Limits limits;
  limits.maxDatagrams = kMaxDatagramsPerRead;
  int64_t generation = -1;
  const uint32_t seq = request.header.nlmsg_seq;
  // A socket that failed (a timeout, datagrams that kept coming without our answer, one that is
  // not what the kernel sends) is closed by the read and reopened at the next: answers may be
  // out of step.
  socket_.Receive(seq, seq, limits, [&](const netlink::Message& m) {
    // An error (or an ack) of the request: no generation.
    if (m.type == netlink::Message::Type::kAck || m.type == netlink::Message::Type::kError) {
      return netlink::Next::kStop;
    }
    if (m.header->nlmsg_type != ((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN)) return netlink::Next::kMore;
    generation = GenerationId(m.header);
    return netlink::Next::kStop;
  });
  return generation;
}

// NFTA_GEN_ID of a NEWGEN message that NLMSG_OK accepted (its whole length was received).
int64_t GenerationReader::GenerationId(const nlmsghdr* h) {
  // The attributes follow the header and the nfgenmsg, each aligned.
  const int attributes = NLMSG_HDRLEN + static_cast<int>(NLMSG_ALIGN(sizeof(nfgenmsg)));
  int length = static_cast<int>(h->nlmsg_len) - attributes;
  if (length < 0) return -1;
  const char* at = reinterpret_cast<const char*>(h) + attributes;
  while (length >= static_cast<int>(sizeof(nlattr))) {
    nlattr attribute;
    std::memcpy(&attribute, at, sizeof attribute);
    if (attribute.nla_len < sizeof(nlattr) || attribute.nla_len > length) return -1;
    if ((attribute.nla_type & NLA_TYPE_MASK) == NFTA_GEN_ID && attribute.nla_len >= NLA_HDRLEN + sizeof(uint32_t)) {
      uint32_t id;
      std::memcpy(&id, at + NLA_HDRLEN, sizeof id);
      return ntohl(id);
    }
    const int step = static_cast<int>(NLA_ALIGN(attribute.nla_len));
    at += step;
    length -= step;
  }
  return -1;
}

NftSession::~NftSession() {
  std::lock_guard<std::mutex> guard(LibnftablesLock());
  if (ctx_ != nullptr) nft_ctx_free(ctx_);
}

CommandResult NftSession::Run(const std::string& document, bool dryRun) {
  std::lock_guard<std::mutex> guard(LibnftablesLock());
  if (ctx_ == nullptr) {
    ctx_ = nft_ctx_new(NFT_CTX_DEFAULT);
    if (ctx_ == nullptr) {
      CommandResult failed;
      failed.rc = -1;
      failed.error = "libnftables could not create a context (nft_ctx_new failed: out of memory?)";
      return failed;
    }
    // libnftables 1.0.6 has no input flags: the JSON output flag is what makes it parse JSON.
    nft_ctx_output_set_flags(ctx_, NFT_CTX_OUTPUT_JSON);
    nft_ctx_buffer_output(ctx_);
    nft_ctx_buffer_error(ctx_);
  }
  nft_ctx_set_dry_run(ctx_, dryRun);
  CommandResult result;
  if (!dryRun) result.generationBefore = generation_.Read();
  result.rc = nft_run_cmd_from_buffer(ctx_, document.c_str());
  if (!dryRun) result.generationAfter = generation_.Read();
  // Reading a buffer also empties it for the next call.
  result.output = TrimTrailingNewlines(nft_ctx_get_output_buffer(ctx_));
  result.error = TrimTrailingNewlines(nft_ctx_get_error_buffer(ctx_));
  return result;
}

int64_t NftSession::Generation() {
  std::lock_guard<std::mutex> guard(LibnftablesLock());
  return generation_.Read();
}

#ifdef NFT_ELEMENT_BATCH
nft_batch::ElementWriteResult NftSession::WriteElements(const nft_batch::ElementWrite& write, int64_t& before,
                                                        int64_t& after) {
  std::lock_guard<std::mutex> guard(LibnftablesLock());
  before = generation_.Read();
  nft_batch::ElementWriteResult result = elements_.Write(write);
  after = generation_.Read();
  return result;
}

NftSession::SetsRead NftSession::ReadSets(const std::vector<nft_batch::ElementRead>& reads) {
  std::lock_guard<std::mutex> guard(LibnftablesLock());
  constexpr int kAttempts = 4;
  SetsRead read;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    read = SetsRead();
    read.generation = generation_.Read();
    bool interrupted = false;
    for (const nft_batch::ElementRead& one : reads) {
      read.sets.push_back(reader_.Read(one));
      const nft_batch::ElementReadResult& result = read.sets.back();
      // A missing set is an answer (null); any other failure fails the read.
      if (!result.ok && !result.missing) {
        read.error = result.error;
        read.tooMany = result.tooMany;
        return read;
      }
      interrupted = interrupted || result.interrupted;
    }
    const int64_t after = generation_.Read();
    // Unknown generations: the elements are returned without one (the batch then checks none).
    if (read.generation < 0 || after < 0) {
      read.generation = -1;
      return read;
    }
    if (after == read.generation && !interrupted) return read;
  }
  read.error = "the ruleset kept changing while " + (reads.empty() ? std::string("the sets") : reads[0].set) +
               " was read (" + std::to_string(kAttempts) + " attempts)";
  return read;
}
#endif

}  // namespace nft_addon
