#include "machine.h"

#include <unistd.h>

#include <fstream>
#include <string>
#include <thread>

#include "build_info.h"

namespace cpuattn::cli {
namespace {

// The value of the first "<key>\t: value" line of /proc/cpuinfo.
std::string cpuinfo(const std::string& key) {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return "unknown";
}

std::int64_t cache(int name) {
  const long v = ::sysconf(name);
  return v > 0 ? v : 0;
}

}  // namespace

const Machine& this_machine() {
  static const Machine m = [] {
    Machine r;
    r.cpu = cpuinfo("model name");
    r.vendor = cpuinfo("vendor_id");
    r.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
#ifdef _SC_LEVEL1_DCACHE_SIZE
    r.l1d_bytes = cache(_SC_LEVEL1_DCACHE_SIZE);
    r.l2_bytes = cache(_SC_LEVEL2_CACHE_SIZE);
    r.l3_bytes = cache(_SC_LEVEL3_CACHE_SIZE);
#endif
    r.version = CPUATTN_VERSION_STRING;
    r.revision = CPUATTN_GIT_REVISION;
    return r;
  }();
  return m;
}

nlohmann::ordered_json machine_json() {
  const Machine& m = this_machine();
  return {{"cpu", m.cpu},
          {"vendor", m.vendor},
          {"logical_cpus", m.logical_cpus},
          {"l1d_kib", m.l1d_bytes / 1024},
          {"l2_kib", m.l2_bytes / 1024},
          {"l3_kib", m.l3_bytes / 1024}};
}

}  // namespace cpuattn::cli
