// fsdp::embedding: a table lookup inside the table's FSDP scope, vocabulary-parallel under
// RowwiseParallel (see fsdp/tensor_parallel.h), and read from the table's shards when another
// unit, not gathered here, owns the table (runtime/sharded_lookup.h).
//
// Each rank holds rows first.. first + rows of the table. A token outside them looks up row 0 of
// the slice, zeroed after the lookup (so its gradient, zero, adds nothing to that row); the sum
// over the group then holds every token's row exactly once.
#include <fsdp/runtime/forward.h>
#include <fsdp/tensor_parallel.h>

#include "runtime/sharded_lookup.h"
#include "tensor_parallel/tp_layer.h"

#include <ATen/ATen.h>

namespace fsdp {
namespace {

at::Tensor vocabulary_parallel_lookup(const detail::TpLayer& tp, const at::Tensor& table,
                                      const at::Tensor& ids) {
  const int64_t rows = table.size(0), first = tp.first;  // [Note: an uneven vocabulary]
  const at::Tensor outside = (ids < first).logical_or(ids >= first + rows);
  const at::Tensor partial = at::embedding(table, (ids - first).masked_fill(outside, 0))
                                 .masked_fill(outside.unsqueeze(-1), 0);
  return tp.style.to() == Layout::kSequenceShard
             ? detail::reduce_scatter_sequence(partial, tp.site)
             : detail::reduce_from_tensor_parallel(partial, tp.site);
}

}  // namespace

at::Tensor embedding(torch::nn::Embedding& table, const at::Tensor& ids) {
  const detail::TpLayer* tp = detail::tp_layer_of(*table);
  return forward_with(
      table,
      [&table, tp](const at::Tensor& in) {
        if (tp == nullptr || tp->style.kind() != ParallelStyle::Kind::kRowwise) {
          // A table another unit owns (a tied head's) is read from its shards.
          if (auto rows = detail::lookup_from_shards(table->weight, in)) return *rows;
          return at::embedding(table->weight, in);
        }
        return vocabulary_parallel_lookup(*tp, table->weight, in);
      },
      ids);
}

}  // namespace fsdp
