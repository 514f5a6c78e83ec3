// What sharded and full checkpoints share: this rank's view of each parameter (its rows of
// the global tensor), and agreeing on failure across ranks.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/fully_shard.h>

#include <ATen/core/Tensor.h>

#include <exception>
#include <string>
#include <vector>

namespace fsdp::checkpoint::detail {

// One distinct parameter of the model, as this rank holds it.
struct LocalParam {
  std::string name;   // full name under the model (a tied parameter once, at its first name)
  at::Tensor param;   // the parameter itself (its data is the padded shard when sharded)
  std::vector<int64_t> global_shape;
  int64_t dim0 = 1;       // rows of the global tensor (1 for 0-D)
  int64_t row_numel = 1;  // elements per row
  int64_t offset = 0;     // first global row this rank holds
  int64_t rows = 0;       // real rows this rank holds
  int64_t padded_rows = 0;  // rows of the local tensor, padding included
  bool sharded = false;   // false: every rank holds the full tensor

  // The local tensor (param, or a state tensor of the same shape) as [padded_rows, row_numel].
  at::Tensor rows_view(const at::Tensor& local) const;
};

// Every distinct parameter of model, in named_parameters() order. Parameters of FSDP units get
// their shard layout; others are full on every rank. Throws when a sharded parameter is
// currently unsharded, when its mesh does not match group (size and rank), or when the model
// is sharded over several ranks but group is null.
std::vector<LocalParam> local_params(const torch::nn::Module& model, ProcessGroup* group);

// Collective: every rank passes its own error (or null). Returns when no rank failed;
// otherwise throws on every rank a message naming each failed rank and its message, prefixed
// by what. With a null group, rethrows error as is.
void agree(ProcessGroup* group, const std::exception_ptr& error, const std::string& what);

// "[3, 4]".
std::string shape_string(c10::IntArrayRef shape);

}  // namespace fsdp::checkpoint::detail
