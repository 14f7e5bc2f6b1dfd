// Issue 11 through the `cpuattn` binary: what happens to outputs that are symlinks, special
// files or existing files; commands whose outputs are all written or none; special and huge
// input files; paths in messages; and the CLI's view of the scale range and thread count. Each
// test failed on the tool before the fix (see the comment on each).
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "cli_test_util.h"
#include "files.h"
#include "heatmap.h"

namespace cpuattn::cli_test {
namespace {

class CliHardening : public CliTest {
 protected:
  void SetUp() override {
    CliTest::SetUp();
    const npy::Array q =
        make({3, 4}, {0.1, -0.2, 0.3, 0.4, 0.5, 0.6, -0.7, 0.8, 0.9, 1.0, 1.1, 1.2});
    put("q.npy", q);
  }
  // A run whose only output is `out` (relative to the temporary directory).
  std::string run_to(const std::string& out) const {
    return "run --q q.npy --k q.npy --v q.npy --out " + out;
  }
  std::vector<std::string> temporaries() const {
    std::vector<std::string> names;
    if (DIR* d = ::opendir(dir_.c_str())) {
      while (dirent* e = ::readdir(d)) {
        if (std::string(e->d_name).rfind(".cpuattn-", 0) == 0) names.push_back(e->d_name);
      }
      ::closedir(d);
    }
    return names;
  }
  mode_t mode_of(const std::string& name) const {
    struct stat st {};
    ::lstat(path(name).c_str(), &st);
    return st.st_mode;
  }
};

// ---- 1. Outputs: symlinks, special files, permissions, names, signals -------------------------

TEST_F(CliHardening, SymlinkOutputIsFollowedAndStaysALink) {
  // Before: the link was replaced by a regular file and its target kept the old contents.
  put("target.npy", make({1}, {42}));
  ASSERT_EQ(::symlink("target.npy", path("out.npy").c_str()), 0);
  const Result r = run(run_to("out.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(S_ISLNK(mode_of("out.npy")));
  EXPECT_EQ(get("target.npy").shape, (Shape{3, 4}));
}

TEST_F(CliHardening, SymlinkChainAndDanglingLinkCreateTheTarget) {
  ASSERT_EQ(::mkdir(path("sub").c_str(), 0755), 0);
  ASSERT_EQ(::symlink("sub/real.npy", path("link2").c_str()), 0);  // dangling
  ASSERT_EQ(::symlink(path("link2").c_str(), path("link1").c_str()), 0);
  const Result r = run(run_to("link1"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(S_ISLNK(mode_of("link1")));
  EXPECT_TRUE(S_ISLNK(mode_of("link2")));
  EXPECT_EQ(get("sub/real.npy").shape, (Shape{3, 4}));
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(CliHardening, FifoOutputIsWrittenInPlace) {
  // Before: the FIFO was replaced by a regular file.
  ASSERT_EQ(::mkfifo(path("out.fifo").c_str(), 0644), 0);
  // A reader that is present but reads only after the tool has exited (the output fits the
  // pipe's buffer): no thread, no timing.
  const int fd = ::open(path("out.fifo").c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(fd, 0);
  const Result r = run(run_to("out.fifo"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::vector<unsigned char> bytes(1 << 16);
  const ssize_t n = ::read(fd, bytes.data(), bytes.size());
  ::close(fd);
  ASSERT_GT(n, 0);
  EXPECT_EQ(npy::parse(bytes.data(), static_cast<std::size_t>(n)).shape, (Shape{3, 4}));
  EXPECT_TRUE(S_ISFIFO(mode_of("out.fifo")));
}

TEST_F(CliHardening, FifoWithoutReaderIsAnErrorNotAHang) {
  ASSERT_EQ(::mkfifo(path("out.fifo").c_str(), 0644), 0);
  // Under `timeout`: before, opening the FIFO would have waited for a reader forever.
  const std::string cmd = "cd '" + dir_ + "' && timeout 20 '" CPUATTN_CLI_PATH "' " +
                          run_to("out.fifo") + " 2>'" + path("err.txt") + "'";
  const int status = std::system(cmd.c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
  EXPECT_NE(slurp(path("err.txt")).find("FIFO with no reader"), std::string::npos)
      << slurp(path("err.txt"));
  EXPECT_TRUE(S_ISFIFO(mode_of("out.fifo")));
}

TEST_F(CliHardening, CharacterDeviceOutputIsWrittenInPlace) {
  // Before, as root, `--out /dev/null` replaced the system's /dev/null with a regular file. Here
  // on a private node with /dev/null's numbers, when this process may create one.
  if (::geteuid() != 0 || ::mknod(path("null").c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0) {
    GTEST_SKIP() << "cannot create a device node here";
  }
  const Result r = run(run_to("null"));
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(S_ISCHR(mode_of("null")));
}

TEST_F(CliHardening, ExistingFileKeepsItsMode) {
  // Before: a 0600 output became 0644 (the temporary's mode).
  put("out.npy", make({1}, {1}));
  ASSERT_EQ(::chmod(path("out.npy").c_str(), 0600), 0);
  const Result r = run(run_to("out.npy"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(mode_of("out.npy") & 07777, 0600u);
  EXPECT_EQ(get("out.npy").shape, (Shape{3, 4}));
}

TEST_F(CliHardening, LongestLegalNameWorks) {
  // Before: the temporary's name (".<name>.tmp-<pid>-<n>") was longer than NAME_MAX.
  const std::string name = std::string(251, 'o') + ".npy";
  const Result r = run(run_to(name));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(get(name).shape, (Shape{3, 4}));
}

TEST_F(CliHardening, TemporariesAreRemovedOnSigterm) {
  // A staged output and then SIGTERM, in a child: the handler removes the temporary and the
  // child still dies of the signal.
  const std::string out = path("x.npy");
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    files::OutputFiles outputs;
    outputs.stage(out, "not committed");
    ::raise(SIGTERM);
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
  EXPECT_TRUE(temporaries().empty());
  EXPECT_FALSE(exists(out));
}

// ---- 2. Outputs of one command: all or none; never the same file twice ------------------------

TEST_F(CliHardening, FailedRunWritesNoneOfItsOutputs) {
  // Before: --weights was written before --out failed.
  put("w.npy", make({1}, {5}));
  run_bad("--q q.npy --k q.npy --v q.npy --weights w.npy --lse new_lse.npy --out nodir/o.npy");
  EXPECT_EQ(get("w.npy").shape, (Shape{1})) << "an existing --weights was replaced";
  EXPECT_FALSE(exists(path("new_lse.npy")));
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(CliHardening, SameFileUnderTwoNamesIsAnError) {
  // Before: the later output silently overwrote the earlier one.
  std::string err = run_bad("--q q.npy --k q.npy --v q.npy --weights ./o.npy --out o.npy");
  EXPECT_NE(err.find("are the same file"), std::string::npos) << err;
  // An output over an input, through a symlink.
  ASSERT_EQ(::symlink("q.npy", path("alias.npy").c_str()), 0);
  err = run_bad("--q q.npy --k q.npy --v q.npy --out alias.npy");
  EXPECT_NE(err.find("--out"), std::string::npos) << err;
  EXPECT_NE(err.find("--q"), std::string::npos) << err;
  EXPECT_EQ(get("q.npy").shape, (Shape{3, 4}));
}

TEST_F(CliHardening, HeatmapKeepsAnExistingSvgWhenThePngFails) {
  // Before: the SVG was written, then deleted when the PNG failed, taking the old SVG with it.
  put("w.npy", make({2, 2}, {0.5, 0.5, 0.2, 0.8}));
  std::FILE* f = std::fopen(path("rows.txt").c_str(), "w");
  std::fputs("a\nb\n", f);
  std::fclose(f);
  f = std::fopen(path("heat.svg").c_str(), "w");
  std::fputs("old", f);
  std::fclose(f);
  ASSERT_EQ(::mkdir(path("heat.png").c_str(), 0755), 0);  // the PNG cannot be written
  subcommand_ = "heatmap ";
  run_bad("--weights w.npy --out heat.png --row-labels rows.txt");
  EXPECT_EQ(slurp(path("heat.svg")), "old");
  EXPECT_TRUE(temporaries().empty());
}

TEST_F(CliHardening, HeatmapSvgNeverOverwritesAnInput) {
  // Before: labels in lab.svg with --out lab.png replaced the labels file with the SVG.
  put("w.npy", make({2, 2}, {0.5, 0.5, 0.2, 0.8}));
  std::FILE* f = std::fopen(path("lab.svg").c_str(), "w");
  std::fputs("a\nb\n", f);
  std::fclose(f);
  subcommand_ = "heatmap ";
  const std::string err = run_bad("--weights w.npy --out lab.png --row-labels lab.svg");
  EXPECT_NE(err.find("the same file"), std::string::npos) << err;
  EXPECT_EQ(slurp(path("lab.svg")), "a\nb\n");
  EXPECT_FALSE(exists(path("lab.png")));
}

// ---- 3. Special and huge input files ----------------------------------------------------------

TEST_F(CliHardening, FifoInputIsAnErrorNotAHang) {
  // Before: open() waited for a writer forever; `timeout` turns that into exit code 124 here.
  ASSERT_EQ(::mkfifo(path("q.fifo").c_str(), 0644), 0);
  put("w.npy", make({2, 2}, {0.5, 0.5, 0.2, 0.8}));
  for (const std::string args : {"run --q q.fifo --k q.npy --v q.npy --out out.npy",
                                 "heatmap --weights w.npy --out h.png --row-labels q.fifo"}) {
    const std::string cmd = "cd '" + dir_ + "' && timeout 20 '" CPUATTN_CLI_PATH "' " + args +
                            " 2>'" + path("err.txt") + "'";
    const int status = std::system(cmd.c_str());
    EXPECT_EQ(WEXITSTATUS(status), 2) << args;
    EXPECT_NE(slurp(path("err.txt")).find("is a FIFO, not a regular file"), std::string::npos)
        << slurp(path("err.txt"));
    EXPECT_FALSE(exists(path("out.npy")));
    EXPECT_FALSE(exists(path("h.png")));
  }
}

TEST_F(CliHardening, DeviceAndHugeLabelsAreRefusedBeforeReading) {
  // Before: /dev/zero as a labels file was read until 1 GB had been buffered.
  put("w.npy", make({2, 2}, {0.5, 0.5, 0.2, 0.8}));
  subcommand_ = "heatmap ";
  std::string err = run_bad("--weights w.npy --out h.png --row-labels /dev/zero");
  EXPECT_NE(err.find("character device"), std::string::npos) << err;
  const int fd = ::open(path("big.txt").c_str(), O_WRONLY | O_CREAT, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(heatmap::kMaxLabelsBytes + 1)), 0);  // sparse
  ::close(fd);
  err = run_bad("--weights w.npy --out h.png --row-labels big.txt");
  EXPECT_NE(err.find("at most"), std::string::npos) << err;
}

TEST_F(CliHardening, SparseHugeNpyFailsOnItsSizeWithoutAllocatingIt) {
  // A valid header for 2 floats followed by 3 GB of holes. Before: read() allocated the file's
  // size first, so under a 1 GB address-space limit it failed with "out of memory" (and without
  // one it allocated 3 GB). The child has that limit; the parent checks the message.
  const std::string p = put("sparse.npy", make({2}, {1, 2}));
  ASSERT_EQ(::truncate(p.c_str(), off_t{3} << 30), 0);
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(pipe_fds[0]);
    // Under AddressSanitizer the process already maps far more than 1 GB (its shadow), so with
    // the limit set every new mapping fails, and its allocator maps each size class on first
    // use: the error path's own strings then fail ("allocator is out of memory", seen for a
    // 153-byte message). Touch the small size classes first; without ASan this changes nothing.
    for (std::size_t n = 16; n <= std::size_t{64} << 10; n += n < 4096 ? 16 : n / 8)
      ::operator delete(::operator new(n));
    const rlimit lim{rlim_t{1} << 30, rlim_t{1} << 30};
    ::setrlimit(RLIMIT_AS, &lim);
    std::string msg = "no error";
    try {
      npy::read(p);
    } catch (const npy::Error& e) {
      msg = e.what();
    }
    (void)!::write(pipe_fds[1], msg.data(), msg.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string msg;
  char buf[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buf, sizeof buf)) > 0;) msg.append(buf, n);
  ::close(pipe_fds[0]);
  ::waitpid(pid, nullptr, 0);
  EXPECT_NE(msg.find("trailing bytes"), std::string::npos) << msg;
}

// ---- 4. Paths in messages ---------------------------------------------------------------------

TEST_F(CliHardening, PathsInMessagesAreEscapedAndShortened) {
  // Before: the escape sequence reached the terminal, and a 100 KB path was printed whole.
  std::string err =
      run_bad("--q \"$(printf '\\033[31mred.npy')\" --k q.npy --v q.npy --out out.npy");
  EXPECT_EQ(err.find('\x1b'), std::string::npos) << err;
  EXPECT_NE(err.find("\\x1b[31mred.npy"), std::string::npos) << err;
  err = run_bad("--q " + std::string(100000, 'p') + ".npy --k q.npy --v q.npy --out out.npy");
  EXPECT_LT(err.size(), 1000u);
  EXPECT_NE(err.find("..."), std::string::npos) << err.substr(0, 300);
}

// ---- Findings 4 and 7 through the tool --------------------------------------------------------

TEST_F(CliHardening, ScaleFloat32CannotHoldIsExit2) {
  // Before: exit 0 and an all-NaN output.
  std::string err = run_bad("--q q.npy --k q.npy --v q.npy --out out.npy --scale 1e39");
  EXPECT_NE(err.find("--scale"), std::string::npos) << err;
  err = run_bad("--q q.npy --k q.npy --v q.npy --out out.npy --temperature 1e-39");
  EXPECT_NE(err.find("--temperature"), std::string::npos) << err;
}

TEST_F(CliHardening, MoreThreadsThanCoresKeepsStderrEmpty) {
  // Before: oneTBB's "number of workers is currently limited" warning on stderr.
  const npy::Array out = run_ok("--q q.npy --k q.npy --v q.npy --out out.npy --threads 64");
  EXPECT_EQ(out.shape, (Shape{3, 4}));
}

// Issue 33, item 6: a float64 input beyond float32's range is exit 2 naming the file, the element
// and its value, with nothing written (it became inf, and the output NaN, with exit 0).
TEST_F(CliHardening, Float64BeyondFloat32IsAnErrorNamingTheElement) {
  put("big.npy",
      make({3, 4}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1e39, 0.9, 1.0, 1.1, 1.2}, DType::f64));
  const std::string err = run_bad("--q q.npy --k big.npy --v q.npy --out out.npy");
  EXPECT_NE(err.find("K (big.npy): element [1,3] = 1e+39 is beyond float32's range"),
            std::string::npos)
      << err;
  put("sinks.npy", make({1}, {-1e39}, DType::f64));
  const std::string err2 = run_bad("--q q.npy --k q.npy --v q.npy --out out.npy --sinks sinks.npy");
  EXPECT_NE(err2.find("element [0] = -1e+39"), std::string::npos) << err2;
}

}  // namespace
}  // namespace cpuattn::cli_test
