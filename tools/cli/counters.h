// Per-thread performance counters through perf_event_open(2), for `cpuattn profile`: every thread
// that joins the observed oneTBB arena gets its own counters (hardware events are per thread;
// inherited counters would only report worker threads at their exit), summed on read.
// Hardware events are often absent in VMs (the hypervisor exposes no PMU); the software events
// (task clock, context switches, migrations) are there whenever perf_event_open is allowed.
#pragma once

#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace cpuattn::cli {

class ThreadCounters : public tbb::task_scheduler_observer {
 public:
  explicit ThreadCounters(tbb::task_arena& arena);
  ~ThreadCounters() override;
  void on_scheduler_entry(bool worker) override;

  void enable();
  void disable();

  struct Value {
    std::string name;
    double value;
  };
  // Events that opened on every observed thread, summed over the threads.
  std::vector<Value> read() const;
  // Empty when hardware events are counted; else why not (the errno of the first failure).
  const std::string& hardware_unavailable() const { return hw_why_; }
  const std::string& software_unavailable() const { return sw_why_; }

 private:
  struct Event {
    const char* name;
    std::uint32_t type;
    std::uint64_t config;
  };
  void set_enabled(bool on);
  std::vector<Event> events_;
  mutable std::mutex mu_;
  std::vector<std::vector<int>> fds_;  // per thread, per event (-1: failed)
  std::vector<long> tids_;
  std::string hw_why_, sw_why_;
  bool enabled_ = false;
};

}  // namespace cpuattn::cli
