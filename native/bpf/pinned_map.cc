#include "pinned_map.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "bpf_errors.h"

namespace ebpf_addon {

namespace {

// ENOTSUPP (524) is what a kernel without batch operations for this map type returns.
bool BatchUnsupported(int err) { return err == EINVAL || err == EOPNOTSUPP || err == 524 || err == ENOSYS; }

void UpdateOneByOne(int fd, const MapShape& shape, const uint8_t* keys, const uint8_t* values, uint32_t from,
                    uint32_t count) {
  for (uint32_t i = from; i < count; ++i) {
    if (bpf_map_update_elem(fd, keys + size_t(i) * shape.keySize, values + size_t(i) * shape.valueSize, BPF_ANY) !=
        0) {
      if (errno == E2BIG || errno == ENOMEM || errno == ENOSPC) {
        throw std::runtime_error("map " + shape.name + " is full (" + std::to_string(shape.maxEntries) +
                                 " entries): fewer entries are needed");
      }
      throw std::runtime_error(ErrnoMessage("update map " + shape.name, errno));
    }
  }
}

}  // namespace

int OpenPinnedMap(const std::string& path, MapShape* shape) {
  int fd = bpf_obj_get(path.c_str());
  if (fd < 0) throw std::runtime_error(ErrnoMessage("open pinned map " + path, errno));
  struct bpf_map_info info;
  memset(&info, 0, sizeof(info));
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) {
    int err = errno;
    close(fd);
    throw std::runtime_error(ErrnoMessage("read map info " + path, err));
  }
  // The kernel ends the name with a NUL; never read past the field if it did not.
  shape->name.assign(info.name, strnlen(info.name, sizeof info.name));
  shape->id = info.id;
  shape->type = info.type;
  shape->keySize = info.key_size;
  shape->valueSize = info.value_size;
  shape->maxEntries = info.max_entries;
  return fd;
}

void UpdateElements(int fd, const MapShape& shape, const uint8_t* keys, const uint8_t* values, uint32_t count) {
  if (count == 0) return;
  LIBBPF_OPTS(bpf_map_batch_opts, opts, .elem_flags = BPF_ANY);
  uint32_t done = count;
  if (bpf_map_update_batch(fd, keys, values, &done, &opts) == 0) return;
  int err = errno;
  if (BatchUnsupported(err) && done == 0) {
    UpdateOneByOne(fd, shape, keys, values, 0, count);
    return;
  }
  if (err == E2BIG || err == ENOMEM || err == ENOSPC) {
    throw std::runtime_error("map " + shape.name + " is full (" + std::to_string(shape.maxEntries) +
                             " entries): fewer entries are needed");
  }
  throw std::runtime_error(ErrnoMessage("update map " + shape.name, err));
}

uint32_t DeleteElements(int fd, const MapShape& shape, const uint8_t* keys, uint32_t count) {
  uint32_t deleted = 0;
  uint32_t at = 0;
  bool batch = true;
  while (at < count) {
    if (batch) {
      LIBBPF_OPTS(bpf_map_batch_opts, opts);
      uint32_t done = count - at;
      if (bpf_map_delete_batch(fd, keys + size_t(at) * shape.keySize, &done, &opts) == 0) {
        deleted += done;
        break;
      }
      int err = errno;
      deleted += done;
      at += done;
      if (err == ENOENT) {
        ++at;  // the key at `at` was already gone: skip it and go on in batches
        continue;
      }
      if (BatchUnsupported(err) && done == 0) {
        batch = false;
        continue;
      }
      throw std::runtime_error(ErrnoMessage("delete from map " + shape.name, err));
    }
    if (bpf_map_delete_elem(fd, keys + size_t(at) * shape.keySize) == 0) {
      ++deleted;
    } else if (errno != ENOENT) {
      throw std::runtime_error(ErrnoMessage("delete from map " + shape.name, errno));
    }
    ++at;
  }
  return deleted;
}

