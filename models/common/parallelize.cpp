// The root plan shared by the families; see parallelize.h.
#include <models/common/parallelize.h>

#include <c10/util/Exception.h>

namespace fsdp::models {

TensorParallelPlan root_tp_plan(const RootModules& modules, int64_t vocab, int tp,
                                bool sequence_parallel) {
  TORCH_CHECK(tp >= 1, "tensor-parallel size ", tp, " must be at least 1");
  if (tp == 1) return {};
  const Layout stream = sequence_parallel ? Layout::kSequenceShard : Layout::kReplicate;
  const PrepareModuleOutput scatter(Layout::kReplicate, Layout::kSequenceShard);
  TensorParallelPlan plan;
  if (vocabulary_splits(vocab, tp)) {
    plan = {{modules.table, RowwiseParallel(stream)}, {modules.head, ColwiseParallel(1, stream)}};
  } else if (sequence_parallel) {
    plan = {{modules.table, scatter},
            {modules.head, PrepareModuleInput(Layout::kSequenceShard, Layout::kReplicate)}};
  }
  if (sequence_parallel) {
    if (!modules.positions.empty()) plan.push_back({modules.positions, scatter});
    plan.push_back({modules.norm, SequenceParallel()});
  }
  return plan;
}

}  // namespace fsdp::models
