// The argument checks every backend runs before a collective (see collective_checks.h). They
// only read the tensors' metadata, never their data, so they are as cheap on CUDA tensors as on
// CPU ones and never synchronize a device.
#include "collective_checks.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace fsdp::detail {
namespace {

void check_tensor(const ProcessGroup& group, const char* op, const char* what,
                  const at::Tensor& t) {
  TORCH_CHECK(t.defined(), group_prefix(group), op, ": ", what, " is an undefined tensor");
  TORCH_CHECK(t.device() == group.device(), group_prefix(group), op, ": the ", group.backend_name(),
              " backend moves ", group.device(), " tensors, but ", what, " is on ", t.device());
  TORCH_CHECK(t.is_contiguous(), group_prefix(group), op, ": ", what, " (sizes ", t.sizes(),
              ", strides ", t.strides(), ") must be contiguous");
}

void check_same_dtype(const ProcessGroup& group, const char* op, const at::Tensor& output,
                      const at::Tensor& input) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), group_prefix(group), op, ": output is ",
              output.scalar_type(), " but input is ", input.scalar_type());
}

void check_reducible(const ProcessGroup& group, const char* op, at::ScalarType dtype) {
  TORCH_CHECK(reducible_dtype(dtype), group_prefix(group), op, ": the ", group.backend_name(),
              " backend reduces Float, Double, BFloat16 and Half, got ", dtype);
}

void check_root(const ProcessGroup& group, const char* op, int root) {
  TORCH_CHECK(root >= 0 && root < group.size(), group_prefix(group), op, ": root ", root,
              " is not a rank of a group of ", group.size());
}

// `whole` holds one `part` per rank: an all-gather's output, a reduce-scatter's input.
void check_world_times(const ProcessGroup& group, const char* op, const char* whole_name,
                       const at::Tensor& whole, const char* part_name, const at::Tensor& part) {
  const int64_t w = group.size();
  TORCH_CHECK(whole.numel() == w * part.numel(), group_prefix(group), op, ": ", whole_name, " has ",
              whole.numel(), " elements (sizes ", whole.sizes(), ") but ", w, " ranks x ",
              part_name, " of ", part.numel(), " elements (sizes ", part.sizes(), ") need ",
              w * part.numel());
}

}  // namespace

std::string group_prefix(const ProcessGroup& group) {
  std::ostringstream out;
  out << "fsdp: rank " << group.rank() << " of " << group.size() << ": ";
  return out.str();
}

bool reducible_dtype(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 ||
         dtype == at::kHalf;
}

void check_all_gather_args(const ProcessGroup& group, const at::Tensor& output,
                           const at::Tensor& input) {
  static constexpr const char* kOp = "all_gather_into_tensor";
  check_tensor(group, kOp, "output", output);
  check_tensor(group, kOp, "input", input);
  check_same_dtype(group, kOp, output, input);
  check_world_times(group, kOp, "output", output, "input", input);
}

void check_reduce_scatter_args(const ProcessGroup& group, const at::Tensor& output,
                               const at::Tensor& input) {
  static constexpr const char* kOp = "reduce_scatter_tensor";
  check_tensor(group, kOp, "output", output);
  check_tensor(group, kOp, "input", input);
  check_same_dtype(group, kOp, output, input);
  check_reducible(group, kOp, input.scalar_type());
  check_world_times(group, kOp, "input", input, "output", output);
}

void check_all_reduce_args(const ProcessGroup& group, const at::Tensor& tensor, ReduceOp op) {
  static constexpr const char* kOp = "all_reduce";
  check_tensor(group, kOp, "tensor", tensor);
  TORCH_CHECK(op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()), group_prefix(group),
              kOp, ": kAvg needs a floating point tensor, got ", tensor.scalar_type());
}

void check_broadcast_args(const ProcessGroup& group, const at::Tensor& tensor, int root) {
  static constexpr const char* kOp = "broadcast";
  check_tensor(group, kOp, "tensor", tensor);
  check_root(group, kOp, root);
}

void check_reduce_args(const ProcessGroup& group, const at::Tensor& tensor, int root) {
  static constexpr const char* kOp = "reduce";
  check_tensor(group, kOp, "tensor", tensor);
  check_reducible(group, kOp, tensor.scalar_type());
  check_root(group, kOp, root);
}

int split_index(const ProcessGroup& group, const std::vector<int>& ranks, const std::string& name) {
  const std::string prefix = group_prefix(group);
  TORCH_CHECK(!ranks.empty(), prefix, "split '", name, "': no ranks given");
  std::vector<bool> seen(group.size(), false);
  int index = -1;
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    TORCH_CHECK(r >= 0 && r < group.size(), prefix, "split '", name, "': rank ", r,
                " is outside this group of ", group.size());
    TORCH_CHECK(!seen[r], prefix, "split '", name, "': rank ", r, " is listed twice");
    seen[r] = true;
    if (r == group.rank()) index = static_cast<int>(i);
  }
  return index;
}

}  // namespace fsdp::detail
