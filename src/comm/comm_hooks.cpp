// The default allocation of custom collectives, and the int8 blockwise all-gather (qwZ).
//
// Invariants of Int8AllGather:
// - Every rank quantizes its own input with blocks that start at its first element, so a block
//   never straddles two ranks' parts and each rank's part dequantizes with its own scales alone.
// - Zero maps to zero (a zero block has scale 0 and values 0), so the runtime's zero padding
//   comes back exactly zero.
// - The dequantization runs once, on whichever thread first completes the Work (wait,
//   wait_on_stream or a completed is_completed poll); output is not final before that.
#include <fsdp/comm/comm_hooks.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <mutex>

namespace fsdp {

at::Tensor AllGather::allocate(int64_t numel, at::ScalarType dtype, c10::Device device) {
  return at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
}

at::Tensor ReduceScatter::allocate(int64_t numel, at::ScalarType dtype, c10::Device device) {
  return at::empty({numel}, at::TensorOptions().dtype(dtype).device(device));
}

namespace {

void check_block_size(int64_t block_size) {
  TORCH_CHECK(block_size >= 1, "fsdp: int8 quantization needs a block size of at least 1, got ",
              block_size);
}

int64_t block_count(int64_t numel, int64_t block_size) {
  return (numel + block_size - 1) / block_size;
}

// x (float32, 1-D) zero-padded to whole blocks, as [blocks, block_size].
at::Tensor as_blocks(const at::Tensor& x, int64_t block_size) {
  const int64_t blocks = block_count(x.numel(), block_size);
  const int64_t pad = blocks * block_size - x.numel();
  const at::Tensor padded = pad == 0 ? x : at::constant_pad_nd(x, {0, pad});
  return padded.view({blocks, block_size});
}

// Waits on the two gathers of Int8AllGather, then dequantizes every rank's part into output.
class DequantizingWork : public Work {
 public:
  DequantizingWork(WorkHandle values_work, WorkHandle scales_work, at::Tensor values,
                   at::Tensor scales, at::Tensor output, int world, int64_t block_size)
      : values_work_(std::move(values_work)),
        scales_work_(std::move(scales_work)),
        values_(std::move(values)),
        scales_(std::move(scales)),
        output_(std::move(output)),
        world_(world),
        block_size_(block_size) {}

  void wait() override {
    values_work_->wait();
    scales_work_->wait();
    dequantize_once();
  }

  bool is_completed() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (done_) return true;
    }
    if (!values_work_->is_completed() || !scales_work_->is_completed()) return false;
    wait();  // completed: returns at once, or rethrows the gather's error
    return true;
  }

  // On a device the two gathers order the current stream, and the dequantization is queued on
  // that stream after them.
  void wait_on_stream() override {
    values_work_->wait_on_stream();
    scales_work_->wait_on_stream();
    dequantize_once();
  }

 private:
  void dequantize_once() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) return;
    const int64_t numel = values_.numel() / world_;
    const int64_t blocks = scales_.numel() / world_;
    for (int r = 0; r < world_; ++r) {
      dequantize_int8_blockwise(values_.narrow(0, r * numel, numel),
                                scales_.narrow(0, r * blocks, blocks), block_size_,
                                output_.narrow(0, r * numel, numel));
    }
    copy_times_from(*values_work_);
    mark_finished();
    values_ = at::Tensor();
    scales_ = at::Tensor();
    output_ = at::Tensor();
    done_ = true;
  }

  WorkHandle values_work_;
  WorkHandle scales_work_;
  at::Tensor values_;  // int8, [W * numel]
  at::Tensor scales_;  // float32, [W * blocks]
  at::Tensor output_;
  int world_;
  int64_t block_size_;
  std::mutex mutex_;
  bool done_ = false;
};

}  // namespace

Int8Blocks quantize_int8_blockwise(const at::Tensor& input, int64_t block_size) {
  check_block_size(block_size);
  TORCH_CHECK(input.dim() == 1 && at::isFloatingType(input.scalar_type()),
              "fsdp: int8 quantization takes a 1-D floating point tensor, got ", input.dim(), "-D ",
              input.scalar_type());
  at::NoGradGuard no_grad;
  const at::Tensor blocks = as_blocks(input.to(at::kFloat), block_size);
  const at::Tensor scales = blocks.abs().amax(/*dim=*/1) / 127.0;
  // A zero block divides by 1 instead of 0: its values are all zero either way.
  const at::Tensor divisors = scales.masked_fill(scales == 0, 1.0).unsqueeze(1);
  const at::Tensor values = (blocks / divisors)
                                .round_()
                                .clamp_(-127, 127)
                                .to(at::kChar)
                                .view({-1})
                                .narrow(0, 0, input.numel());
  return {values.contiguous(), scales};
}

void dequantize_int8_blockwise(const at::Tensor& values, const at::Tensor& scales,
                               int64_t block_size, const at::Tensor& output) {
  check_block_size(block_size);
  TORCH_CHECK(values.scalar_type() == at::kChar && scales.scalar_type() == at::kFloat,
              "fsdp: int8 dequantization takes int8 values and float32 scales, got ",
              values.scalar_type(), " and ", scales.scalar_type());
  TORCH_CHECK(values.dim() == 1 && output.dim() == 1 && values.numel() == output.numel() &&
                  scales.numel() == block_count(values.numel(), block_size),
              "fsdp: int8 dequantization of ", values.numel(), " values in blocks of ", block_size,
              " needs ", block_count(values.numel(), block_size), " scales and an output of ",
              values.numel(), " elements, got ", scales.numel(), " scales and ", output.numel());
  at::NoGradGuard no_grad;
  const at::Tensor blocks = as_blocks(values.to(at::kFloat), block_size);
  output.copy_((blocks * scales.unsqueeze(1)).view({-1}).narrow(0, 0, values.numel()));
}

Int8AllGather::Int8AllGather(int64_t block_size) : block_size_(block_size) {
  check_block_size(block_size);
}

int64_t Int8AllGather::bytes_per_rank(int64_t numel, int64_t block_size) {
  check_block_size(block_size);
  return numel + 4 * block_count(numel, block_size);
}

WorkHandle Int8AllGather::operator()(const at::Tensor& output, const at::Tensor& input,
                                     ProcessGroup& group) {
  const int world = group.size();
  TORCH_CHECK(output.dim() == 1 && output.numel() == world * input.numel() &&
                  at::isFloatingType(output.scalar_type()),
              "fsdp: int8 all-gather over ", world, " ranks of ", input.numel(),
              " elements needs a 1-D floating point output of ", world * input.numel(),
              " elements, got ", output.dim(), "-D ", output.scalar_type(), " of ", output.numel());
  Int8Blocks mine = quantize_int8_blockwise(input, block_size_);
  const at::Tensor values = at::empty({world * mine.values.numel()}, mine.values.options());
  const at::Tensor scales = at::empty({world * mine.scales.numel()}, mine.scales.options());
  WorkHandle values_work = group.all_gather_into_tensor(values, mine.values);
  WorkHandle scales_work = group.all_gather_into_tensor(scales, mine.scales);
  return std::make_shared<DequantizingWork>(std::move(values_work), std::move(scales_work), values,
                                            scales, output, world, block_size_);
}

}  // namespace fsdp
