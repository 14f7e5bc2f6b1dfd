// What machine and build a benchmark record was measured on: CPU model and vendor, logical CPUs,
// per-core cache sizes (as this program reads them at run time), library version and revision.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace cpuattn::cli {

struct Machine {
  std::string cpu = "unknown", vendor = "unknown";
  int logical_cpus = 0;
  std::int64_t l1d_bytes = 0, l2_bytes = 0, l3_bytes = 0;  // 0: not reported
  std::string version, revision;
};

const Machine& this_machine();
// The "machine" object of a benchmark or profile record: cpu, vendor, logical_cpus, l1d_kib,
// l2_kib, l3_kib.
nlohmann::ordered_json machine_json();

}  // namespace cpuattn::cli
