// A main() for builds without libFuzzer (any compiler, CPUATTN_BUILD_FUZZERS=OFF): runs the fuzz
// target's entry point once on every file given, or on every file of every directory given, so
// the committed seed corpus (and any saved crash) stays exercised by ctest.
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

namespace {

std::vector<std::string> files_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};
  if (!S_ISDIR(st.st_mode)) return {path};
  std::vector<std::string> files;
  if (DIR* dir = ::opendir(path.c_str())) {
    while (const dirent* e = ::readdir(dir)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") files.push_back(path + "/" + name);
    }
    ::closedir(dir);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  int runs = 0;
  for (int a = 1; a < argc; ++a) {
    const std::vector<std::string> files = files_of(argv[a]);
    if (files.empty()) {
      std::fprintf(stderr, "%s: no such file, or an empty directory\n", argv[a]);
      return 1;
    }
    for (const std::string& f : files) {
      std::ifstream in(f, std::ios::binary);
      // An exact-size heap copy, as libFuzzer passes it, so ASan sees reads past the end.
      const std::vector<char> bytes((std::istreambuf_iterator<char>(in)),
                                    std::istreambuf_iterator<char>());
      auto* copy = new std::uint8_t[bytes.size()];
      std::copy(bytes.begin(), bytes.end(), copy);
      std::fprintf(stderr, "running %s (%zu bytes)\n", f.c_str(), bytes.size());
      LLVMFuzzerTestOneInput(copy, bytes.size());
      delete[] copy;
      ++runs;
    }
  }
  std::fprintf(stderr, "%d inputs ran\n", runs);
  return runs > 0 ? 0 : 1;
}
