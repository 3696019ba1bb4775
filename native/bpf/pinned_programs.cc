#include "pinned_programs.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "bpf_errors.h"

#ifndef SO_NETNS_COOKIE
#define SO_NETNS_COOKIE 71
#endif

namespace ebpf_addon {

namespace {

// The object's map holding the node's network namespace cookie (bpf/ipvs_node_controller.bpf.c).
const char kNodeNetnsMap[] = "node_netns";

class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct ObjectCloser {
  void operator()(bpf_object* obj) const { bpf_object__close(obj); }
};
struct LinkCloser {
  // Closes our descriptor only: a pinned link stays attached.
  void operator()(bpf_link* link) const { bpf_link__destroy(link); }
};

[[noreturn]] void Fail(const std::string& message, const LibbpfLogCapture* log = nullptr) {
  std::string text = message;
  if (log != nullptr) {
    std::string tail = log->Tail();
    if (!tail.empty()) text += " (libbpf: " + tail + ")";
  }
  throw std::runtime_error(text);
}

bool Exists(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0;
}

std::string Parent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

// Pins only work on a bpffs; checking first turns an obscure EPERM into an actionable line.
void RequireBpffs(const std::string& path) {
  std::string probe = path;
  while (!Exists(probe) && probe != "/" && probe != ".") probe = Parent(probe);
  struct statfs fs;
  if (statfs(probe.c_str(), &fs) != 0) Fail(ErrnoMessage("statfs " + probe, errno));
  if (static_cast<unsigned long>(fs.f_type) != BPF_FS_MAGIC) {
    Fail(path + " is not on a bpffs mount: mount one (mount -t bpf bpf /sys/fs/bpf) or pass --bpffs-path");
  }
}

void MakeDirs(const std::string& path) {
  if (path.empty() || Exists(path)) return;
  MakeDirs(Parent(path));
  if (mkdir(path.c_str(), 0700) != 0 && errno != EEXIST) Fail(ErrnoMessage("mkdir " + path, errno));
}

uint64_t CgroupId(int cgroup_fd, const std::string& cgroupPath) {
  // The cgroup id is the kernfs node id, which the file handle of the directory carries.
  struct {
    struct file_handle handle;
    uint64_t id;
  } fh;
  fh.handle.handle_bytes = sizeof(uint64_t);
  int mount_id = 0;
  if (name_to_handle_at(cgroup_fd, "", &fh.handle, &mount_id, AT_EMPTY_PATH) == 0 &&
      fh.handle.handle_bytes == sizeof(uint64_t)) {
    uint64_t id;
    memcpy(&id, fh.handle.f_handle, sizeof(id));
    return id;
  }
  struct stat st;
  if (fstat(cgroup_fd, &st) != 0) Fail(ErrnoMessage("stat " + cgroupPath, errno));
  return static_cast<uint64_t>(st.st_ino);
}

bool LinkPointsAt(int link_fd, uint64_t cgroup_id, enum bpf_attach_type type, uint32_t* link_id) {
  struct bpf_link_info info;
  memset(&info, 0, sizeof(info));
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(link_fd, &info, &len) != 0) return false;
  *link_id = info.id;
  return info.type == BPF_LINK_TYPE_CGROUP && info.cgroup.cgroup_id == cgroup_id &&
         info.cgroup.attach_type == static_cast<uint32_t>(type);
}

uint32_t ProgramId(int prog_fd) {
  struct bpf_prog_info info;
  memset(&info, 0, sizeof(info));
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(prog_fd, &info, &len) != 0) return 0;
  return info.id;
}

uint32_t LinkId(int link_fd) {
  struct bpf_link_info info;
  memset(&info, 0, sizeof(info));
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(link_fd, &info, &len) != 0) return 0;
  return info.id;
}

uint32_t MapId(int map_fd) {
  struct bpf_map_info info;
  memset(&info, 0, sizeof(info));
  uint32_t len = sizeof(info);
  if (bpf_obj_get_info_by_fd(map_fd, &info, &len) != 0) return 0;
  return info.id;
}

