// What machine and build a benchmark record was measured on: CPU model and vendor, logical CPUs,
// per-core cache sizes (as this program reads them at run time), library version and revision.
#pragma once

#include <cstdint>
#include <string>

namespace cpuattn::cli {

struct Machine {
  std::string cpu = "unknown", vendor = "unknown";
  int logical_cpus = 0;
  std::int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // 0: not reported
  std::string version, revision;
};

const Machine& this_machine();

}  // namespace cpuattn::cli
