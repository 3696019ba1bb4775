// In-process libnftables: nft JSON documents run as one transaction each, without a process
// per call. Every call runs on a libuv worker thread (Napi::AsyncWorker) so a large transaction
// never blocks the event loop; results come back as promises.
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
// just after it: when the two differ by exactly one, the commit between them was ours, so the
// caller can tell later whether anyone else has written since (a resync then need not list).
// writeElements() (when built with libnftnl and libmnl) writes one map's element removals and
// additions as a netlink batch of its own (nft_element_batch.cc): no JSON, no libnftables parse.
// It holds the same lock and reads the generation around its commit the same way.
// readSets() reads what some sets hold with netlink dumps (nft_element_dump.cc), at one ruleset
// generation: a whole write compares them with what they must hold and writes only the
// difference, with that generation in its batch so that the kernel refuses it if anything was
// committed in between.
// releaseMemory() hands memory freed by large work back to the kernel (malloc_trim): glibc keeps
// the freed arenas of libnftables' parse otherwise. The caller decides when (after full syncs).

#include <napi.h>
#include <nftables/libnftables.h>

#include "netlink_socket.h"

#ifdef NFT_ELEMENT_BATCH
#include "nft_element_batch.h"
#include "nft_element_dump.h"
#endif

#include <linux/netfilter/nf_tables.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netlink.h>
#include <arpa/inet.h>
#include <malloc.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#ifndef LIBNFTABLES_VERSION
#define LIBNFTABLES_VERSION "unknown"
#endif

namespace {

// Guards libnftables' process-wide state: one lock for every addon instance in the process.
std::mutex& LibnftablesLock() {
  static std::mutex lock;
  return lock;
}

void ReleaseFreedMemory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// libnftables' JSON parse allocates and frees a few small blocks per element (jansson's tree,
// expressions, netlink attributes). glibc parks small frees in fastbins and walks them all
// (malloc_consolidate) whenever a large free or request follows: at 50,000 elements that walk
// and its unlinking were about a sixth of a full-sync transaction's time (perf, nft -f of the
// controller's document). Without fastbins, frees coalesce at once; tcache still serves the
// small sizes first. Process-wide, set once when the addon loads.
void TuneAllocatorForLargeTransactions() {
#ifdef __GLIBC__
  static std::once_flag once;
  std::call_once(once, [] { mallopt(M_MXFAST, 0); });
#endif
}

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
  int64_t Read() {
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
      if (m.type == netlink::Message::Type::kAck || m.type == netlink::Message::Type::kError) return netlink::Next::kStop;
      if (m.header->nlmsg_type != ((NFNL_SUBSYS_NFTABLES << 8) | NFT_MSG_NEWGEN)) return netlink::Next::kMore;
      generation = GenerationId(m.header);
      return netlink::Next::kStop;
    });
    return generation;
  }

 private:
  static constexpr int kReceiveTimeoutMs = 1000;
  // 8192 bytes, as netlink(7) advises: no answer of the kernel is truncated on pages of 8 KiB.
  static constexpr size_t kDatagramBytes = 8192;
  // At most this many datagrams are read for one answer: late answers to earlier requests
  // (after a timeout) are a few; more is a socket out of step.
  static constexpr size_t kMaxDatagramsPerRead = 16;

  // NFTA_GEN_ID of a NEWGEN message that NLMSG_OK accepted (its whole length was received).
  static int64_t GenerationId(const nlmsghdr* h) {
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

  netlink::Socket socket_;
};

