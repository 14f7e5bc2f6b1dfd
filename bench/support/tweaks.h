// Benchmark support (not part of the library's API): named changes of the flash op's plan, for
// timing a variant of the plan against the shipped one call by call in one process (`cpuattn
// bench --tweak`). On a shared machine whose speed drifts by tens of percent within minutes, only
// calls timed in turns on the same inputs resolve a difference of a few percent
// (docs/performance.md#dm-plan-tweaks). Every tweak changes how a call runs, never its result:
// outputs stay bitwise identical, and the tests check it.
#pragma once

#include <string>
#include <vector>

#include "cpuattn/cpuattn.h"

namespace cpuattn {

// The tweaks, "none" (the shipped plan) first:
//   none         the plan as plan_flash() makes it
//   no_kv_ahead  tiled tasks prefetch none of the next task's K/V (Plan::ahead_kv_bytes 0)
//   kv_ahead_half  half the shipped amount of the next task's K/V prefetched (half the L2)
//   plain_out    outputs above the streaming threshold written through the caches
//   pack_v       tiled blocks copy f32 V into chunks instead of reading it in place
//   v_in_place   tiled blocks read in place the f32 V the plan packs because a column chunk of
//                its rows would not fit L1d's sets (Dv 128 on x86)
//   stream_out   f32 outputs of any size written with non-temporal stores
//   no_scores_k_ahead  streamed blocks whose K rows P V asked for: the scores do not ask again
//   scores_k_ahead     the same blocks' scores ask again, 16 keys ahead, as the plan does except
//                      for 2-byte K on AMD's Zen 3 and Zen 4 (Choice::narrow_k_once)
//   v_ahead_l1   decoding's scores prefetch V rows into L1 (BlockPath::v_ahead_l2 false)
//   v_ahead_l2   decoding's scores prefetch V rows into L2, as the plan does on Intel for 2- and
//                4-byte V
//   key_runs     streamed blocks read K in four interleaved runs (ScoreUnit::dot_runs, as for
//                pages smaller than a block) instead of one stream, as the plan does on Intel
//   key_stream   streamed K in place that Intel's plan reads in runs goes as one stream with
//                P V asking for the next block's K (k_ahead), as on other CPUs
//   runs_ahead_max  streamed blocks read in runs prefetch the K rows of the 8 runs read next
//                   (BlockPath::runs_ahead), as the plan does except on AMD before Zen 4
//   no_runs_ahead   the same with none of the runs read next prefetched
//   epilogue_out  the output epilogue writes every row, also those the f32 P V tiles of the last
//                 key block would (BlockPath::out_in_pv)
const std::vector<std::string>& plan_tweak_names();
// The names as a comma-separated list, for help texts and errors.
std::string plan_tweak_list();

// Makes every later call on `context` run with the named tweak; throws Error naming the choices
// for an unknown name, and then leaves the context as it was.
void set_plan_tweak(Context& context, const std::string& name);

}  // namespace cpuattn
