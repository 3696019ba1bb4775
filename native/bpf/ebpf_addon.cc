// The JS face of the eBPF backend's native side: load + attach + pin, map batches, cleanup.
// Every call that enters the kernel runs on a worker thread (Napi::AsyncWorker) and settles a
// Promise; failures reject with an Error carrying errno's / libbpf's own message.

#include <bpf/libbpf.h>
#include <unistd.h>

#include <napi.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "bpf_errors.h"
#include "pinned_map.h"
#include "pinned_programs.h"

namespace ebpf_addon {

namespace {

std::string RequireString(const Napi::Object& options, const char* key) {
  Napi::Value v = options.Get(key);
  if (!v.IsString() || v.As<Napi::String>().Utf8Value().empty()) {
    throw Napi::TypeError::New(options.Env(), std::string("option '") + key + "' must be a non-empty string");
  }
  return v.As<Napi::String>().Utf8Value();
}

// Settles a Promise from a worker; subclasses fill Execute() and Resolve().
class PromiseWorker : public Napi::AsyncWorker {
 public:
  explicit PromiseWorker(Napi::Env env) : Napi::AsyncWorker(env), deferred_(Napi::Promise::Deferred::New(env)) {}
  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  virtual Napi::Value Result(Napi::Env env) = 0;
  void Execute() final {
    try {
      Run();
    } catch (const std::exception& e) {
      SetError(e.what());
    }
  }
  virtual void Run() = 0;
  void OnOK() final { deferred_.Resolve(Result(Env())); }
  void OnError(const Napi::Error& e) final { deferred_.Reject(e.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
};

class LoadWorker : public PromiseWorker {
 public:
  LoadWorker(Napi::Env env, std::string objectPath, std::string bpffsPath, std::string cgroupPath)
      : PromiseWorker(env),
        objectPath_(std::move(objectPath)),
        bpffsPath_(std::move(bpffsPath)),
        cgroupPath_(std::move(cgroupPath)) {}

 protected:
  void Run() override { result_ = LoadAndAttach(objectPath_, bpffsPath_, cgroupPath_); }
  Napi::Value Result(Napi::Env env) override {
    Napi::Object out = Napi::Object::New(env);
    out.Set("cgroupId", Napi::BigInt::New(env, static_cast<uint64_t>(result_.cgroupId)));
    out.Set("nodeNetnsCookie", Napi::BigInt::New(env, static_cast<uint64_t>(result_.nodeNetnsCookie)));
    Napi::Array programs = Napi::Array::New(env, result_.programs.size());
    for (size_t i = 0; i < result_.programs.size(); ++i) {
      const AttachedProgram& p = result_.programs[i];
      Napi::Object o = Napi::Object::New(env);
      o.Set("name", p.name);
      o.Set("attachType", p.attachType);
      o.Set("programId", p.programId);
      o.Set("linkId", p.linkId);
      o.Set("link", p.link);
      programs.Set(i, o);
    }
    out.Set("programs", programs);
    Napi::Array maps = Napi::Array::New(env, result_.maps.size());
    for (size_t i = 0; i < result_.maps.size(); ++i) {
      const PinnedMapReport& m = result_.maps[i];
      Napi::Object o = Napi::Object::New(env);
      o.Set("name", m.name);
      o.Set("path", m.path);
      o.Set("id", m.id);
      o.Set("reused", m.reused);
      maps.Set(i, o);
    }
    out.Set("maps", maps);
    return out;
  }

 private:
  std::string objectPath_, bpffsPath_, cgroupPath_;
  LoadResult result_;
};

class CheckLoadWorker : public PromiseWorker {
 public:
  CheckLoadWorker(Napi::Env env, std::string objectPath) : PromiseWorker(env), objectPath_(std::move(objectPath)) {}

 protected:
  void Run() override { CheckLoad(objectPath_); }
  Napi::Value Result(Napi::Env env) override { return env.Undefined(); }

 private:
  std::string objectPath_;
};

class CleanupWorker : public PromiseWorker {
 public:
  CleanupWorker(Napi::Env env, std::string bpffsPath) : PromiseWorker(env), bpffsPath_(std::move(bpffsPath)) {}

 protected:
  void Run() override { result_ = RemovePinned(bpffsPath_); }
  Napi::Value Result(Napi::Env env) override {
    Napi::Object out = Napi::Object::New(env);
    out.Set("detachedLinks", result_.detachedLinks);
    out.Set("removedPins", result_.removedPins);
    return out;
  }

 private:
  std::string bpffsPath_;
  CleanupResult result_;
};

// Each operation works on its own duplicate of the map descriptor, so close() on the JS object
// never pulls the descriptor from under a running worker.
class MapWorker : public PromiseWorker {
 public:
  MapWorker(Napi::Env env, int fd, const MapShape& shape) : PromiseWorker(env), fd_(dup(fd)), shape_(shape) {}
  ~MapWorker() override {
    if (fd_ >= 0) close(fd_);
  }

 protected:
  void Run() override {
    if (fd_ < 0) throw std::runtime_error(ErrnoMessage("duplicate map descriptor", errno));
    RunOnMap();
  }
  virtual void RunOnMap() = 0;
  int fd_;
  MapShape shape_;
};

class UpdateWorker : public MapWorker {
 public:
  UpdateWorker(Napi::Env env, int fd, const MapShape& shape, std::vector<uint8_t> keys, std::vector<uint8_t> values)
      : MapWorker(env, fd, shape), keys_(std::move(keys)), values_(std::move(values)) {}

 protected:
  void RunOnMap() override {
    UpdateElements(fd_, shape_, keys_.data(), values_.data(), static_cast<uint32_t>(keys_.size() / shape_.keySize));
  }
  Napi::Value Result(Napi::Env env) override { return env.Undefined(); }

 private:
  std::vector<uint8_t> keys_, values_;
};

class DeleteWorker : public MapWorker {
 public:
  DeleteWorker(Napi::Env env, int fd, const MapShape& shape, std::vector<uint8_t> keys)
      : MapWorker(env, fd, shape), keys_(std::move(keys)) {}

 protected:
  void RunOnMap() override {
    deleted_ = DeleteElements(fd_, shape_, keys_.data(), static_cast<uint32_t>(keys_.size() / shape_.keySize));
  }
  Napi::Value Result(Napi::Env env) override { return Napi::Number::New(env, deleted_); }

 private:
  std::vector<uint8_t> keys_;
  uint32_t deleted_ = 0;
};

class DumpWorker : public MapWorker {
 public:
  DumpWorker(Napi::Env env, int fd, const MapShape& shape) : MapWorker(env, fd, shape) {}

 protected:
  void RunOnMap() override { DumpElements(fd_, shape_, &keys_, &values_); }
  Napi::Value Result(Napi::Env env) override {
    Napi::Object out = Napi::Object::New(env);
    out.Set("keys", Napi::Buffer<uint8_t>::Copy(env, keys_.data(), keys_.size()));
    out.Set("values", Napi::Buffer<uint8_t>::Copy(env, values_.data(), values_.size()));
    return out;
  }

 private:
  std::vector<uint8_t> keys_, values_;
};

class SumPerCpuWorker : public MapWorker {
 public:
  SumPerCpuWorker(Napi::Env env, int fd, const MapShape& shape) : MapWorker(env, fd, shape) {}

 protected:
  void RunOnMap() override { sums_ = SumPerCpu(fd_, shape_); }
  Napi::Value Result(Napi::Env env) override {
    Napi::Array out = Napi::Array::New(env, sums_.size());
    for (size_t i = 0; i < sums_.size(); ++i) out.Set(i, Napi::BigInt::New(env, sums_[i]));
    return out;
  }

 private:
  std::vector<uint64_t> sums_;
};

class PinnedMapHandle : public Napi::ObjectWrap<PinnedMapHandle> {
 public:
  static Napi::Function Define(Napi::Env env) {
    return DefineClass(env, "PinnedMap",
                       {
                           InstanceAccessor<&PinnedMapHandle::Name>("name"),
                           InstanceAccessor<&PinnedMapHandle::Id>("id"),
                           InstanceAccessor<&PinnedMapHandle::KeySize>("keySize"),
                           InstanceAccessor<&PinnedMapHandle::ValueSize>("valueSize"),
                           InstanceAccessor<&PinnedMapHandle::MaxEntries>("maxEntries"),
                           InstanceMethod<&PinnedMapHandle::Update>("update"),
                           InstanceMethod<&PinnedMapHandle::Delete>("delete"),
                           InstanceMethod<&PinnedMapHandle::Dump>("dump"),
                           InstanceMethod<&PinnedMapHandle::SumPerCpu>("sumPerCpu"),
                           InstanceMethod<&PinnedMapHandle::Close>("close"),
                       });
  }

  explicit PinnedMapHandle(const Napi::CallbackInfo& info) : Napi::ObjectWrap<PinnedMapHandle>(info) {
    if (info.Length() < 1 || !info[0].IsString()) {
      throw Napi::TypeError::New(info.Env(), "PinnedMap(path): path must be a string");
    }
    try {
      fd_ = OpenPinnedMap(info[0].As<Napi::String>().Utf8Value(), &shape_);
    } catch (const std::exception& e) {
      throw Napi::Error::New(info.Env(), e.what());
    }
  }
  ~PinnedMapHandle() override { CloseFd(); }

 private:
  Napi::Value Name(const Napi::CallbackInfo& info) { return Napi::String::New(info.Env(), shape_.name); }
  Napi::Value Id(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), shape_.id); }
  Napi::Value KeySize(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), shape_.keySize); }
  Napi::Value ValueSize(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), shape_.valueSize); }
  Napi::Value MaxEntries(const Napi::CallbackInfo& info) { return Napi::Number::New(info.Env(), shape_.maxEntries); }

  void RequireOpen(Napi::Env env) const {
    if (fd_ < 0) throw Napi::Error::New(env, "map " + shape_.name + " is closed");
  }

  std::vector<uint8_t> Packed(const Napi::Value& v, uint32_t elementSize, const char* what) const {
    if (!v.IsBuffer()) throw Napi::TypeError::New(v.Env(), std::string(what) + " must be a Buffer");
    auto buf = v.As<Napi::Buffer<uint8_t>>();
    if (elementSize == 0 || buf.Length() % elementSize != 0) {
      throw Napi::RangeError::New(v.Env(), std::string(what) + " length " + std::to_string(buf.Length()) +
                                               " is not a multiple of " + std::to_string(elementSize) +
                                               " (map " + shape_.name + ")");
    }
    return std::vector<uint8_t>(buf.Data(), buf.Data() + buf.Length());
  }

  Napi::Value Update(const Napi::CallbackInfo& info) {
    RequireOpen(info.Env());
    std::vector<uint8_t> keys = Packed(info[0], shape_.keySize, "keys");
    std::vector<uint8_t> values = Packed(info[1], shape_.valueSize, "values");
    if (keys.size() / shape_.keySize != values.size() / shape_.valueSize) {
      throw Napi::RangeError::New(info.Env(), "keys and values hold different element counts");
    }
    auto* worker = new UpdateWorker(info.Env(), fd_, shape_, std::move(keys), std::move(values));
    worker->Queue();
    return worker->Promise();
  }

  Napi::Value Delete(const Napi::CallbackInfo& info) {
    RequireOpen(info.Env());
    auto* worker = new DeleteWorker(info.Env(), fd_, shape_, Packed(info[0], shape_.keySize, "keys"));
    worker->Queue();
    return worker->Promise();
  }

  Napi::Value Dump(const Napi::CallbackInfo& info) {
    RequireOpen(info.Env());
    auto* worker = new DumpWorker(info.Env(), fd_, shape_);
    worker->Queue();
    return worker->Promise();
  }

  Napi::Value SumPerCpu(const Napi::CallbackInfo& info) {
    RequireOpen(info.Env());
    auto* worker = new SumPerCpuWorker(info.Env(), fd_, shape_);
    worker->Queue();
    return worker->Promise();
  }

  Napi::Value Close(const Napi::CallbackInfo& info) {
    CloseFd();
    return info.Env().Undefined();
  }

  void CloseFd() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

  int fd_ = -1;
  MapShape shape_;
};

}  // namespace

