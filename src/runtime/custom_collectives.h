// Private to the runtime: where a unit's all-gather and reduce-scatter go through a custom
// collective (FSDPModule::set_custom_all_gather / set_custom_reduce_scatter) or, with none set
// (a null hook), straight to the process group as before. The hook's results are checked here,
// so a hook that hands back a wrong buffer fails with a message instead of corrupting a copy-out.
#pragma once

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/comm/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace fsdp::detail {

// A buffer of numel elements with options' dtype and device: hook->allocate's, or at::empty.
// unit names the FSDP unit in errors.
at::Tensor allocate_gather_buffer(AllGather* hook, int64_t numel, const at::TensorOptions& options,
                                  const std::string& unit);
at::Tensor allocate_reduce_buffer(ReduceScatter* hook, int64_t numel,
                                  const at::TensorOptions& options, const std::string& unit);

// Starts the all-gather of input into output over group: the hook's, or the group's own.
WorkHandle start_all_gather(AllGather* hook, ProcessGroup& group, const at::Tensor& output,
                            const at::Tensor& input, const std::string& unit);
// Starts the reduce-scatter of input into output over group: the hook's, or the group's own.
WorkHandle start_reduce_scatter(ReduceScatter* hook, ProcessGroup& group, const at::Tensor& output,
                                const at::Tensor& input, ReduceOp op, const std::string& unit);

}  // namespace fsdp::detail
