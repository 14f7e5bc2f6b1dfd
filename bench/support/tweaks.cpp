#include "tweaks.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <string>
#include <vector>

#include "api/context_impl.h"
#include "kernels/flash/config.h"

namespace cpuattn {
namespace {

using detail::OutUnit;
using detail::Plan;

struct Tweak {
  const char* name;
  void (*apply)(Plan&);  // null: the shipped plan
};

// Each keeps the plan valid for any problem: the prefetch budget is any size, the streamed
// epilogue writes plainly every row that is not whole aligned vectors (epilogue-inl.h), and a
// tiled block may always pack its f32 V (the P V tile then sums the same products in the same
// order: config.cpp, choose_block), as it may read in place V that the plan packs only for L1's
// sets (BlockPath::v_in_place_declined), and the output epilogue can write any row the P V tiles
// would (the same product of Acc and the row's scale). Streamed K may always go in runs (the
// four-key dot over each run, the same sums as one stream's), and as one stream with k_ahead
// where the plan declined that only by the vendor rule (BlockPath::k_ahead_declined). Runs may
// prefetch any number of the runs read next, or none.
constexpr Tweak kTweaks[] = {
    {"none", nullptr},
    {"no_kv_ahead", [](Plan& pl) { pl.ahead_kv_bytes = 0; }},
    {"kv_ahead_half", [](Plan& pl) { pl.ahead_kv_bytes /= 2; }},
    {"plain_out",
     [](Plan& pl) {
       if (pl.path.out == OutUnit::f32_stream) pl.path.out = OutUnit::f32;
     }},
    {"pack_v",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block)
         if (b.kv == detail::KvUnit::k_packed) b.kv = detail::KvUnit::packed_f32;
     }},
    {"v_in_place",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block)
         if (b.v_in_place_declined) b.kv = detail::KvUnit::k_packed;
     }},
    {"stream_out",
     [](Plan& pl) {
       if (pl.path.out == OutUnit::f32) pl.path.out = OutUnit::f32_stream;
     }},
    {"no_scores_k_ahead",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block) b.scores_k_ahead = false;
     }},
    {"scores_k_ahead",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block) b.scores_k_ahead = true;
     }},
    {"v_ahead_l1",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block) b.v_ahead_l2 = false;
     }},
    {"v_ahead_l2",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block)
         if (b.score == detail::ScoreUnit::dot) b.v_ahead_l2 = true;
     }},
    {"key_runs",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block)
         if (b.score == detail::ScoreUnit::dot) {
           b.score = detail::ScoreUnit::dot_runs;
           b.k_ahead = false;
         }
     }},
    {"key_stream",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block)
         if (b.k_ahead_declined) {
           b.score = detail::ScoreUnit::dot;
           b.k_ahead = true;
         }
     }},
    {"runs_ahead_max",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block) b.runs_ahead = detail::kMaxRunsAhead;
     }},
    {"no_runs_ahead",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block) b.runs_ahead = 0;
     }},
    {"epilogue_out",
     [](Plan& pl) {
       for (detail::BlockPath& b : pl.path.block) b.out_in_pv = false;
     }},
};

}  // namespace

const std::vector<std::string>& plan_tweak_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const Tweak& t : kTweaks) n.emplace_back(t.name);
    return n;
  }();
  return names;
}

std::string plan_tweak_list() {
  std::string list;
  for (const std::string& n : plan_tweak_names()) list += (list.empty() ? "" : ", ") + n;
  return list;
}

void set_plan_tweak(Context& context, const std::string& name) {
  const auto* t = std::find_if(std::begin(kTweaks), std::end(kTweaks),
                               [&](const Tweak& k) { return name == k.name; });
  if (t == std::end(kTweaks)) {
    throw Error("cpuattn: plan tweak '" + name + "' is not one of " + plan_tweak_list());
  }
  detail::ContextAccess::impl(context).plan_tweak.store(t->apply, std::memory_order_relaxed);
}

}  // namespace cpuattn