Napi::Value LoadAndAttachJs(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsObject()) {
    throw Napi::TypeError::New(info.Env(), "loadAndAttach(options): options must be an object");
  }
  Napi::Object options = info[0].As<Napi::Object>();
  auto* worker = new LoadWorker(info.Env(), RequireString(options, "objectPath"), RequireString(options, "bpffsPath"),
                                RequireString(options, "cgroupPath"));
  worker->Queue();
  return worker->Promise();
}

Napi::Value CheckLoadJs(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsString()) {
    throw Napi::TypeError::New(info.Env(), "checkLoad(objectPath): objectPath must be a string");
  }
  auto* worker = new CheckLoadWorker(info.Env(), info[0].As<Napi::String>().Utf8Value());
  worker->Queue();
  return worker->Promise();
}

Napi::Value RemovePinnedJs(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsString()) {
    throw Napi::TypeError::New(info.Env(), "removePinned(bpffsPath): bpffsPath must be a string");
  }
  auto* worker = new CleanupWorker(info.Env(), info[0].As<Napi::String>().Utf8Value());
  worker->Queue();
  return worker->Promise();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  InstallLibbpfPrint();
  exports.Set("loadAndAttach", Napi::Function::New<LoadAndAttachJs>(env, "loadAndAttach"));
  exports.Set("checkLoad", Napi::Function::New<CheckLoadJs>(env, "checkLoad"));
  exports.Set("removePinned", Napi::Function::New<RemovePinnedJs>(env, "removePinned"));
  exports.Set("PinnedMap", PinnedMapHandle::Define(env));
  exports.Set("libbpfVersion", Napi::String::New(env, libbpf_version_string()));
  return exports;
}

}  // namespace ebpf_addon

static Napi::Object InitEbpfAddon(Napi::Env env, Napi::Object exports) { return ebpf_addon::Init(env, exports); }

NODE_API_MODULE(ebpf_addon, InitEbpfAddon)
