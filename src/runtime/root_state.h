// RootState: the tree-wide state of one fully_shard'ed tree (FSDP2's FSDPState on the root,
// with its FSDPStateContext), kept apart from the per-unit communication state (ParamGroup).
//
// One object per tree, shared (FSDP2 shares its FSDPStateContext the same way): a unit makes its
// own when it is sharded, since any unit may turn out to be the root, and keeps it while it is
// in no tree, so that the tree-wide settings given to the outermost unit before its first
// forward have somewhere to live. On the root's first forward, lazy_init binds every unit at or
// under the root's module to the root's; the others' own are dropped. A unit reaches its tree
// only through ParamGroup::tree(). The tree-wide settings (implicit prefetch, is_last_backward)
// are set through the root unit only: ParamGroup throws for any other, whose setting would
// otherwise be lost. The tree's stream ops go to the root's observer.
//
// Within one training step the root:
//   - starts the step (begin_step, in the root's pre-forward): units that a forward left
//     unsharded without a backward are resharded, and this step's forward order becomes the
//     previous step's, which forward prefetching follows;
//   - records the order in which units run forward (backward prefetching walks it in reverse);
//   - holds every unit's reduce-scatter in flight, oldest first, completing the oldest when more
//     than kMaxReductionsInFlight are issued (fsdp/runtime/in_flight_limits.h: see
//     [Note: why reductions are capped at two in flight]);
//   - at the end of backward (an autograd engine callback queued by the first pre-backward),
//     runs post-backward, in reverse forward order, for units whose post-backward node never
//     ran, completes the reductions if this is the last backward before the optimizer step,
//     and reshards every unit.
#pragma once

#include "runtime/device_streams.h"
#include "runtime/gradient_reducer.h"

#include <fsdp/comm/process_group.h>
#include <fsdp/runtime/in_flight_limits.h>
#include <fsdp/util/trace.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <deque>
#include <memory>
#include <vector>

namespace fsdp::detail {

class ParamGroup;

class RootState : public std::enable_shared_from_this<RootState> {
 public:
  // The state of the tree root would be the root of, made by root itself (not yet bound);
  // observer is root's, to which the tree's stream ops go.
  RootState(ParamGroup& root, c10::Device device, RuntimeObserver& observer)
      : root_(root), streams_(device, observer) {}
  RootState(const RootState&) = delete;
  RootState& operator=(const RootState&) = delete;

  // How many units ahead the implicit prefetch gathers (0: off).
  void set_implicit_prefetch(int count);
  int implicit_prefetch() const { return implicit_prefetch_; }
  // Whether the next backward is the last before the optimizer step. If not, its
  // reduce-scatters may still be in flight when backward returns.
  void set_is_last_backward(bool last) { is_last_backward_ = last; }

  // Makes every unit at or under the root's module (the root included) a unit of this tree,
  // sharing this state, and names it by its path under the root.
  void lazy_init();
  // The unit whose first forward made this tree (or which would, before lazy_init).
  const ParamGroup& root() const { return root_; }
  // Called by the root's pre-forward: starts a training step from a clean slate.
  void begin_step();
  // Appends unit to this step's forward order and returns its position there.
  int record_forward(ParamGroup* unit);
  const std::vector<ParamGroup*>& forward_order() const { return forward_order_; }
  const std::vector<ParamGroup*>& last_forward_order() const { return last_forward_order_; }
  // From the root's forward to the end of its backward: settings must not change then, since
  // units act on them at different times.
  bool step_in_progress() const;

  // Queues end_of_backward with the autograd engine, once per backward pass.
  void queue_end_of_backward();
  // Takes a unit's reduction in flight, completing the oldest beyond kMaxReductionsInFlight.
  void add_reduce(PendingReduce reduce);

  // The streams and events every unit of the tree orders its work with.
  DeviceStreams& streams() { return streams_; }

 private:
  void end_of_backward();
  // Completes the oldest reductions in flight until at most keep remain, and as many HSDP
  // all-reduces across replicas.
  void finish_reduces(size_t keep);
  void finish_all_reduces(size_t keep);

  ParamGroup& root_;  // owns this
  int implicit_prefetch_ =
      kDefaultPrefetchDepth;  // see [Note: why implicit prefetch gathers one unit ahead]
  bool is_last_backward_ = true;
  std::vector<ParamGroup*> units_;               // every unit under the root, pre-order
  std::vector<ParamGroup*> forward_order_;       // units in the order their forward ran this step
  std::vector<ParamGroup*> last_forward_order_;  // the same, for the previous step
  std::deque<PendingReduce> pending_reduces_;
  // HSDP: reductions whose all-reduce across replicas is in flight, oldest first.
  std::deque<PendingReduce> pending_all_reduces_;
  bool end_of_backward_queued_ = false;
  DeviceStreams streams_;
  // A unit offloads its state to the host while computing on a device: the host waits for
  // every stream at the end of backward, so the optimizer reads finished copies.
  bool offloads_to_host_ = false;
};

}  // namespace fsdp::detail
