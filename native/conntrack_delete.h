// The conntrack deletions of conntrack_addon, without Node: the targets parsed from their lines,
// and the dumps and deletions through ctnetlink that delete their entries. See
// conntrack_delete.cc.

#ifndef IPVS_NODE_CONTROLLER_CONNTRACK_DELETE_H_
#define IPVS_NODE_CONTROLLER_CONNTRACK_DELETE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace conntrack {

// Entries kept (to delete) per call, all targets together: a worker's memory (an IPv6 entry is
// about 90 bytes kept, an IPv4 one 60) and the time of one call (65,536 deletions took 2 s on a
// loaded 2-core machine).
constexpr size_t DEFAULT_TOTAL = 1u << 16;
// Entries kept per target and call, at most (by default, only the call's total bounds it).
constexpr size_t DEFAULT_PER_TARGET = DEFAULT_TOTAL;
constexpr size_t MAX_LIMIT = 1u << 22;

struct Target {
  uint8_t protocol = 0;
  uint8_t address[16] = {};
  uint16_t port = 0;  // network byte order, as the kernel sends it
  bool untranslatedOnly = false;
};

struct Limits {
  size_t perTarget = DEFAULT_PER_TARGET;
  size_t total = DEFAULT_TOTAL;
  // Whether the kernel may be asked to delete by a filter (conntrack_delete.cc, Flush).
  bool flush = true;
};

struct Truncated {
  size_t target = 0;  // the index of its first line
  size_t matched = 0;
  size_t kept = 0;
};

struct Result {
  std::string error;
  size_t dumped = 0;
  size_t dumps = 0;  // walks of the table: dumps asked for
  // Targets the kernel deleted by a filter (their entries not counted: it does not say how many).
  size_t flushes = 0;
  // Why the kernel refused the first deletion by a filter (strerror), when it did in this call.
  std::string flushRefused;
  // Whether the kernel is known to refuse deletions by a filter (this call or an earlier one).
  bool refusesFlush = false;
  size_t matched = 0;
  size_t deleted = 0;
  size_t share = 0;
  std::vector<Truncated> truncated;
  double ms = 0;
};

// Deletes the entries of `family` (AF_INET or AF_INET6) whose original destination is one of
// `targets`, within `limits`, each read waiting at most timeoutMs; `error` says why it stopped.
Result DeleteMatching(int family, const std::vector<Target>& targets, int timeoutMs, const Limits& limits);

// Targets from their lines (`protocol-number address port untranslated-only(0|1)`, one a line).
bool ParseTargets(const std::string& text, int family, std::vector<Target>& out, std::string& error);

}  // namespace conntrack

#endif  // IPVS_NODE_CONTROLLER_CONNTRACK_DELETE_H_