std::vector<uint64_t> SumPerCpu(int fd, const MapShape& shape) {
  if (shape.type != BPF_MAP_TYPE_PERCPU_ARRAY || shape.valueSize != sizeof(uint64_t)) {
    throw std::runtime_error("map " + shape.name + " is not a per-CPU array of 8-byte counters");
  }
  if (shape.maxEntries > kMaxSummedSlots) {
    throw std::runtime_error("map " + shape.name + " has " + std::to_string(shape.maxEntries) +
                             " slots: more than the " + std::to_string(kMaxSummedSlots) + " a sum reads");
  }
  // The kernel copies one value per possible CPU (each rounded up to 8 bytes).
  const int cpus = libbpf_num_possible_cpus();
  if (cpus <= 0) throw std::runtime_error(ErrnoMessage("count the possible CPUs", cpus));
  std::vector<uint64_t> perCpu(static_cast<size_t>(cpus));
  std::vector<uint64_t> sums(shape.maxEntries);
  for (uint32_t key = 0; key < shape.maxEntries; ++key) {
    if (bpf_map_lookup_elem(fd, &key, perCpu.data()) != 0) {
      throw std::runtime_error(ErrnoMessage("read map " + shape.name, errno));
    }
    uint64_t sum = 0;
    for (uint64_t v : perCpu) sum += v;  // wraps at 2^64 as each CPU's counter does
    sums[key] = sum;
  }
  return sums;
}

void DumpElements(int fd, const MapShape& shape, std::vector<uint8_t>* keys, std::vector<uint8_t>* values) {
  keys->clear();
  values->clear();
  if (shape.keySize == 0) throw std::runtime_error("read map " + shape.name + ": its keys have no size");
  // The map holds at most maxEntries: more read means it changed under the read (a hash map's
  // walk restarts when the key it stands on is deleted); the caller reads again later.
  const size_t most = shape.maxEntries;
  const auto tooMany = [&shape]() {
    return std::runtime_error("read map " + shape.name + ": more than its " + std::to_string(shape.maxEntries) +
                              " entries came back (it changed during the read)");
  };
  const uint32_t chunk = 4096;
  // The batch position is opaque to us; hash maps use a 4-byte bucket index.
  std::vector<uint8_t> in_batch(std::max<uint32_t>(shape.keySize, 8));
  std::vector<uint8_t> out_batch(in_batch.size());
  std::vector<uint8_t> chunk_keys(size_t(chunk) * shape.keySize);
  std::vector<uint8_t> chunk_values(size_t(chunk) * shape.valueSize);
  bool first = true;
  for (;;) {
    LIBBPF_OPTS(bpf_map_batch_opts, opts);
    uint32_t n = chunk;
    int rc = bpf_map_lookup_batch(fd, first ? nullptr : in_batch.data(), out_batch.data(), chunk_keys.data(),
                                  chunk_values.data(), &n, &opts);
    int err = rc == 0 ? 0 : errno;
    if (rc != 0 && err != ENOENT) {
      if (first && BatchUnsupported(err)) break;  // walk the keys one by one below
      throw std::runtime_error(ErrnoMessage("read map " + shape.name, err));
    }
    // The count the kernel wrote back never exceeds what it was given room for; check anyway
    // before it sizes a copy out of the chunk buffers.
    if (n > chunk) throw std::runtime_error("read map " + shape.name + ": the kernel returned more than a batch");
    if (keys->size() / shape.keySize + n > most) throw tooMany();
    keys->insert(keys->end(), chunk_keys.begin(), chunk_keys.begin() + size_t(n) * shape.keySize);
    values->insert(values->end(), chunk_values.begin(), chunk_values.begin() + size_t(n) * shape.valueSize);
    if (err == ENOENT) return;
    in_batch = out_batch;
    first = false;
  }

  std::vector<uint8_t> key(shape.keySize);
  std::vector<uint8_t> next(shape.keySize);
  std::vector<uint8_t> value(shape.valueSize);
  const void* prev = nullptr;
  for (size_t steps = 0; bpf_map_get_next_key(fd, prev, next.data()) == 0; ++steps) {
    if (steps >= most) throw tooMany();
    if (bpf_map_lookup_elem(fd, next.data(), value.data()) == 0) {
      keys->insert(keys->end(), next.begin(), next.end());
      values->insert(values->end(), value.begin(), value.end());
    }
    key = next;
    prev = key.data();
  }
  if (errno != ENOENT) throw std::runtime_error(ErrnoMessage("read map " + shape.name, errno));
}

}  // namespace ebpf_addon
