// --dump-batches (see batch_dump.h; the format in trainer.h). Micro-batch k of a step over all
// ranks is each rank's k-th slice of its rows, in rank order: what the ranks' k-th backward
// passes trained on together.
#include <fsdp_train/batch_dump.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <ios>
#include <vector>

namespace fsdp::train {
namespace {

// Little-endian int64s, as --dump-batches documents (every platform we build on is
// little-endian, so the bytes are written as they are in memory).
void write_int64s(std::ofstream& out, const std::vector<int64_t>& values) {
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(int64_t)));
}
void write_int64s(std::ofstream& out, const at::Tensor& values) {
  const at::Tensor v = values.to(at::kLong).contiguous();
  out.write(reinterpret_cast<const char*>(v.data_ptr<int64_t>()),
            static_cast<std::streamsize>(v.numel() * sizeof(int64_t)));
}

}  // namespace

void BatchDump::open(const JobConfig& job) {
  if (job.debug.dump_batches_path.empty()) return;
  path_ = job.debug.dump_batches_path;
  grad_accum_ = job.training.grad_accum;
  seq_len_ = job.training.seq_len;
  out_.open(path_, std::ios::out | std::ios::trunc | std::ios::binary);
  TORCH_CHECK(out_.good(), "cannot open --dump-batches file '", path_, "' for writing");
  out_.write("FSDPBAT1", 8);
  write_int64s(out_, {job.training.global_batch / grad_accum_, seq_len_, grad_accum_});
}

void BatchDump::write(int64_t step, const std::pair<at::Tensor, at::Tensor>& global, int world) {
  if (!out_.is_open()) return;
  for (int64_t k = 0; k < grad_accum_; ++k) {
    const auto slice_k = [&](const at::Tensor& t) {
      return t.view({world, grad_accum_, -1, seq_len_}).select(1, k).reshape({-1, seq_len_});
    };
    write_int64s(out_, {step + 1, k});
    write_int64s(out_, slice_k(global.first));
    write_int64s(out_, slice_k(global.second));
  }
  out_.flush();
  TORCH_CHECK(out_.good(), "cannot write --dump-batches file '", path_, "'");
}

}  // namespace fsdp::train