// The cookie of the network namespace this thread runs in (the process's: nothing here calls
// setns), or 0 where the kernel does not hand it out (SO_NETNS_COOKIE, Linux 5.14).
uint64_t OwnNetnsCookie() {
  Fd sock(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (sock.get() < 0) Fail(ErrnoMessage("open a socket to read the network namespace cookie", errno));
  uint64_t cookie = 0;
  socklen_t len = sizeof(cookie);
  if (getsockopt(sock.get(), SOL_SOCKET, SO_NETNS_COOKIE, &cookie, &len) != 0) {
    if (errno == ENOPROTOOPT || errno == EINVAL) return 0;
    Fail(ErrnoMessage("read the network namespace cookie", errno));
  }
  return cookie;
}

// Before the programs attach, so that none counts with a stale namespace (a controller that
// moved, a map new to this load). An object without the map (an older build) is left as it is.
uint64_t WriteNodeNetns(bpf_object* obj) {
  bpf_map* map = bpf_object__find_map_by_name(obj, kNodeNetnsMap);
  if (map == nullptr) return 0;
  const uint64_t cookie = OwnNetnsCookie();
  const uint32_t zero = 0;
  if (bpf_map_update_elem(bpf_map__fd(map), &zero, &cookie, BPF_ANY) != 0) {
    Fail(ErrnoMessage(std::string("write map ") + kNodeNetnsMap, errno));
  }
  return cookie;
}

void AttachOne(bpf_program* prog, int cgroup_fd, uint64_t cgroup_id, const std::string& linkDir,
               const std::string& programDir, AttachedProgram* out) {
  const std::string name = bpf_program__name(prog);
  const enum bpf_attach_type type = bpf_program__expected_attach_type(prog);
  const int prog_fd = bpf_program__fd(prog);
  const std::string linkPath = linkDir + "/" + name;
  out->name = name;
  const char* typeName = libbpf_bpf_attach_type_str(type);
  out->attachType = typeName != nullptr ? typeName : std::to_string(type);
  out->programId = ProgramId(prog_fd);

  bool replacing = false;
  if (Exists(linkPath)) {
    Fd old(bpf_obj_get(linkPath.c_str()));
    uint32_t old_id = 0;
    if (old.get() >= 0 && LinkPointsAt(old.get(), cgroup_id, type, &old_id)) {
      // Swapping the program inside the attached link leaves no moment without translation.
      if (bpf_link_update(old.get(), prog_fd, nullptr) != 0) {
        Fail(ErrnoMessage("update pinned link " + linkPath, errno));
      }
      out->linkId = old_id;
      out->link = "updated";
      return;
    }
    replacing = true;
  }

  LibbpfLogCapture log;
  std::unique_ptr<bpf_link, LinkCloser> link(bpf_program__attach_cgroup(prog, cgroup_fd));
  if (!link) Fail(ErrnoMessage("attach " + name + " to the cgroup", errno), &log);
  if (replacing) {
    // The old link pointed at another cgroup (or its cgroup is gone): the new one is attached
    // first, then the old one is detached, so the switch has no gap.
    Fd old(bpf_obj_get(linkPath.c_str()));
    if (old.get() >= 0) bpf_link_detach(old.get());
    if (unlink(linkPath.c_str()) != 0 && errno != ENOENT) Fail(ErrnoMessage("unpin " + linkPath, errno));
  }
  int err = bpf_link__pin(link.get(), linkPath.c_str());
  if (err != 0) {
    // An unpinned link would detach when this process exits: better to fail loudly now.
    bpf_link_detach(bpf_link__fd(link.get()));
    Fail(ErrnoMessage("pin link " + linkPath, err), &log);
  }
  out->linkId = LinkId(bpf_link__fd(link.get()));
  out->link = replacing ? "replaced" : "created";

  const std::string progPath = programDir + "/" + name;
  if (unlink(progPath.c_str()) != 0 && errno != ENOENT) Fail(ErrnoMessage("unpin " + progPath, errno));
  err = bpf_program__pin(prog, progPath.c_str());
  if (err != 0) Fail(ErrnoMessage("pin program " + progPath, err), &log);
}

uint32_t RemoveDirEntries(const std::string& dir, bool detachLinks, uint32_t* detached) {
  uint32_t removed = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return 0;
    Fail(ErrnoMessage("open " + dir, errno));
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(d, closedir);
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    names.push_back(e->d_name);
  }
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    if (detachLinks) {
      // Detaching explicitly also covers a link some other process still holds open.
      Fd link(bpf_obj_get(path.c_str()));
      if (link.get() >= 0 && bpf_link_detach(link.get()) == 0) ++*detached;
    }
    if (unlink(path.c_str()) != 0 && errno != ENOENT) Fail(ErrnoMessage("unpin " + path, errno));
    ++removed;
  }
  return removed;
}