std::string TrimTrailingNewlines(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// The context of one addon instance, created at its first use (on a worker thread).
class NftSession {
 public:
  NftSession() = default;
  NftSession(const NftSession&) = delete;
  NftSession& operator=(const NftSession&) = delete;

  ~NftSession() {
    std::lock_guard<std::mutex> guard(LibnftablesLock());
    if (ctx_ != nullptr) nft_ctx_free(ctx_);
  }

  // Runs one document (JSON, because the context's output flags say JSON).
  CommandResult Run(const std::string& document, bool dryRun) {
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

  int64_t Generation() {
    std::lock_guard<std::mutex> guard(LibnftablesLock());
    return generation_.Read();
  }

#ifdef NFT_ELEMENT_BATCH
  // The commit is libnftables-free, but the lock keeps it in order with the JSON transactions and
  // the generation readings around it meaningful.
  nft_batch::ElementWriteResult WriteElements(const nft_batch::ElementWrite& write, int64_t& before, int64_t& after) {
    std::lock_guard<std::mutex> guard(LibnftablesLock());
    before = generation_.Read();
    nft_batch::ElementWriteResult result = elements_.Write(write);
    after = generation_.Read();
    return result;
  }

  // Sets read at one generation: the generation is read before and after all the dumps, and the
  // dumps are taken again while it moves (another process committing) or one was interrupted, a
  // few times at most.
  struct SetsRead {
    std::vector<nft_batch::ElementReadResult> sets;
    int64_t generation = -1;
    std::string error;
    bool tooMany = false;
  };
  SetsRead ReadSets(const std::vector<nft_batch::ElementRead>& reads) {
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

 private:
  nft_ctx* ctx_ = nullptr;
  GenerationReader generation_;
#ifdef NFT_ELEMENT_BATCH
  nft_batch::ElementBatchWriter elements_;
  nft_batch::ElementReader reader_;
#endif
};

using SharedSession = std::shared_ptr<NftSession>;

// Workers hold the session too, so it outlives an environment torn down while they run.
SharedSession SessionOf(Napi::Env env) { return *env.GetInstanceData<SharedSession>(); }

std::string FailureMessage(const CommandResult& result) {
  if (!result.error.empty()) return result.error;
  return "libnftables failed (code " + std::to_string(result.rc) + ") without a message";
}

std::string JsonString(const std::string& text) {
  std::string quoted = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"': quoted += "\\\""; break;
      case '\\': quoted += "\\\\"; break;
      case '\n': quoted += "\\n"; break;
      case '\t': quoted += "\\t"; break;
      default:
        if (c < 0x20) {
          char escaped[8];
          std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
          quoted += escaped;
        } else {
          quoted += static_cast<char>(c);
        }
    }
  }
  return quoted + "\"";
}

// run() and check(): one document, one transaction (or one validation without commit).
class TransactionWorker : public Napi::AsyncWorker {
 public:
  TransactionWorker(Napi::Env env, std::string document, bool dryRun)
      : Napi::AsyncWorker(env, dryRun ? "nftables.check" : "nftables.run"),
        session_(SessionOf(env)),
        deferred_(Napi::Promise::Deferred::New(env)),
        document_(std::move(document)),
        dryRun_(dryRun) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    result_ = session_->Run(document_, dryRun_);
    if (result_.rc != 0) SetError(FailureMessage(result_));
  }

  void OnOK() override {
    Napi::Object value = Napi::Object::New(Env());
    value.Set("output", result_.output);
    value.Set("generationBefore", Napi::Number::New(Env(), static_cast<double>(result_.generationBefore)));
    value.Set("generationAfter", Napi::Number::New(Env(), static_cast<double>(result_.generationAfter)));
    deferred_.Resolve(value);
  }

  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  SharedSession session_;
  Napi::Promise::Deferred deferred_;
  std::string document_;
  bool dryRun_;
  CommandResult result_;
};

