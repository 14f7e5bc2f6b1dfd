#include "files.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace cpuattn::files {

namespace {

[[noreturn]] void fail(const std::string& path, const std::string& why) {
  throw Error(display(path) + ": " + why);
}

std::string errno_text(int err) { return std::strerror(err); }

std::string dir_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string base_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// ---- Temporaries removed on SIGINT / SIGTERM / SIGHUP -----------------------------------------
// A fixed table of plain char arrays: the handler may only call async-signal-safe functions, so
// it reads no std::string and takes no lock. A slot is published by writing its path first and
// then setting `used` (atomic), and withdrawn by clearing `used` before the path is reused.

constexpr int kSlots = 32;
char g_paths[kSlots][PATH_MAX];
std::atomic<bool> g_used[kSlots];
std::mutex g_slots_mutex;  // between threads that register (never taken by the handler)

extern "C" void remove_temporaries_and_reraise(int sig) {
  for (int i = 0; i < kSlots; ++i) {
    if (g_used[i].load()) ::unlink(g_paths[i]);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

void install_handlers_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      ::sigaction(sig, nullptr, &old);
      // A signal the program ignores (nohup) or handles itself stays as it is.
      if (old.sa_handler != SIG_DFL) continue;
      struct sigaction sa {};
      sa.sa_handler = remove_temporaries_and_reraise;
      ::sigemptyset(&sa.sa_mask);
      ::sigaction(sig, &sa, nullptr);
    }
  });
}

// Returns the slot, or -1 if the path is too long or every slot is taken (then the temporary is
// still removed on every other path, only not by a signal).
int register_temporary(const std::string& path) {
  install_handlers_once();
  if (path.size() >= PATH_MAX) return -1;
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (!g_used[i].load()) {
      std::memcpy(g_paths[i], path.c_str(), path.size() + 1);
      g_used[i].store(true);
      return i;
    }
  }
  return -1;
}

void unregister_temporary(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_slots_mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (g_used[i].load() && path == g_paths[i]) g_used[i].store(false);
  }
}

void remove_temporary(const std::string& tmp) {
  if (tmp.empty()) return;
  ::unlink(tmp.c_str());
  unregister_temporary(tmp);
}

void write_all(int fd, std::string_view bytes, const std::string& path) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      // A FIFO opened non-blocking whose reader is slow: wait for room.
      const int flags = ::fcntl(fd, F_GETFL);
      if (flags >= 0 && (flags & O_NONBLOCK) && ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK) == 0)
        continue;
    }
    if (n <= 0) fail(path, "cannot write: " + errno_text(n < 0 ? errno : EIO));
    done += static_cast<std::size_t>(n);
  }
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // durability is best effort where the directory cannot be opened
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

std::string display(std::string_view s) {
  constexpr std::size_t kMax = 200, kHead = 100, kTail = 97;
  std::string cut;
  if (s.size() > kMax) {
    cut = std::string(s.substr(0, kHead)) + "..." + std::string(s.substr(s.size() - kTail));
    s = cut;
  }
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  return out;
}

std::string resolve(const std::string& path) {
  std::string p = path;
  for (int hops = 0; hops <= 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string target(PATH_MAX, '\0');
    const ssize_t n = ::readlink(p.c_str(), target.data(), target.size());
    if (n < 0) fail(path, "cannot read the symbolic link: " + errno_text(errno));
    target.resize(static_cast<std::size_t>(n));
    p = (target.empty() || target[0] == '/') ? target : dir_of(p) + "/" + target;
  }
  fail(path, "too many levels of symbolic links");
}

bool same_file(const std::string& a, const std::string& b) {
  const std::string ra = resolve(a), rb = resolve(b);
  struct stat sa {
  }, sb{};
  const bool ea = ::stat(ra.c_str(), &sa) == 0, eb = ::stat(rb.c_str(), &sb) == 0;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  if (ea != eb) return false;
  // Neither exists yet: the same name in the same directory.
  struct stat da {
  }, db{};
  if (::stat(dir_of(ra).c_str(), &da) != 0 || ::stat(dir_of(rb).c_str(), &db) != 0) {
    return ra == rb;
  }
  return da.st_dev == db.st_dev && da.st_ino == db.st_ino && base_of(ra) == base_of(rb);
}

std::pair<int, std::size_t> open_input(const std::string& path) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) fail(path, "cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(path, "cannot stat: " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, std::string("is ") + kind_of(st.st_mode) + ", not a regular file");
  }
  return {fd, static_cast<std::size_t>(st.st_size)};
}

