// Reading and writing a pinned BPF hash map in batches. Keys and values are packed back to back
// in the map's own key_size / value_size layout; the caller encodes them.

#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ebpf_addon {

struct MapShape {
  std::string name;
  uint32_t id = 0;
  uint32_t type = 0;
  uint32_t keySize = 0;
  uint32_t valueSize = 0;
  uint32_t maxEntries = 0;
};

// Returns an owned descriptor. Throws std::runtime_error.
int OpenPinnedMap(const std::string& path, MapShape* shape);

// Inserts or replaces `count` elements. Throws std::runtime_error.
void UpdateElements(int fd, const MapShape& shape, const uint8_t* keys, const uint8_t* values, uint32_t count);

// Deletes `count` keys; keys already absent are not an error. Returns how many were deleted.
uint32_t DeleteElements(int fd, const MapShape& shape, const uint8_t* keys, uint32_t count);

// A per-CPU array of u64 counters: each slot summed over the possible CPUs (one lookup per
// slot, at most kMaxSummedSlots). Throws std::runtime_error for another kind of map.
constexpr uint32_t kMaxSummedSlots = 64;
std::vector<uint64_t> SumPerCpu(int fd, const MapShape& shape);

// Every element of the map.
void DumpElements(int fd, const MapShape& shape, std::vector<uint8_t>* keys, std::vector<uint8_t>* values);

}  // namespace ebpf_addon
