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

#include <napi.h>
#include <nftables/libnftables.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#ifndef LIBNFTABLES_VERSION
#define LIBNFTABLES_VERSION "unknown"
#endif

namespace {

// Guards libnftables' process-wide state: one lock for every addon instance in the process.
std::mutex& LibnftablesLock() {
  static std::mutex lock;
  return lock;
}

struct CommandResult {
  int rc = 0;
  std::string output;
  std::string error;
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
    result.rc = nft_run_cmd_from_buffer(ctx_, document.c_str());
    // Reading a buffer also empties it for the next call.
    result.output = TrimTrailingNewlines(nft_ctx_get_output_buffer(ctx_));
    result.error = TrimTrailingNewlines(nft_ctx_get_error_buffer(ctx_));
    return result;
  }

 private:
  nft_ctx* ctx_ = nullptr;
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

// list(): the JSON listing of one table, or null when the table does not exist.
class ListTableWorker : public Napi::AsyncWorker {
 public:
  ListTableWorker(Napi::Env env, const std::string& family, const std::string& table)
      : Napi::AsyncWorker(env, "nftables.list"),
        session_(SessionOf(env)),
        deferred_(Napi::Promise::Deferred::New(env)),
        document_("{\"nftables\":[{\"list\":{\"table\":{\"family\":" + JsonString(family) +
                  ",\"name\":" + JsonString(table) + "}}}]}") {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    result_ = session_->Run(document_, false);
    if (result_.rc == 0) return;
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

  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  SharedSession session_;
  Napi::Promise::Deferred deferred_;
  std::string document_;
  CommandResult result_;
  bool missing_ = false;
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

Napi::Value List(const Napi::CallbackInfo& info) {
  std::string family = StringArgument(info, 0, "family");
  std::string table = StringArgument(info, 1, "table");
  auto* worker = new ListTableWorker(info.Env(), family, table);
  worker->Queue();
  return worker->Promise();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  env.SetInstanceData<SharedSession>(new SharedSession(std::make_shared<NftSession>()));
  exports.Set("run", Napi::Function::New(env, Run, "run"));
  exports.Set("check", Napi::Function::New(env, Check, "check"));
  exports.Set("list", Napi::Function::New(env, List, "list"));
  exports.Set("version", Napi::String::New(env, LIBNFTABLES_VERSION));
  return exports;
}

}  // namespace

NODE_API_MODULE(nftables_addon, Init)