#ifdef NFT_ELEMENT_BATCH
// writeElements(): one map's removals and additions in one transaction, as a netlink batch.
class WriteElementsWorker : public Napi::AsyncWorker {
 public:
  WriteElementsWorker(Napi::Env env, nft_batch::ElementWrite write)
      : Napi::AsyncWorker(env, "nftables.writeElements"),
        session_(SessionOf(env)),
        deferred_(Napi::Promise::Deferred::New(env)),
        write_(std::move(write)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    result_ = session_->WriteElements(write_, before_, after_);
    if (!result_.ok) SetError(result_.error);
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::Object value = Napi::Object::New(env);
    auto number = [&](const char* name, double n) { value.Set(name, Napi::Number::New(env, n)); };
    number("generationBefore", static_cast<double>(before_));
    number("generationAfter", static_cast<double>(after_));
    number("buildMs", result_.buildMs);
    number("kernelMs", result_.kernelMs);
    number("messages", static_cast<double>(result_.messages));
    number("bytes", static_cast<double>(result_.bytes));
    number("removed", static_cast<double>(result_.removed));
    number("added", static_cast<double>(result_.added));
    number("keysRemoved", static_cast<double>(result_.keysRemoved));
    number("keysAdded", static_cast<double>(result_.keysAdded));
    deferred_.Resolve(value);
  }

  void OnError(const Napi::Error& error) override {
    if (result_.generationChanged) error.Value().Set("code", Napi::String::New(Env(), "ERR_GENERATION_CHANGED"));
    deferred_.Reject(error.Value());
  }

 private:
  SharedSession session_;
  Napi::Promise::Deferred deferred_;
  nft_batch::ElementWrite write_;
  nft_batch::ElementWriteResult result_;
  int64_t before_ = -1;
  int64_t after_ = -1;
};

// readSets(): what some sets of one table hold, at one generation; null for a set (or table) that
// does not exist.
class ReadSetsWorker : public Napi::AsyncWorker {
 public:
  ReadSetsWorker(Napi::Env env, std::vector<nft_batch::ElementRead> reads)
      : Napi::AsyncWorker(env, "nftables.readSets"),
        session_(SessionOf(env)),
        deferred_(Napi::Promise::Deferred::New(env)),
        reads_(std::move(reads)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    read_ = session_->ReadSets(reads_);
    if (!read_.error.empty()) SetError(read_.error);
  }

  void OnOK() override {
    Napi::Env env = Env();
    Napi::Array sets = Napi::Array::New(env, read_.sets.size());
    double ms = 0;
    for (size_t i = 0; i < read_.sets.size(); ++i) {
      const nft_batch::ElementReadResult& one = read_.sets[i];
      sets.Set(static_cast<uint32_t>(i), one.missing ? env.Null() : Napi::String::New(env, one.lines));
      ms += one.ms;
    }
    Napi::Object value = Napi::Object::New(env);
    value.Set("sets", sets);
    value.Set("generation", Napi::Number::New(env, static_cast<double>(read_.generation)));
    value.Set("ms", Napi::Number::New(env, ms));
    deferred_.Resolve(value);
  }

  void OnError(const Napi::Error& error) override {
    if (read_.tooMany) error.Value().Set("code", Napi::String::New(Env(), "ERR_TOO_MANY_ELEMENTS"));
    deferred_.Reject(error.Value());
  }

 private:
  SharedSession session_;
  Napi::Promise::Deferred deferred_;
  std::vector<nft_batch::ElementRead> reads_;
  NftSession::SetsRead read_;
};
#endif