void RemoveDir(const std::string& dir) {
  if (rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    if (errno == ENOTEMPTY) Fail(dir + " holds files this controller did not create: remove them by hand");
    Fail(ErrnoMessage("rmdir " + dir, errno));
  }
}

}  // namespace

LoadResult LoadAndAttach(const std::string& objectPath, const std::string& bpffsPath,
                         const std::string& cgroupPath) {
  LoadResult result;
  RequireBpffs(bpffsPath);
  const std::string mapDir = bpffsPath + "/maps";
  const std::string linkDir = bpffsPath + "/links";
  const std::string programDir = bpffsPath + "/programs";
  MakeDirs(mapDir);
  MakeDirs(linkDir);
  MakeDirs(programDir);

  Fd cgroup(open(cgroupPath.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (cgroup.get() < 0) Fail(ErrnoMessage("open cgroup " + cgroupPath, errno));
  struct statfs fs;
  if (fstatfs(cgroup.get(), &fs) != 0) Fail(ErrnoMessage("statfs " + cgroupPath, errno));
  if (static_cast<unsigned long>(fs.f_type) != CGROUP2_SUPER_MAGIC) {
    Fail(cgroupPath + " is not a cgroup v2 directory: pass --cgroup-path with the cgroup2 mount (see /proc/mounts)");
  }
  result.cgroupId = CgroupId(cgroup.get(), cgroupPath);

  LibbpfLogCapture log;
  std::unique_ptr<bpf_object, ObjectCloser> obj(bpf_object__open_file(objectPath.c_str(), nullptr));
  if (!obj) Fail(ErrnoMessage("open BPF object " + objectPath, errno), &log);

  bpf_map* map;
  bpf_object__for_each_map(map, obj.get()) {
    if (bpf_map__is_internal(map)) continue;
    PinnedMapReport report;
    report.name = bpf_map__name(map);
    report.path = mapDir + "/" + report.name;
    report.reused = Exists(report.path);
    int err = bpf_map__set_pin_path(map, report.path.c_str());
    if (err != 0) Fail(ErrnoMessage("set pin path " + report.path, err), &log);
    result.maps.push_back(report);
  }

  // Re-uses the pinned maps when their definition matches, so entries written by an earlier
  // process stay in force; pins new maps otherwise.
  int err = bpf_object__load(obj.get());
  if (err != 0) {
    Fail(ErrnoMessage("load BPF object " + objectPath, err) +
             " (a pinned map from another version does not match: run with --cleanup first)",
         &log);
  }
  for (PinnedMapReport& report : result.maps) {
    bpf_map* m = bpf_object__find_map_by_name(obj.get(), report.name.c_str());
    if (m != nullptr) report.id = MapId(bpf_map__fd(m));
  }
  result.nodeNetnsCookie = WriteNodeNetns(obj.get());

  bpf_program* prog;
  bpf_object__for_each_program(prog, obj.get()) {
    AttachedProgram attached;
    AttachOne(prog, cgroup.get(), result.cgroupId, linkDir, programDir, &attached);
    result.programs.push_back(attached);
  }
  return result;
}

void CheckLoad(const std::string& objectPath) {
  LibbpfLogCapture log;
  std::unique_ptr<bpf_object, ObjectCloser> obj(bpf_object__open_file(objectPath.c_str(), nullptr));
  if (!obj) Fail(ErrnoMessage("open BPF object " + objectPath, errno), &log);
  int err = bpf_object__load(obj.get());
  if (err != 0) Fail(ErrnoMessage("load BPF object " + objectPath, err), &log);
}

CleanupResult RemovePinned(const std::string& bpffsPath) {
  CleanupResult result;
  if (!Exists(bpffsPath)) return result;
  const std::string linkDir = bpffsPath + "/links";
  const std::string programDir = bpffsPath + "/programs";
  const std::string mapDir = bpffsPath + "/maps";
  result.removedPins += RemoveDirEntries(linkDir, true, &result.detachedLinks);
  result.removedPins += RemoveDirEntries(programDir, false, &result.detachedLinks);
  result.removedPins += RemoveDirEntries(mapDir, false, &result.detachedLinks);
  RemoveDir(linkDir);
  RemoveDir(programDir);
  RemoveDir(mapDir);
  RemoveDir(bpffsPath);
  return result;
}

}  // namespace ebpf_addon
