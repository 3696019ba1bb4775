// writeElements() and readSets() of nftables_addon: their arguments checked before any work is
// queued, the work on a libuv worker thread (the session's element batches and dumps), the result
// as a promise. Built with libnftnl and libmnl only (binding.gyp).

#include "nft_calls.h"

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nft_addon {

namespace {

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

}  // namespace

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

}  // namespace nft_addon