// list(): the JSON listing of one table, or null when the table does not exist. A listing longer
// than maxBytes rejects with code ERR_LISTING_TOO_LARGE, and no JavaScript string is made of it.
class ListTableWorker : public Napi::AsyncWorker {
 public:
  // what: "table" (the table with its rules and elements) or "chains" (every chain of the
  // family, without rules: the table's chains are picked by the caller).
  ListTableWorker(Napi::Env env, const std::string& family, const std::string& table, size_t maxBytes,
                  const std::string& what)
      : Napi::AsyncWorker(env, "nftables.list"),
        session_(SessionOf(env)),
        deferred_(Napi::Promise::Deferred::New(env)),
        document_(what == "chains" ? "{\"nftables\":[{\"list\":{\"chains\":{\"family\":" + JsonString(family) + "}}}]}"
                                   : "{\"nftables\":[{\"list\":{\"table\":{\"family\":" + JsonString(family) +
                                         ",\"name\":" + JsonString(table) + "}}}]}"),
        maxBytes_(maxBytes) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    result_ = session_->Run(document_, false);
    if (result_.rc == 0) {
      if (result_.output.size() <= maxBytes_) return;
      tooLarge_ = true;
      const size_t bytes = result_.output.size();
      std::string().swap(result_.output);
      SetError("the listing is " + std::to_string(bytes) + " bytes, more than the " + std::to_string(maxBytes_) +
               " asked for");
      return;
    }
    // nft reports a missing table as ENOENT; any other failure is an error.
    missing_ = result_.error.find(std::strerror(ENOENT)) != std::string::npos;
    if (!missing_) SetError(FailureMessage(result_));
  }

  void OnOK() override {
    if (missing_) {
      deferred_.Resolve(Env().Null());
    } else {
      deferred_.Resolve(Napi::String::New(Env(), result_.output));
    }
  }

  void OnError(const Napi::Error& error) override {
    if (tooLarge_) error.Value().Set("code", Napi::String::New(Env(), "ERR_LISTING_TOO_LARGE"));
    deferred_.Reject(error.Value());
  }

 private:
  SharedSession session_;
  Napi::Promise::Deferred deferred_;
  std::string document_;
  size_t maxBytes_;
  CommandResult result_;
  bool missing_ = false;
  bool tooLarge_ = false;
};

// generation(): the ruleset generation now, or -1 when it cannot be read.
class GenerationWorker : public Napi::AsyncWorker {
 public:
  explicit GenerationWorker(Napi::Env env)
      : Napi::AsyncWorker(env, "nftables.generation"),
        session_(SessionOf(env)),
        deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override { generation_ = session_->Generation(); }
  void OnOK() override { deferred_.Resolve(Napi::Number::New(Env(), static_cast<double>(generation_))); }
  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  SharedSession session_;
  Napi::Promise::Deferred deferred_;
  int64_t generation_ = -1;
};

// releaseMemory(): hands memory freed by large work elsewhere in the process back to the kernel.
class ReleaseMemoryWorker : public Napi::AsyncWorker {
 public:
  explicit ReleaseMemoryWorker(Napi::Env env)
      : Napi::AsyncWorker(env, "nftables.releaseMemory"), deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override { ReleaseFreedMemory(); }
  void OnOK() override { deferred_.Resolve(Env().Undefined()); }
  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
};

std::string StringArgument(const Napi::CallbackInfo& info, size_t index, const char* name) {
  if (info.Length() <= index || !info[index].IsString()) {
    throw Napi::TypeError::New(info.Env(), std::string(name) + " must be a string");
  }
  return info[index].As<Napi::String>().Utf8Value();
}

Napi::Value Run(const Napi::CallbackInfo& info) {
  auto* worker = new TransactionWorker(info.Env(), StringArgument(info, 0, "json"), false);
  worker->Queue();
  return worker->Promise();
}

Napi::Value Check(const Napi::CallbackInfo& info) {
  auto* worker = new TransactionWorker(info.Env(), StringArgument(info, 0, "json"), true);
  worker->Queue();
  return worker->Promise();
}

// The optional maxBytes argument of list(): at least 1; absent, no bound.
size_t MaxBytesArgument(const Napi::CallbackInfo& info, size_t index) {
  if (info.Length() <= index || info[index].IsUndefined()) return SIZE_MAX;
  if (!info[index].IsNumber()) throw Napi::TypeError::New(info.Env(), "maxBytes must be a number");
  const double value = info[index].As<Napi::Number>().DoubleValue();
  if (!(value >= 1)) throw Napi::RangeError::New(info.Env(), "maxBytes must be at least 1");
  return value >= static_cast<double>(SIZE_MAX) ? SIZE_MAX : static_cast<size_t>(value);
}

