#include "bpf_errors.h"

#include <bpf/libbpf.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ebpf_addon {

namespace {

thread_local std::string* active_capture = nullptr;

int PrintToCapture(enum libbpf_print_level level, const char* format, va_list args) {
  if (active_capture == nullptr || level == LIBBPF_DEBUG) return 0;
  char line[1024];
  int n = vsnprintf(line, sizeof(line), format, args);
  if (n > 0) active_capture->append(line);
  // Verifier logs can be megabytes; only the end says what failed.
  constexpr size_t kKeep = 16384;
  if (active_capture->size() > 2 * kKeep) active_capture->erase(0, active_capture->size() - kKeep);
  return 0;
}

}  // namespace

LibbpfLogCapture::LibbpfLogCapture() : previous_(active_capture) { active_capture = &text_; }

LibbpfLogCapture::~LibbpfLogCapture() { active_capture = previous_; }

std::string LibbpfLogCapture::Tail() const {
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text_.size()) {
    size_t end = text_.find('\n', start);
    if (end == std::string::npos) end = text_.size();
    std::string line = text_.substr(start, end - start);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    if (!line.empty()) lines.push_back(line);
    start = end + 1;
  }
  std::string out;
  const size_t keep = 4;
  for (size_t i = lines.size() > keep ? lines.size() - keep : 0; i < lines.size(); ++i) {
    if (!out.empty()) out += "; ";
    out += lines[i];
  }
  return out;
}

std::string ErrnoMessage(const std::string& what, int err) {
  char buf[256];
  libbpf_strerror(err < 0 ? err : -err, buf, sizeof(buf));
  return what + ": " + buf;
}

void InstallLibbpfPrint() { libbpf_set_print(PrintToCapture); }

}  // namespace ebpf_addon
