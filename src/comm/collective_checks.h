// Private to src/comm: what every backend checks of a collective's arguments before it starts,
// and the bytes it counts as sent. The queued CPU backends (gloo, MPI) and the NCCL backend call
// the same functions, so a misuse gets the same message whichever backend the job runs on.
//
// Each check throws (TORCH_CHECK) a message that starts with "fsdp: rank R of W: ", names the
// operation and the offending values (the devices, dtypes, element counts or root), and runs on
// the caller's thread, so the error surfaces where the mistake was made.
#pragma once

#include <fsdp/comm/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace fsdp::detail {

// "fsdp: rank R of W: ", the start of every message of group.
std::string group_prefix(const ProcessGroup& group);

// Whether the backends can sum and average dtype (Float, Double, BFloat16, Half).
bool reducible_dtype(at::ScalarType dtype);

// output holds size() x input's elements, both contiguous, defined, on group.device(), same dtype.
void check_all_gather_args(const ProcessGroup& group, const at::Tensor& output,
                           const at::Tensor& input);
// As all-gather with the roles swapped, and the dtype reducible.
void check_reduce_scatter_args(const ProcessGroup& group, const at::Tensor& output,
                               const at::Tensor& input);
// tensor contiguous, defined, on group.device(); kAvg needs a floating point dtype.
void check_all_reduce_args(const ProcessGroup& group, const at::Tensor& tensor, ReduceOp op);
// tensor as all-reduce's, root a rank of group.
void check_broadcast_args(const ProcessGroup& group, const at::Tensor& tensor, int root);
// tensor as all-reduce's with a reducible dtype, root a rank of group.
void check_reduce_args(const ProcessGroup& group, const at::Tensor& tensor, int root);

// This rank's index in the subgroup split(ranks, name) forms, or -1 when it is not a member.
// Throws on an empty list, a rank outside group or a rank listed twice.
int split_index(const ProcessGroup& group, const std::vector<int>& ranks, const std::string& name);

// The bytes this rank sends, as the bandwidth-optimal ring would (see CommCounters): every
// backend counts these, since none lets us observe its wire. input_bytes / bytes are the
// arguments' nbytes(); size is W.
inline int64_t all_gather_sent_bytes(int64_t input_bytes, int size) {
  return input_bytes * (size - 1);
}
inline int64_t reduce_scatter_sent_bytes(int64_t input_bytes, int size) {
  return input_bytes / size * (size - 1);
}
inline int64_t all_reduce_sent_bytes(int64_t bytes, int size) {
  return 2 * (size - 1) * bytes / size;
}
// A group of one sends nothing, whichever rank is the root.
inline int64_t broadcast_sent_bytes(int64_t bytes, int rank, int root, int size) {
  return size > 1 && rank == root ? bytes : 0;
}
inline int64_t reduce_sent_bytes(int64_t bytes, int rank, int root) {
  return rank == root ? 0 : bytes;
}

}  // namespace fsdp::detail