Napi::Value List(const Napi::CallbackInfo& info) {
  std::string family = StringArgument(info, 0, "family");
  std::string table = StringArgument(info, 1, "table");
  size_t maxBytes = MaxBytesArgument(info, 2);
  std::string what = info.Length() > 3 && !info[3].IsUndefined() ? StringArgument(info, 3, "what") : "table";
  if (what != "table" && what != "chains") throw Napi::TypeError::New(info.Env(), "what must be table or chains");
  auto* worker = new ListTableWorker(info.Env(), family, table, maxBytes, what);
  worker->Queue();
  return worker->Promise();
}

#ifdef NFT_ELEMENT_BATCH
// writeElements(family, table, map, removed, added[, flush[, keySet[, options]]]): the lists as
// nft_element_batch.h describes; flush: the map's other elements are removed in the same
// transaction; keySet: the set of its keys, written alike; options: { keySetRemoved, keySetAdded }
// (the key set's own lists) and { generation } (the batch is refused, code ERR_GENERATION_CHANGED,
// when anything was committed since).
Napi::Value WriteElements(const Napi::CallbackInfo& info) {
  nft_batch::ElementWrite write;
  const std::string family = StringArgument(info, 0, "family");
  if (family == "ip") {
    write.family = AF_INET;
  } else if (family == "ip6") {
    write.family = AF_INET6;
  } else {
    throw Napi::TypeError::New(info.Env(), "family must be ip or ip6");
  }
  write.table = StringArgument(info, 1, "table");
  write.map = StringArgument(info, 2, "map");
  write.removed = StringArgument(info, 3, "removed");
  write.added = StringArgument(info, 4, "added");
  write.flush = info.Length() > 5 && info[5].ToBoolean().Value();
  if (info.Length() > 6 && !info[6].IsUndefined()) write.keySet = StringArgument(info, 6, "keySet");
  if (info.Length() > 7 && !info[7].IsUndefined()) {
    if (!info[7].IsObject()) throw Napi::TypeError::New(info.Env(), "options must be an object");
    Napi::Object options = info[7].As<Napi::Object>();
    auto text = [&](const char* name, std::string& into) {
      Napi::Value v = options.Get(name);
      if (v.IsUndefined()) return false;
      if (!v.IsString()) throw Napi::TypeError::New(info.Env(), std::string(name) + " must be a string");
      into = v.As<Napi::String>().Utf8Value();
      return true;
    };
    const bool removed = text("keySetRemoved", write.keySetRemoved);
    const bool added = text("keySetAdded", write.keySetAdded);
    if (removed != added) throw Napi::TypeError::New(info.Env(), "keySetRemoved and keySetAdded go together");
    write.keySetOwnLists = removed;
    Napi::Value generation = options.Get("generation");
    if (!generation.IsUndefined()) {
      if (!generation.IsNumber()) throw Napi::TypeError::New(info.Env(), "generation must be a number");
      const double g = generation.As<Napi::Number>().DoubleValue();
      if (!(g >= 0 && g <= 4294967295.0) || g != static_cast<double>(static_cast<int64_t>(g))) {
        throw Napi::RangeError::New(info.Env(), "generation must be an integer from 0 to 2^32 - 1");
      }
      write.generation = static_cast<int64_t>(g);
    }
  }
  auto* worker = new WriteElementsWorker(info.Env(), std::move(write));
  worker->Queue();
  return worker->Promise();
}

