// Loading the BPF object, attaching its programs to a cgroup and keeping everything pinned in a
// bpffs directory so that the translation outlives the process that set it up.
//
// Layout under the bpffs directory:
//   maps/<map name>       the entry maps, the per-socket origin map, the translation counters and
//                         the node's network namespace (re-used by the next load)
//   programs/<name>       the programs currently attached (for inspection with bpftool)
//   links/<name>          one cgroup link per program; the pin keeps the program attached

#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ebpf_addon {

struct AttachedProgram {
  std::string name;
  std::string attachType;
  uint32_t programId = 0;
  uint32_t linkId = 0;
  // "created": a new link; "updated": the pinned link now runs the new program (no gap);
  // "replaced": the pinned link pointed elsewhere (another cgroup, or gone) and was replaced.
  std::string link;
};

struct PinnedMapReport {
  std::string name;
  std::string path;
  uint32_t id = 0;
  bool reused = false;
};

struct LoadResult {
  uint64_t cgroupId = 0;
  // The network namespace cookie the programs count as the node's (this process's); 0 when the
  // kernel cannot tell it (before 5.14): the programs then count the initial namespace's.
  uint64_t nodeNetnsCookie = 0;
  std::vector<AttachedProgram> programs;
  std::vector<PinnedMapReport> maps;
};

struct CleanupResult {
  uint32_t detachedLinks = 0;
  uint32_t removedPins = 0;
};

// Throws std::runtime_error with a one-line message (libbpf's log tail included).
LoadResult LoadAndAttach(const std::string& objectPath, const std::string& bpffsPath,
                         const std::string& cgroupPath);

// Loads the object's programs and maps into the kernel and drops them again, pinning and
// attaching nothing: proves the verifier accepts them and that we may load them. Throws.
void CheckLoad(const std::string& objectPath);

// Detaches every pinned link, removes every pin and the directories. A missing directory is
// nothing to do. Throws std::runtime_error.
CleanupResult RemovePinned(const std::string& bpffsPath);

}  // namespace ebpf_addon
