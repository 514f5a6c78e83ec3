// Dispatch to a unit's custom collectives; see custom_collectives.h. With no hook each function
// is one null check in front of the call the runtime made before hooks existed.
#include "runtime/custom_collectives.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace fsdp::detail {
namespace {

at::Tensor checked_buffer(at::Tensor buffer, int64_t numel, const at::TensorOptions& options,
                          const char* hook, const std::string& unit) {
  const at::ScalarType dtype = options.dtype().toScalarType();
  TORCH_CHECK(
      buffer.defined() && buffer.dim() == 1 && buffer.numel() == numel && buffer.is_contiguous() &&
          buffer.scalar_type() == dtype && buffer.device() == options.device(),
      "fsdp: unit '", unit, "': the custom ", hook, "'s allocate(", numel, ", ", dtype, ", ",
      options.device(), ") must return a contiguous 1-D tensor of ", numel,
      " elements with that dtype and device, got ",
      buffer.defined()
          ? c10::str(buffer.scalar_type(), " of shape ", buffer.sizes(), " on ", buffer.device())
          : std::string("an undefined tensor"));
  return buffer;
}

WorkHandle checked_work(WorkHandle work, const char* hook, const std::string& unit) {
  TORCH_CHECK(work != nullptr, "fsdp: unit '", unit, "': the custom ", hook,
              " returned no Work; it must return a handle the runtime can wait on");
  return work;
}

}  // namespace

at::Tensor allocate_gather_buffer(AllGather* hook, int64_t numel, const at::TensorOptions& options,
                                  const std::string& unit) {
  if (hook == nullptr) return at::empty({numel}, options);
  return checked_buffer(hook->allocate(numel, options.dtype().toScalarType(), options.device()),
                        numel, options, "all-gather", unit);
}

at::Tensor allocate_reduce_buffer(ReduceScatter* hook, int64_t numel,
                                  const at::TensorOptions& options, const std::string& unit) {
  if (hook == nullptr) return at::empty({numel}, options);
  return checked_buffer(hook->allocate(numel, options.dtype().toScalarType(), options.device()),
                        numel, options, "reduce-scatter", unit);
}

WorkHandle start_all_gather(AllGather* hook, ProcessGroup& group, const at::Tensor& output,
                            const at::Tensor& input, const std::string& unit) {
  if (hook == nullptr) return group.all_gather_into_tensor(output, input);
  return checked_work((*hook)(output, input, group), "all-gather", unit);
}

WorkHandle start_reduce_scatter(ReduceScatter* hook, ProcessGroup& group, const at::Tensor& output,
                                const at::Tensor& input, ReduceOp op, const std::string& unit) {
  if (hook == nullptr) return group.reduce_scatter_tensor(output, input, op);
  return checked_work((*hook)(output, input, group, op), "reduce-scatter", unit);
}

}  // namespace fsdp::detail
