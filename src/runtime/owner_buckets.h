// A whole-tensor unit's tensors grouped by the rank that owns them (inter-tensor ZeRO-3,
// fsdp/runtime/whole_tensor.h): what its broadcasts (whole_tensor_unsharder.cpp) and its
// reduces (GradientReducer) walk. Every rank lists the same buckets, owners ascending and tensors
// in registration order, so every rank issues the same collectives in the same order.
#pragma once

#include "runtime/fsdp_param.h"

#include <fsdp/comm/process_group.h>
#include <fsdp/runtime/whole_tensor.h>

#include <c10/util/Exception.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace fsdp::detail {

struct OwnerBucket {
  int owner = 0;
  std::vector<size_t> params;  // indices into the unit's parameters, in registration order
  int64_t numel = 0;
};

inline std::vector<OwnerBucket> owner_buckets(const std::vector<FSDPParam>& params,
                                              const WholeTensorPlacement& placement) {
  std::map<int, OwnerBucket> by_owner;
  for (size_t i = 0; i < params.size(); ++i) {
    const int owner = placement.owner_of(params[i].param());
    OwnerBucket& bucket = by_owner[owner];
    bucket.owner = owner;
    bucket.params.push_back(i);
    bucket.numel += params[i].layout().numel();
  }
  std::vector<OwnerBucket> buckets;
  for (auto& [owner, bucket] : by_owner) buckets.push_back(std::move(bucket));
  return buckets;
}

// One Work for the broadcasts (or reduces) of a unit's buckets: waits for each in issue order.
// Its times are those of the last, which the backend runs last.
class WorkList : public Work {
 public:
  explicit WorkList(std::vector<WorkHandle> works) : works_(std::move(works)) {
    TORCH_INTERNAL_ASSERT(!works_.empty());
  }
  void wait() override {
    for (const auto& w : works_) w->wait();
    copy_times_from(*works_.back());
  }
  void wait_on_stream() override {
    for (const auto& w : works_) w->wait_on_stream();
  }
  bool is_completed() override {
    for (const auto& w : works_) {
      if (!w->is_completed()) return false;
    }
    copy_times_from(*works_.back());
    return true;
  }

 private:
  std::vector<WorkHandle> works_;
};

}  // namespace fsdp::detail
