// Error text for the eBPF addon: errno / libbpf messages, plus what libbpf logged while a call
// ran (the verifier's last lines, a pinned map mismatch), so JS sees the library's own words.

#pragma once

#include <string>

namespace ebpf_addon {

// Collects libbpf's warnings on the calling thread while alive; libbpf logs on the thread that
// called it, which is the worker thread of one AsyncWorker.
class LibbpfLogCapture {
 public:
  LibbpfLogCapture();
  ~LibbpfLogCapture();
  LibbpfLogCapture(const LibbpfLogCapture&) = delete;
  LibbpfLogCapture& operator=(const LibbpfLogCapture&) = delete;
  // The last few non-empty lines, joined with "; ".
  std::string Tail() const;

 private:
  std::string text_;
  std::string* previous_;
};

// "what: strerror(err)" with libbpf's text for its own error codes; err may be negative.
std::string ErrnoMessage(const std::string& what, int err);

// Installs the print callback once; messages are dropped unless a capture is active.
void InstallLibbpfPrint();

}  // namespace ebpf_addon
