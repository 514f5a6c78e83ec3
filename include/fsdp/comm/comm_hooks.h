// Custom collectives for an FSDP unit (FSDP2's AllGather / ReduceScatter comm protocols), and
// one ready-made: Int8AllGather, ZeRO++'s quantized weight all-gather (qwZ).
//
// The runtime hands a hook the buffers it would otherwise pass to the process group: an
// all-gather hook fills output ([W * input.numel()], the compute dtype) with every rank's input
// in rank order; a reduce-scatter hook leaves in output ([input.numel() / W]) chunk rank() of
// the element-wise reduction of every rank's input. Both return at once with a Work, which the
// runtime waits on where it waits on its own collectives (so a hook may finish its work, e.g.
// a dequantization, inside Work::wait). The group is the one the runtime would use; hooks are
// attached with FSDPModule::set_custom_all_gather / set_custom_reduce_scatter, whose comments
// say which collectives they replace. The runtime counts the buffers it asks allocate for in its
// byte accounting (RankStats' communication buffers); what a hook allocates on its own (e.g.
// Int8AllGather's int8 staging buffers) it does not see.
#pragma once

#include <fsdp/comm/process_group.h>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace fsdp {

// A unit's parameter all-gather. Every rank of the group must call it in the same order with
// inputs of the same numel (the runtime does).
class AllGather {
 public:
  virtual ~AllGather() = default;
  // The output buffer of a gather of numel elements (all ranks together), in dtype on device.
  // (optional) defaults to an uninitialized at::empty.
  virtual at::Tensor allocate(int64_t numel, at::ScalarType dtype, c10::Device device);
  // Starts gathering every rank's input into output (contiguous, group.size() * input.numel()
  // elements, allocated by allocate). Does not block; output is final once the Work's wait()
  // (or wait_on_stream(), on a device) returned. input stays alive and unchanged until then.
  virtual WorkHandle operator()(const at::Tensor& output, const at::Tensor& input,
                                ProcessGroup& group) = 0;
};

// A unit's gradient reduce-scatter.
class ReduceScatter {
 public:
  virtual ~ReduceScatter() = default;
  // The buffers of a reduce-scatter (its input, then its output), as AllGather::allocate.
  virtual at::Tensor allocate(int64_t numel, at::ScalarType dtype, c10::Device device);
  // Starts reducing input (group.size() * output.numel() elements) over the group's ranks with
  // op, chunk rank() of the result going to output. Does not block, as AllGather's.
  virtual WorkHandle operator()(const at::Tensor& output, const at::Tensor& input,
                                ProcessGroup& group, ReduceOp op) = 0;
};

// Blockwise symmetric int8 quantization of a flat tensor: block b holds elements
// [b * block_size, (b + 1) * block_size), the last one shorter when block_size does not divide
// numel. Each block has scale = absmax(block) / 127 (fp32) and values q = round(x / scale)
// clamped to [-127, 127] (0 where the block is all zeros), so |x - q * scale| <= absmax / 254
// up to float rounding, and zeros stay exactly zero.
struct Int8Blocks {
  at::Tensor values;  // int8, [numel]
  at::Tensor scales;  // float32, [ceil(numel / block_size)]
};
// input: 1-D and floating point; read in float32. Throws on a block_size below 1.
Int8Blocks quantize_int8_blockwise(const at::Tensor& input, int64_t block_size);
// Writes q * scale into output (1-D, floating point, values.numel() elements, any dtype):
// the inverse of quantize_int8_blockwise over the same block_size.
void dequantize_int8_blockwise(const at::Tensor& values, const at::Tensor& scales,
                               int64_t block_size, const at::Tensor& output);

// ZeRO++ qwZ: each rank quantizes its all-gather input (blocks start at its own first element),
// all-gathers the int8 values and the scales (two collectives), and dequantizes every rank's
// part into output in output's dtype when the Work is waited on. The bytes each rank sends are
// numel + 4 * ceil(numel / block_size) instead of numel * element size. The input (the sharded
// parameters) is only read: the optimizer keeps stepping the exact values.
class Int8AllGather : public AllGather {
 public:
  static constexpr int64_t kDefaultBlockSize = 256;
  // Throws on a block_size below 1.
  explicit Int8AllGather(int64_t block_size = kDefaultBlockSize);

  int64_t block_size() const { return block_size_; }
  // Bytes one rank contributes to a gather of numel elements per rank: the int8 values and the
  // fp32 scales.
  static int64_t bytes_per_rank(int64_t numel, int64_t block_size);

  WorkHandle operator()(const at::Tensor& output, const at::Tensor& input,
                        ProcessGroup& group) override;

 private:
  int64_t block_size_;
};

}  // namespace fsdp
