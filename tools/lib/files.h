// How the cpuattn tool reads and writes files, so that a failed or interrupted command never
// leaves a partial or clobbered output and never hangs on a special file.
//
// Outputs (OutputFiles):
//   * A regular file, or a path that does not exist yet, is written to a temporary file in the
//     same directory (a short name, ".cpuattn-<pid>-<n>", so a legal OUT never makes an illegal
//     temporary name), fsync'd, and renamed over the path at commit; the directory is fsync'd
//     after the rename. An existing file keeps its permission bits, and, when run as root, its
//     owner and group.
//   * A symlink is followed (a chain too, relative or absolute, at most 40 links): the file it
//     points to is replaced atomically in that file's directory and the link stays a link. A
//     dangling link creates the file it names, as shell redirection does.
//   * An existing FIFO, character device or other special file is written in place with plain
//     writes, as numpy.save, cp and shell redirection do (atomic replacement means nothing there).
//     A FIFO is opened without blocking: with no reader it is an error, not a hang. A directory
//     or a socket is an error.
//   * All outputs of one command are staged first and committed together: if any of them cannot
//     be staged, none is written. Temporaries are removed on failure, on destruction and on
//     SIGINT, SIGTERM and SIGHUP.
// Inputs (open_input): opened without blocking and checked to be regular files before a byte is
// read, so a FIFO or a device given as an input is a clear error.
// Messages (display): paths are shown with control characters escaped and long ones shortened.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace cpuattn::files {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// `s` for a message: bytes below 0x20 and 0x7f as \xNN (so no escape sequence reaches a
// terminal), and if longer than 200 bytes, its first 100 and last 97 bytes around "...".
std::string display(std::string_view s);

// The path `path` names after following symlinks (at most 40); the result may not exist yet.
// Throws Error for a loop or a path that cannot be resolved.
std::string resolve(const std::string& path);

// Whether two paths name the same file: same device and inode when both exist, else the same
// directory (device and inode) and the same final name after resolve().
bool same_file(const std::string& a, const std::string& b);

// Opens `path` for reading without blocking and checks that it is a regular file. Returns the
// descriptor and the file's size. Throws Error("<path>: ...") otherwise.
std::pair<int, std::size_t> open_input(const std::string& path);
// Reads exactly n bytes from fd into out; Error("<path>: ...") if the file ends first. Every
// files::Error message starts with the path it concerns.
void read_exact(int fd, unsigned char* out, std::size_t n, const std::string& path);

class OutputFiles {
 public:
  OutputFiles() = default;
  ~OutputFiles();  // removes the temporaries of an uncommitted set
  OutputFiles(const OutputFiles&) = delete;
  OutputFiles& operator=(const OutputFiles&) = delete;

  // Stages `bytes` for `path` (see above). Throws Error("<path>: ...") and leaves `path` as it was.
  void stage(const std::string& path, std::string_view bytes);
  // Moves every staged output into place (renames, then writes to special files). An error here
  // is reported for the output it concerns; the outputs already renamed stay.
  void commit();

 private:
  struct Staged {
    std::string path;     // as given, for messages
    std::string target;   // the file written: `path` with symlinks followed
    std::string tmp;      // the temporary (empty for a special file)
    int special_fd = -1;  // an open special file, written at commit
    std::string bytes;    // for a special file: what to write at commit
  };
  std::vector<Staged> staged_;
  bool committed_ = false;
};

// Writes one file: stage + commit.
void write_file(const std::string& path, std::string_view bytes);

}  // namespace cpuattn::files
