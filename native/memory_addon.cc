// memory_addon: hands the pages of the files this process maps (the node binary, the shared
// libraries) back to the kernel, once the start is over: madvise(MADV_PAGEOUT) over every
// file-backed mapping of /proc/self/maps, on a libuv worker thread.
//
// Node.js's start touches about 40 MiB of its own binary (V8's snapshot and builtins, ICU data,
// OpenSSL's initialisation, the compiler of every module loaded); the controller then runs a
// small part of that code. Those pages are clean copies of the file: paged out, the ones still
// used come back on their first touch (from the page cache, or the disk), the others leave the
// process's resident memory and its cgroup's charge. Pages another process maps too are left
// alone by the kernel. Anonymous memory (the heap) is not touched: it would go to swap, which
// nodes rarely have.
//
// releaseFilePages() resolves { mappings, bytes, residentBefore, residentAfter } (resident file
// pages in bytes, from /proc/self/status RssFile); rejects when /proc/self/maps cannot be read.
// A kernel without MADV_PAGEOUT (before 5.4) refuses each call: nothing is paged out, no error.

#include <sys/mman.h>
#include <unistd.h>

#include <napi.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif

namespace {

// RssFile of /proc/self/status, in bytes; -1 when it cannot be read.
double ResidentFileBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("RssFile:", 0) == 0) {
      return static_cast<double>(std::strtoull(line.c_str() + 8, nullptr, 10)) * 1024.0;
    }
  }
  return -1;
}

struct PageOutResult {
  std::string error;
  double mappings = 0;
  double bytes = 0;
  double residentBefore = 0;
  double residentAfter = 0;
};

PageOutResult PageOutFileMappings() {
  PageOutResult result;
  result.residentBefore = ResidentFileBytes();
  std::ifstream maps("/proc/self/maps");
  if (!maps) {
    result.error = std::string("reading /proc/self/maps: ") + std::strerror(errno);
    return result;
  }
  std::string line;
  while (std::getline(maps, line)) {
    // start-end perms offset dev inode path; only mappings of a file (a path), readable.
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    if (!(fields >> range >> perms >> offset >> dev >> inode >> path)) continue;
    if (path.empty() || path[0] != '/' || perms.empty() || perms[0] != 'r') continue;
    unsigned long start = 0, end = 0;
    if (std::sscanf(range.c_str(), "%lx-%lx", &start, &end) != 2 || end <= start) continue;
    if (madvise(reinterpret_cast<void*>(start), end - start, MADV_PAGEOUT) == 0) {
      result.mappings += 1;
      result.bytes += static_cast<double>(end - start);
    }
  }
  result.residentAfter = ResidentFileBytes();
  return result;
}

class PageOutWorker : public Napi::AsyncWorker {
 public:
  explicit PageOutWorker(Napi::Env env)
      : Napi::AsyncWorker(env, "memory.releaseFilePages"), deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise Promise() const { return deferred_.Promise(); }

 protected:
  void Execute() override {
    result_ = PageOutFileMappings();
    if (!result_.error.empty()) SetError(result_.error);
  }
  void OnOK() override {
    Napi::Env env = Env();
    Napi::Object value = Napi::Object::New(env);
    value.Set("mappings", Napi::Number::New(env, result_.mappings));
    value.Set("bytes", Napi::Number::New(env, result_.bytes));
    value.Set("residentBefore", Napi::Number::New(env, result_.residentBefore));
    value.Set("residentAfter", Napi::Number::New(env, result_.residentAfter));
    deferred_.Resolve(value);
  }
  void OnError(const Napi::Error& error) override { deferred_.Reject(error.Value()); }

 private:
  Napi::Promise::Deferred deferred_;
  PageOutResult result_;
};

Napi::Value ReleaseFilePages(const Napi::CallbackInfo& info) {
  auto* worker = new PageOutWorker(info.Env());
  worker->Queue();
  return worker->Promise();
}

Napi::Object Init(Napi::Env env, Napi::Object exports) {
  exports.Set("releaseFilePages", Napi::Function::New(env, ReleaseFilePages, "releaseFilePages"));
  return exports;
}

}  // namespace

NODE_API_MODULE(memory_addon, Init)
