// The tree-wide state of one fully_shard'ed tree; see root_state.h for what the root does in a
// step.
//
// Invariants: every rank issues the same collectives in the same order, because every rank
// runs the same forward and the same autograd graph. So the forward order recorded here, and
// every decision taken from it (prefetching, which units end_of_backward finishes and in what
// order), is the same on every rank. Reductions complete strictly in the order they were
// issued.
#include "runtime/root_state.h"

#include "runtime/hooks.h"
#include "runtime/param_group.h"

#include <c10/util/Exception.h>

#include <memory>
#include <utility>

namespace fsdp::detail {

void RootState::set_implicit_prefetch(int count) {
  TORCH_CHECK(count >= 0, "fsdp: the implicit prefetch count must be >= 0, got ", count);
  implicit_prefetch_ = count;
}

void RootState::lazy_init() {
  units_.clear();
  for (const auto& item : root_.module().named_modules()) {
    ParamGroup* unit = param_group_of(*item.value());
    if (unit == nullptr) continue;
    unit->join_tree(shared_from_this(), item.key(), /*is_top=*/unit == &root_);
    units_.push_back(unit);
    offloads_to_host_ = offloads_to_host_ || unit->offloads_to_host();
  }
}

void RootState::begin_step() {
  // A forward that was never followed by a backward (evaluation with grad enabled, or an
  // aborted step) leaves units unsharded: start the new step from a clean slate.
  for (ParamGroup* unit : units_) unit->reset_for_step();
  if (!forward_order_.empty()) last_forward_order_ = std::move(forward_order_);
  for (size_t i = 0; i < last_forward_order_.size(); ++i) {
    last_forward_order_[i]->note_last_forward_index(static_cast<int>(i));
  }
  forward_order_.clear();
  end_of_backward_queued_ = false;
  streams_.begin_step();
}

int RootState::record_forward(ParamGroup* unit) {
  forward_order_.push_back(unit);
  return static_cast<int>(forward_order_.size()) - 1;
}

bool RootState::step_in_progress() const {
  return root_.training_state() != TrainingState::kIdle || end_of_backward_queued_;
}

void RootState::queue_end_of_backward() {
  if (end_of_backward_queued_) return;
  end_of_backward_queued_ = true;
  // The callback keeps the root unit, and so this state, alive until it has run.
  std::shared_ptr<ParamGroup> keep = root_.shared_from_this();
  queue_backward_callback([keep, this] { end_of_backward(); });
}

void RootState::end_of_backward() {
  end_of_backward_queued_ = false;
  for (auto it = forward_order_.rbegin(); it != forward_order_.rend(); ++it) {
    (*it)->post_backward();
  }
  if (is_last_backward_) finish_reduces(/*keep=*/0);
  for (ParamGroup* unit : units_) unit->finish_backward();
  streams_.flush_all();
  if (offloads_to_host_) streams_.synchronize();
}

void RootState::add_reduce(PendingReduce reduce) {
  pending_reduces_.push_back(std::move(reduce));
  // See [Note: why reductions are capped at two in flight].
  finish_reduces(static_cast<size_t>(kMaxReductionsInFlight));
}

void RootState::finish_reduces(size_t keep) {
  while (pending_reduces_.size() > keep) {
    PendingReduce reduce = std::move(pending_reduces_.front());
    pending_reduces_.pop_front();
    if (!reduce.replicate_after) {
      reduce.reducer->finish(reduce);
      continue;
    }
    // See [Note: HSDP's all-reduce runs beside the next units' backward].
    reduce.reducer->start_all_reduce(reduce);
    pending_all_reduces_.push_back(std::move(reduce));
    finish_all_reduces(static_cast<size_t>(kMaxAllReducesInFlight));
  }
  // The all-reduces have a cap of their own (above); `keep` counts reduce-scatters, so only the
  // end of backward (keep 0) completes every all-reduce.
  if (keep == 0) finish_all_reduces(0);
}

void RootState::finish_all_reduces(size_t keep) {
  while (pending_all_reduces_.size() > keep) {
    PendingReduce reduce = std::move(pending_all_reduces_.front());
    pending_all_reduces_.pop_front();
    reduce.reducer->finish(reduce);
  }
}

}  // namespace fsdp::detail