// readSets(family, table, sets, maxElements): sets is an array of { name, kind } with kind `map`,
// `keys` or `ranges` (nft_element_dump.h); resolves { sets: lines or null each, generation, ms }.
// More than maxElements in a set rejects with code ERR_TOO_MANY_ELEMENTS.
Napi::Value ReadSets(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  nft_batch::ElementRead base;
  const std::string family = StringArgument(info, 0, "family");
  if (family == "ip") {
    base.family = AF_INET;
  } else if (family == "ip6") {
    base.family = AF_INET6;
  } else {
    throw Napi::TypeError::New(env, "family must be ip or ip6");
  }
  base.table = StringArgument(info, 1, "table");
  if (info.Length() <= 2 || !info[2].IsArray()) throw Napi::TypeError::New(env, "sets must be an array");
  if (info.Length() <= 3 || !info[3].IsNumber()) throw Napi::TypeError::New(env, "maxElements must be a number");
  const double max = info[3].As<Napi::Number>().DoubleValue();
  if (!(max >= 1 && max <= 10e6)) throw Napi::RangeError::New(env, "maxElements must be from 1 to 10,000,000");
  base.maxElements = static_cast<size_t>(max);
  Napi::Array sets = info[2].As<Napi::Array>();
  if (sets.Length() == 0 || sets.Length() > 8) throw Napi::RangeError::New(env, "sets must name 1 to 8 sets");
  std::vector<nft_batch::ElementRead> reads;
  for (uint32_t i = 0; i < sets.Length(); ++i) {
    Napi::Value item = sets.Get(i);
    if (!item.IsObject()) throw Napi::TypeError::New(env, "each set must be { name, kind }");
    Napi::Object set = item.As<Napi::Object>();
    Napi::Value name = set.Get("name");
    Napi::Value kind = set.Get("kind");
    if (!name.IsString() || !kind.IsString()) throw Napi::TypeError::New(env, "each set must be { name, kind }");
    nft_batch::ElementRead read = base;
    read.set = name.As<Napi::String>().Utf8Value();
    const std::string k = kind.As<Napi::String>().Utf8Value();
    if (k == "map") {
      read.kind = nft_batch::ElementRead::Kind::kMap;
    } else if (k == "keys") {
      read.kind = nft_batch::ElementRead::Kind::kKeys;
    } else if (k == "sourced") {
      read.kind = nft_batch::ElementRead::Kind::kSourced;
    } else if (k == "verdicts") {
      read.kind = nft_batch::ElementRead::Kind::kVerdicts;
    } else {
      throw Napi::TypeError::New(env, "kind must be map, keys, sourced or verdicts");
    }
    reads.push_back(std::move(read));
  }
  auto* worker = new ReadSetsWorker(env, std::move(reads));
  worker->Queue();
  return worker->Promise();
}
#endif

Napi::Value Generation(const Napi::CallbackInfo& info) {
  auto* worker = new GenerationWorker(info.Env());
  worker->Queue();
  return worker->Promise();
}

Napi::Value ReleaseMemory(const Napi::CallbackInfo& info) {
  auto* worker = new ReleaseMemoryWorker(info.Env());
  worker->Queue();
  return worker->Promise();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  TuneAllocatorForLargeTransactions();
  env.SetInstanceData<SharedSession>(new SharedSession(std::make_shared<NftSession>()));
  exports.Set("run", Napi::Function::New(env, Run, "run"));
  exports.Set("check", Napi::Function::New(env, Check, "check"));
  exports.Set("list", Napi::Function::New(env, List, "list"));
  exports.Set("generation", Napi::Function::New(env, Generation, "generation"));
  exports.Set("releaseMemory", Napi::Function::New(env, ReleaseMemory, "releaseMemory"));
#ifdef NFT_ELEMENT_BATCH
  exports.Set("writeElements", Napi::Function::New(env, WriteElements, "writeElements"));
  exports.Set("readSets", Napi::Function::New(env, ReadSets, "readSets"));
#endif
  exports.Set("version", Napi::String::New(env, LIBNFTABLES_VERSION));
  return exports;
}

}  // namespace

NODE_API_MODULE(nftables_addon, Init)
