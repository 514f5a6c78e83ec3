// A table lookup (at::embedding) that reads the table's rows from the ranks' shards, for a table
// whose FSDP unit is not gathered where the lookup runs: GPT-2's tied embedding when the output
// head is a unit of its own that owns the table, and the lookup runs in the root's forward
// before any of the head's gathers. See [Note: a lookup from shards].
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

namespace fsdp::detail {

// If table is a parameter that an FSDP unit manages and that unit's forward is not running (so
// the table's full values are not gathered here), the rows of ids (int64, any shape) read from
// the shards: [*ids.shape, table's row width], in the unit's compute dtype, equal bit for bit
// to at::embedding of the gathered table. Collective over the unit's shard group (and, in
// backward, its replicate group): every rank of the unit must look up at the same point, each
// with ids of its own, of any length. Its backward reduces the table's gradient over every
// data-parallel rank itself and hands it to the unit (ParamGroup::add_reduced_gradient), so the
// table's own reduction never carries the lookup's rows. Returns nullopt when table is not such
// a parameter: the caller looks up table itself. Throws if the unit shards the table along a dim
// other than 0, offloads it to the host of a device mesh, or a collective fails (naming the
// parameter, the unit, the op and the rank).
std::optional<at::Tensor> lookup_from_shards(const at::Tensor& table, const at::Tensor& ids);

}  // namespace fsdp::detail
