#include "counters.h"

#include <linux/perf_event.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace cpuattn::cli {
namespace {

int open_event(std::uint32_t type, std::uint64_t config) {
  perf_event_attr a{};
  a.size = sizeof a;
  a.type = type;
  a.config = config;
  a.disabled = 1;
  a.exclude_kernel = 1;  // allowed at perf_event_paranoid 2 for one's own threads
  a.exclude_hv = 1;
  return static_cast<int>(::syscall(SYS_perf_event_open, &a, 0 /* this thread */, -1, -1, 0));
}

}  // namespace

ThreadCounters::ThreadCounters(tbb::task_arena& arena) : tbb::task_scheduler_observer(arena) {
  events_ = {
      {"cycles", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES},
      {"instructions", PERF_TYPE_HARDWARE, PERF_COUNT_HW_INSTRUCTIONS},
      {"cache_references", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_REFERENCES},
      {"cache_misses", PERF_TYPE_HARDWARE, PERF_COUNT_HW_CACHE_MISSES},
      {"l1d_read_misses", PERF_TYPE_HW_CACHE,
       PERF_COUNT_HW_CACHE_L1D | (PERF_COUNT_HW_CACHE_OP_READ << 8) |
           (PERF_COUNT_HW_CACHE_RESULT_MISS << 16)},
      {"task_clock_ns", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_TASK_CLOCK},
      {"context_switches", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CONTEXT_SWITCHES},
      {"cpu_migrations", PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_MIGRATIONS},
  };
  observe(true);
}

ThreadCounters::~ThreadCounters() {
  observe(false);
  for (const auto& t : fds_)
    for (int fd : t)
      if (fd >= 0) ::close(fd);
}

void ThreadCounters::on_scheduler_entry(bool) {
  const long tid = ::syscall(SYS_gettid);
  const std::lock_guard<std::mutex> lock(mu_);
  for (long t : tids_)
    if (t == tid) return;  // counters of this thread are open already
  std::vector<int> fds;
  for (const Event& e : events_) {
    const int fd = open_event(e.type, e.config);
    if (fd < 0) {
      std::string& why = e.type == PERF_TYPE_SOFTWARE ? sw_why_ : hw_why_;
      if (why.empty())
        why = std::string("perf_event_open(") + e.name + "): " + std::strerror(errno);
    } else if (enabled_) {
      ::ioctl(fd, PERF_EVENT_IOC_ENABLE, 0);
    }
    fds.push_back(fd);
  }
  tids_.push_back(tid);
  fds_.push_back(std::move(fds));
}

void ThreadCounters::enable() { set_enabled(true); }
void ThreadCounters::disable() { set_enabled(false); }

void ThreadCounters::set_enabled(bool on) {
  const std::lock_guard<std::mutex> lock(mu_);
  enabled_ = on;
  for (const auto& t : fds_)
    for (int fd : t)
      if (fd >= 0) ::ioctl(fd, on ? PERF_EVENT_IOC_ENABLE : PERF_EVENT_IOC_DISABLE, 0);
}

std::vector<ThreadCounters::Value> ThreadCounters::read() const {
  const std::lock_guard<std::mutex> lock(mu_);
  std::vector<Value> out;
  for (std::size_t e = 0; e < events_.size(); ++e) {
    double sum = 0;
    bool all = !fds_.empty();
    for (const auto& t : fds_) {
      std::uint64_t v = 0;
      if (t[e] < 0 || ::read(t[e], &v, sizeof v) != static_cast<ssize_t>(sizeof v)) {
        all = false;
        break;
      }
      sum += static_cast<double>(v);
    }
    if (all) out.push_back({events_[e].name, sum});
  }
  return out;
}

}  // namespace cpuattn::cli
