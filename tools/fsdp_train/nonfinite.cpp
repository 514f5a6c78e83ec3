// The numerics guard's report (see nonfinite.h). Each rank contributes two numbers: whether its
// own loss was finite, and the index of the first of its units (in backward order) holding a
// non-finite gradient element; an all-gather gives every rank the whole picture, so all ranks
// print and throw the same message.
#include <fsdp_train/nonfinite.h>

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

namespace fsdp::train {
namespace {

int64_t first_nonfinite_unit(const std::vector<UnitParams>& units) {
  for (size_t u = 0; u < units.size(); ++u) {
    for (const at::Tensor& p : units[u].second) {
      const at::Tensor& g = p.grad();
      if (g.defined() && g.numel() > 0 && !at::isfinite(g).all().item<bool>()) {
        return static_cast<int64_t>(u);
      }
    }
  }
  return -1;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

}  // namespace

std::string describe_nonfinite(int64_t step, const at::Tensor& local_loss, double grad_norm,
                               const std::vector<UnitParams>& units, ProcessGroup* group) {
  const double loss = local_loss.item<double>();
  const at::Tensor mine =
      at::tensor({std::isfinite(loss) ? int64_t{0} : int64_t{1}, first_nonfinite_unit(units)});
  const int world = group ? group->size() : 1;
  at::Tensor all = mine;
  if (group) {
    all = at::empty({2 * world}, at::kLong);
    group->all_gather_into_tensor(all, mine)->wait();
  }
  const int64_t* v = all.data_ptr<int64_t>();
  std::vector<int> bad_loss;
  int64_t first_unit = -1;
  for (int r = 0; r < world; ++r) {
    if (v[2 * r] != 0) bad_loss.push_back(r);
    if (v[2 * r + 1] >= 0 && (first_unit < 0 || v[2 * r + 1] < first_unit))
      first_unit = v[2 * r + 1];
  }
  std::vector<int> with_unit;
  for (int r = 0; r < world; ++r) {
    if (first_unit >= 0 && v[2 * r + 1] == first_unit) with_unit.push_back(r);
  }
  std::string text = fmt::format("step {}: ", step + 1);
  text += bad_loss.empty() ? "the loss is finite on every rank"
                           : "the loss is not finite on " + rank_list(bad_loss);
  text += fmt::format("; gradient norm {}", grad_norm);
  text += first_unit < 0 ? "; every gradient is finite"
                         : "; the first unit in backward order with a non-finite gradient is '" +
                               units[static_cast<size_t>(first_unit)].first + "' (on " +
                               rank_list(with_unit) + ")";
  return text;
}

}  // namespace fsdp::train
