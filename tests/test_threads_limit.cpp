// Issue 11, finding 7: a Context of more threads than the machine runs made oneTBB print
// "TBB Warning: The number of workers is currently limited to ..." on stderr, so any program
// (and the CLI with --threads N) printed noise where only errors belong. oneTBB prints it once
// per process, so this is the only test of its executable and captures stderr around one call.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <thread>

#include "test_util.h"

namespace cpuattn::test {
namespace {

TEST(Threads, MoreThreadsThanCoresPrintNothingAndGiveTheSameResult) {
  const int n = static_cast<int>(std::thread::hardware_concurrency()) * 4 + 3;
  const auto q = random_floats(2 * 3 * 70 * 16, 8);
  std::vector<float> a(q.size()), b(q.size());
  const TensorView qv = f32_view(q.data(), {2, 3, 70, 16});

  std::fflush(stderr);
  std::FILE* capture = std::tmpfile();
  ASSERT_NE(capture, nullptr);
  const int saved = ::dup(2);
  ::dup2(::fileno(capture), 2);
  {
    Context many(n);
    EXPECT_EQ(many.num_threads(), n);
    attention(qv, qv, qv, f32_view(a.data(), {2, 3, 70, 16}), {}, &many);
  }
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  std::string err;
  std::rewind(capture);
  for (int c; (c = std::fgetc(capture)) != EOF;) err += static_cast<char>(c);
  std::fclose(capture);
  EXPECT_EQ(err, "") << "stderr is for errors";

  Context one(1);
  attention(qv, qv, qv, f32_view(b.data(), {2, 3, 70, 16}), {}, &one);
  EXPECT_EQ(a, b) << "the thread count must not change results";
}

}  // namespace
}  // namespace cpuattn::test
