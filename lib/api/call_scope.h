// The scope every public entry point opens (include/cpuattn/profile.h): it decides whether the
// call is recorded, and when the call returns, prints, keeps or hands out its record.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/recorder.h"
#include "cpuattn/profile.h"

namespace cpuattn::detail {

// The outermost scope on a thread records the call when recording is on; a nested scope (a
// layer's inner calls) adds to the outer one's record through current_recorder().
class CallScope {
 public:
  explicit CallScope(const char* op);
  ~CallScope() = default;
  CallScope(const CallScope&) = delete;
  CallScope& operator=(const CallScope&) = delete;
  // This scope records a call: describe it through record().
  bool active() const { return rec_ != nullptr; }
  CallProfile& record() { return *profile_; }
  // The record's element types: Q (a layer's input), K/V (a cache's storage, a Linear's weight)
  // and out. Does nothing when the scope does not record.
  void set_dtypes(DType q, DType kv, DType out);
  // The call succeeded on `ctx`: measure, then print / keep / hand out its record. A scope left
  // without finish() (an exception) records nothing.
  void finish(Context& ctx);

 private:
  std::unique_ptr<Recorder> rec_;
  std::unique_ptr<CallProfile> profile_;
  std::unique_ptr<CurrentRecorder> current_;
  std::uint64_t t0_ = 0;
  std::int64_t ns0_ = 0;
};

// The mask field of a record: "none" or the '+'-joined kinds.
std::string mask_description(const AttentionOptions& opts);
// "1x16x2048x64"
std::string dims_of(const TensorView& t);

}  // namespace cpuattn::detail
