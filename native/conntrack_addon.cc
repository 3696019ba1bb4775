// conntrack_addon: deletes conntrack entries by their original destination through ctnetlink,
// in the process, on a libuv worker thread (conntrack_delete.cc: what it dumps and deletes, and
// its bounds).
//
// deleteMatching(family: 'ipv4' | 'ipv6', targets: string, timeoutMs?: number,
//                limits?: { perTarget?: number, total?: number, flush?: boolean })
//   targets: one per line, `protocol-number address port untranslated-only(0|1)`;
//   resolves { dumped, dumps, flushes, flushRefused?, refusesFlush, matched, deleted, ms, share,
//   truncated: [{ target, matched, kept }] } (flushes: targets the kernel deleted by a filter,
//   their entries not counted; flushRefused: why the kernel refused that, the first time;
//   refusesFlush: whether it is known to refuse it, by this call or an earlier one; target:
//   the index of the target's first line; matched: its entries seen; kept: those deleted or gone
//   meanwhile), rejects with the kernel's reason. flush: false never asks the kernel to delete by
//   a filter (the dumps do it).

#include <sys/socket.h>

#include <napi.h>

#include "conntrack_delete.h"

#include <string>
#include <utility>
#include <vector>

namespace {

using conntrack::Limits;
using conntrack::MAX_LIMIT;
using conntrack::Result;
using conntrack::Target;

class DeleteWorker : public Napi::AsyncWorker {
 public:
  DeleteWorker(Napi::Env env, int family, std::vector<Target> targets, int timeoutMs, Limits limits)
      : Napi::AsyncWorker(env, "conntrack.deleteMatching"),
        deferred_(Napi::Promise::Deferred::New(env)),
        family_(family),
        targets_(std::move(targets)),
        timeoutMs_(timeoutMs),
        limits_(limits) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    result_ = conntrack::DeleteMatching(family_, targets_, timeoutMs_, limits_);
    if (!result_.error.empty()) SetError(result_.error);
  }
  void OnOK() override {
    Napi::Env env = Env();
    Napi::Object value = Napi::Object::New(env);
    value.Set("dumped", Napi::Number::New(env, static_cast<double>(result_.dumped)));
    value.Set("dumps", Napi::Number::New(env, static_cast<double>(result_.dumps)));
    value.Set("flushes", Napi::Number::New(env, static_cast<double>(result_.flushes)));
    if (!result_.flushRefused.empty()) value.Set("flushRefused", Napi::String::New(env, result_.flushRefused));
    value.Set("refusesFlush", Napi::Boolean::New(env, result_.refusesFlush));
    value.Set("matched", Napi::Number::New(env, static_cast<double>(result_.matched)));
    value.Set("deleted", Napi::Number::New(env, static_cast<double>(result_.deleted)));
    value.Set("ms", Napi::Number::New(env, result_.ms));
    value.Set("share", Napi::Number::New(env, static_cast<double>(result_.share)));
    Napi::Array truncated = Napi::Array::New(env, result_.truncated.size());
    for (size_t i = 0; i < result_.truncated.size(); ++i) {
      Napi::Object t = Napi::Object::New(env);
      t.Set("target", Napi::Number::New(env, static_cast<double>(result_.truncated[i].target)));
      t.Set("matched", Napi::Number::New(env, static_cast<double>(result_.truncated[i].matched)));
      t.Set("kept", Napi::Number::New(env, static_cast<double>(result_.truncated[i].kept)));
      truncated.Set(static_cast<uint32_t>(i), t);
    }
    value.Set("truncated", truncated);
    deferred_.Resolve(value);
  }
  void OnError(const Napi::Error& error) override {
    error.Value().Set("deleted", Napi::Number::New(Env(), static_cast<double>(result_.deleted)));
    deferred_.Reject(error.Value());
  }

 private:
  Napi::Promise::Deferred deferred_;
  int family_;
  std::vector<Target> targets_;
  int timeoutMs_;
  Limits limits_;
  Result result_;
};

Napi::Value DeleteMatchingJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsString() || !info[1].IsString())
    throw Napi::TypeError::New(env, "deleteMatching(family, targets[, timeoutMs]): family and targets are strings");
  const std::string familyName = info[0].As<Napi::String>().Utf8Value();
  int family;
  if (familyName == "ipv4") {
    family = AF_INET;
  } else if (familyName == "ipv6") {
    family = AF_INET6;
  } else {
    throw Napi::TypeError::New(env, "family must be ipv4 or ipv6");
  }
  int timeoutMs = 5000;
  if (info.Length() > 2 && !info[2].IsUndefined()) {
    const double t = info[2].As<Napi::Number>().DoubleValue();
    if (!(t >= 1 && t <= 600000)) throw Napi::RangeError::New(env, "timeoutMs must be between 1 and 600000");
    timeoutMs = static_cast<int>(t);
  }
  Limits limits;
  if (info.Length() > 3 && !info[3].IsUndefined()) {
    if (!info[3].IsObject()) throw Napi::TypeError::New(env, "limits must be an object");
    const Napi::Object given = info[3].As<Napi::Object>();
    const auto limit = [&](const char* name, size_t& out) {
      const Napi::Value v = given.Get(name);
      if (v.IsUndefined()) return;
      const double n = v.IsNumber() ? v.As<Napi::Number>().DoubleValue() : -1;
      if (!(n >= 1 && n <= static_cast<double>(MAX_LIMIT)) || n != static_cast<double>(static_cast<size_t>(n)))
        throw Napi::RangeError::New(env, std::string(name) + " must be a whole number between 1 and " +
                                             std::to_string(MAX_LIMIT));
      out = static_cast<size_t>(n);
    };
    limit("perTarget", limits.perTarget);
    limit("total", limits.total);
    const Napi::Value flush = given.Get("flush");
    if (!flush.IsUndefined()) {
      if (!flush.IsBoolean()) throw Napi::TypeError::New(env, "flush must be a boolean");
      limits.flush = flush.As<Napi::Boolean>().Value();
    }
  }
  std::vector<Target> targets;
  std::string error;
  if (!conntrack::ParseTargets(info[1].As<Napi::String>().Utf8Value(), family, targets, error))
    throw Napi::TypeError::New(env, error);
  auto* worker = new DeleteWorker(env, family, std::move(targets), timeoutMs, limits);
  worker->Queue();
  return worker->Promise();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("deleteMatching", Napi::Function::New(env, DeleteMatchingJs, "deleteMatching"));
  return exports;
}

}  // namespace

NODE_API_MODULE(conntrack_addon, Init)