void read_exact(int fd, unsigned char* out, std::size_t n, const std::string& path) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, out + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) fail(path, "cannot read: " + errno_text(errno));
    if (r == 0) fail(path, "the file shrank while it was being read");
    got += static_cast<std::size_t>(r);
  }
}

OutputFiles::~OutputFiles() {
  for (Staged& s : staged_) {
    if (!committed_) remove_temporary(s.tmp);
    if (s.special_fd >= 0) ::close(s.special_fd);
  }
}

void OutputFiles::stage(const std::string& path, std::string_view bytes) {
  if (committed_) throw Error("internal: stage() after commit()");
  if (path.empty()) throw Error("empty output path");
  if (path.back() == '/') fail(path, "is a directory, not a file name");
  Staged s;
  s.path = path;
  s.target = resolve(path);
  struct stat st {};
  const bool exists = ::stat(s.target.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) fail(path, "is a directory, not a file name");
  if (exists && !S_ISREG(st.st_mode)) {
    if (S_ISSOCK(st.st_mode)) fail(path, "is a socket; cannot write to it");
    // Opened now, so that a FIFO without a reader or a device we may not write is an error
    // before any output is committed; written at commit.
    s.special_fd = ::open(s.target.c_str(), O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
    if (s.special_fd < 0) {
      if (errno == ENXIO) fail(path, "is a FIFO with no reader; start the reader first");
      fail(path, std::string("cannot open ") + kind_of(st.st_mode) + ": " + errno_text(errno));
    }
    s.bytes.assign(bytes.data(), bytes.size());
    staged_.push_back(std::move(s));
    return;
  }

  static std::atomic<unsigned> counter{0};
  const std::string dir = dir_of(s.target);
  int fd = -1;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    char name[64];
    std::snprintf(name, sizeof name, "/.cpuattn-%ld-%u", static_cast<long>(::getpid()),
                  counter.fetch_add(1));
    s.tmp = dir + name;
    // Registered before it exists, so that a signal between open() and registration cannot
    // leave it behind.
    register_temporary(s.tmp);
    // 0666 & ~umask, as a new file gets; an existing file's mode is copied below.
    fd = ::open(s.tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0) {
      const int err = errno;
      unregister_temporary(s.tmp);
      if (err != EEXIST) {
        s.tmp.clear();
        fail(path, "cannot create a temporary file in " + display(dir) + ": " + errno_text(err));
      }
    }
  }
  if (fd < 0) {
    s.tmp.clear();
    fail(path, "cannot create a temporary file in " + display(dir));
  }
  std::string error;  // the first failure, a whole message naming `path`
  const auto failed = [&](const std::string& why) {
    if (error.empty()) error = display(path) + ": " + why + errno_text(errno);
  };
  try {
    write_all(fd, bytes, path);
  } catch (const Error& e) {
    error = e.what();
  }
  if (error.empty() && exists) {
    if (::fchmod(fd, st.st_mode & 07777) != 0) failed("cannot set the mode: ");
    if (error.empty() && ::geteuid() == 0 && ::fchown(fd, st.st_uid, st.st_gid) != 0)
      failed("cannot set the owner: ");
  }
  if (error.empty() && ::fsync(fd) != 0) failed("cannot write: ");
  if (::close(fd) != 0) failed("cannot write: ");
  if (!error.empty()) {
    remove_temporary(s.tmp);
    throw Error(error);
  }
  staged_.push_back(std::move(s));
}

void OutputFiles::commit() {
  if (committed_) return;
  committed_ = true;
  std::vector<std::string> dirs;
  std::string error;
  for (Staged& s : staged_) {
    if (!error.empty()) {
      remove_temporary(s.tmp);
      continue;
    }
    if (s.special_fd >= 0) {
      try {
        write_all(s.special_fd, s.bytes, s.path);
      } catch (const Error& e) {
        error = e.what();
      }
      continue;
    }
    if (::rename(s.tmp.c_str(), s.target.c_str()) != 0) {
      error =
          display(s.path) + ": cannot rename the temporary file into place: " + errno_text(errno);
      remove_temporary(s.tmp);
      continue;
    }
    unregister_temporary(s.tmp);
    dirs.push_back(dir_of(s.target));
  }
  for (const std::string& d : dirs) fsync_dir(d);
  if (!error.empty()) throw Error(error);
}

void write_file(const std::string& path, std::string_view bytes) {
  OutputFiles out;
  out.stage(path, bytes);
  out.commit();
}

}  // namespace cpuattn::files
