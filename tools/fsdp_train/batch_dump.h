// --dump-batches: rank 0's file of every batch trained on, for the reference runners that must
// train on exactly our tokens. The file format is documented in trainer.h.
#pragma once

#include <train/job_config.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <utility>

namespace fsdp::train {

class BatchDump {
 public:
  // Creates (or truncates) job's --dump-batches file and writes its header; does nothing without
  // --dump-batches. Throws naming the file when it cannot be opened.
  void open(const JobConfig& job);

  // Appends step's (0-based) global batch, (inputs, targets), as grad_accum micro-batch records
  // over world ranks, and flushes. Does nothing when the file is not open. Throws naming the
  // file when it cannot be written.
  void write(int64_t step, const std::pair<at::Tensor, at::Tensor>& global, int world);

 private:
  std::ofstream out_;
  std::string path_;
  int64_t grad_accum_ = 1;
  int64_t seq_len_ = 0;
};

}  // namespace fsdp::train
