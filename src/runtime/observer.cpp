#include <fsdp/runtime/observer.h>

namespace fsdp {

void RankMonitor::held(HeldKind kind, int64_t delta) {
  switch (kind) {
    case HeldKind::kUnshardedParams:
      stats_.add_unsharded_params(delta);
      return;
    case HeldKind::kUnshardedGrads:
      stats_.add_unsharded_grads(delta);
      return;
    case HeldKind::kCommBuffers:
      stats_.add_comm_buffers(delta);
      return;
    case HeldKind::kUnshardedUnits:
      stats_.add_unsharded_units(delta);
      return;
  }
}

}  // namespace fsdp
