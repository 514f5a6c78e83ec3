// How much communication a fully_shard'ed tree keeps in flight at once: one named constant per
// limit, read by the runtime (src/runtime/root_state.*), the stream schedule's builder and checker
// (src/runtime/stream_schedule.cpp) and the estimators' replay of a step (src/estimate/), so the
// three cannot drift apart. Each use refers to the note that explains its constant.
#pragma once

#include <limits>

namespace fsdp {

// [Note: why reductions are capped at two in flight]
// A unit's gradient reduction (a reduce-scatter over the shard group, or the all-reduce across
// replicas when there is no shard dimension) is issued in its post-backward and completed later
// by the root, oldest first: when a new one would leave more than kMaxReductionsInFlight issued
// and not completed, and at the end of the last backward before the optimizer step. Until it
// completes, a reduction holds its packed input ([W * S] in the reduce dtype) and its output
// ([S]). Backward runs the units in reverse forward order, so with a cap of two the reduction
// unit i issues is completed in unit i - 2's post-backward: the backward of units i - 1 and
// i - 2 runs beside it. With a cap of one only unit i - 1's backward would, and a reduction
// slower than one unit's backward would be exposed; each step above two holds one more unit's
// reduction buffers (the estimator counts them, which is why it must use the same number) for
// little more overlap, since a group runs its collectives one at a time (on its progress thread,
// or its stream) and the reductions queue behind each other anyway. FSDP2 bounds the same memory
// alike: the previous unit's reduce-scatter input stays alive until the next unit's post-backward.
//
// [Note: HSDP's all-reduce runs beside the next units' backward]
// Under HSDP a unit's reduce-scattered shard is then all-reduced across the replicas. That
// all-reduce is issued when its reduce-scatter is completed (as above) and is completed at the
// end of the last backward (the remaining reduce-scatters first, so the last units' all-reduces
// also run together). Meanwhile the backward of the next units runs beside it, on the replicate
// group's own thread or stream, which runs the all-reduces one after another. Until it completes
// it holds the reduced shard ([S]) only, which in the master dtype becomes the unit's gradient
// as it is, so waiting for it earlier would free nothing: the reduce-scatter's input is freed
// when the all-reduce is issued. (In a lower reduce dtype the shards wait in that dtype, at
// most half the bytes of the gradients they become.) Issued and waited for at once (the first
// version), it was exposed on every unit, and most on a slow link between hosts, where HSDP puts
// it; completed two all-reduces later (the second, with kMaxReductionsInFlight), a unit whose
// all-reduce takes longer than two blocks' backward still waited: GPT-2's head unit, the tied
// table's 77 MB a rank over 1 Gbit/s shared by both hosts' pairs, 1.1 s a step (bench/RESULTS.md,
// "HSDP's all-reduces at the end of backward"). (On a GPU, FSDP2 issues it on a stream of its own
// right after the reduce-scatter, so it too runs beside the following backward.)
inline constexpr int kMaxAllReducesInFlight = std::numeric_limits<int>::max();

inline constexpr int kMaxReductionsInFlight = 2;

// [Note: why implicit prefetch gathers one unit ahead]
// Before a unit computes, the runtime issues the all-gathers of the next kDefaultPrefetchDepth
// units (forward: the next in the previous step's forward order; backward: the previous in this
// step's), so their communication runs beside this unit's compute. Each unit of depth holds one
// more unit's all-gather buffer and unsharded parameters, so the peak of unsharded units is
// 1 + depth (the running unit and the prefetched ones). One unit ahead already hides a gather
// that takes no longer than a unit's compute, which is FSDP2's default (it prefetches exactly
// one unit, explicitly set lists aside); set_implicit_prefetch changes it per tree, and the
// estimator and the schedule builder take it as an option with this default.
inline constexpr int kDefaultPrefetchDepth = 1;

}  // namespace fsdp
