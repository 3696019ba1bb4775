// In-process libnftables: nft JSON documents run as one transaction each, without a process
// per call. Every call runs on a libuv worker thread (Napi::AsyncWorker) so a large transaction
// never blocks the event loop; results come back as promises. The calls go to one long-lived
// libnftables context per addon instance, all serialised by one process-wide lock (nft_session.cc
// says why).
//
// Each transaction also reports the ruleset generation (NFT_MSG_GETGEN) read just before and
// just after it: when the two differ by exactly one, the commit between them was ours, so the
// caller can tell later whether anyone else has written since (a resync then need not list).
// writeElements() (when built with libnftnl and libmnl; nft_element_calls.cc) writes one map's
// element removals and additions as a netlink batch of its own (nft_element_batch.cc): no JSON,
// no libnftables parse. It holds the same lock and reads the generation around its commit the
// same way.
// readSets() reads what some sets hold with netlink dumps (nft_element_dump.cc), at one ruleset
// generation: a whole write compares them with what they must hold and writes only the
// difference, with that generation in its batch so that the kernel refuses it if anything was
// committed in between.
// releaseMemory() hands memory freed by large work back to the kernel (malloc_trim): glibc keeps
// the freed arenas of libnftables' parse otherwise. The caller decides when (after full syncs).

#include <napi.h>

#include "nft_calls.h"
#include "nft_session.h"

#include <malloc.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#ifndef LIBNFTABLES_VERSION
#define LIBNFTABLES_VERSION "unknown"
#endif

namespace nft_addon {

SharedSession SessionOf(Napi::Env env) { return *env.GetInstanceData<SharedSession>(); }

std::string StringArgument(const Napi::CallbackInfo& info, size_t index, const char* name) {
  if (info.Length() <= index || !info[index].IsString()) {
    throw Napi::TypeError::New(info.Env(), std::string(name) + " must be a string");
  }
  return info[index].As<Napi::String>().Utf8Value();
}

}  // namespace nft_addon

namespace {

using nft_addon::CommandResult;
using nft_addon::NftSession;
using nft_addon::SessionOf;
using nft_addon::SharedSession;
using nft_addon::StringArgument;

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
  exports.Set("writeElements", Napi::Function::New(env, nft_addon::WriteElements, "writeElements"));
  exports.Set("readSets", Napi::Function::New(env, nft_addon::ReadSets, "readSets"));
#endif
  exports.Set("version", Napi::String::New(env, LIBNFTABLES_VERSION));
  return exports;
}

}  // namespace

NODE_API_MODULE(nftables_addon, Init)
