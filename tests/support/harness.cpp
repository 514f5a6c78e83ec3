// Implementation of the equivalence harness; see harness.h.
#include "support/harness.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/utils/clip_grad.h>

#include <string>
#include <unordered_map>

namespace fsdp::test {
namespace {

torch::optim::AdamW make_optimizer(const std::vector<at::Tensor>& params, const TrainCase& c) {
  return torch::optim::AdamW(
      params, torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay).eps(c.adam_eps));
}

std::shared_ptr<torch::nn::Module> build(const TrainCase& c, const DeviceMesh* mesh) {
  auto model = c.make_model(mesh);
  if (c.dtype != at::kFloat) model->to(c.dtype);
  return model;
}

std::pair<at::Tensor, at::Tensor> batch_of(const TrainCase& c, int64_t index) {
  auto [inputs, targets] = c.batch(index);
  if (inputs.is_floating_point()) inputs = inputs.to(c.dtype);
  if (targets.is_floating_point()) targets = targets.to(c.dtype);
  return {inputs, targets};
}

at::Tensor slice_rows(const at::Tensor& t, int rank, int world) {
  const int64_t rows = t.size(0) / world;
  return t.narrow(0, rank * rows, rows);
}

}  // namespace

at::Tensor seeded_uniform(c10::IntArrayRef shape, uint64_t seed, double scale) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::empty(shape).uniform_(-scale, scale, gen);
}

TrainRecord train_reference(const TrainCase& c) {
  TrainRecord record;
  auto model = build(c, nullptr);
  auto params = unique_parameters(*model);
  auto optimizer = make_optimizer(params, c);
  for (int64_t step = 0; step < c.steps; ++step) {
    optimizer.zero_grad();
    double loss_sum = 0;
    for (int micro = 0; micro < c.accumulation; ++micro) {
      auto [inputs, targets] = batch_of(c, step * c.accumulation + micro);
      at::Tensor loss = c.loss(model, inputs, targets) / c.accumulation;
      loss.backward();
      loss_sum += loss.item<double>();
    }
    record.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(params, c.max_grad_norm));
    record.losses.push_back(loss_sum);
    optimizer.step();
  }
  for (auto& [name, p] : unique_named_parameters(*model)) record.params[name] = p.detach().clone();
  return record;
}

void observe_with(const torch::nn::Module& model, const std::shared_ptr<RankMonitor>& monitor) {
  for (FSDPModule unit : fsdp_modules_under(model)) {
    if (!unit.observer()) unit.set_observer(monitor);
  }
}

RankStats& stats_of(const torch::nn::Module& model) {
  const auto units = fsdp_modules_under(model);
  TORCH_CHECK(!units.empty(), "stats_of: the model has no FSDP unit");
  auto* monitor = dynamic_cast<RankMonitor*>(units.front().observer().get());
  TORCH_CHECK(monitor != nullptr, "stats_of: the model's units report to no RankMonitor");
  return monitor->stats();
}

std::vector<TrainRecord> train_sharded(
    const TrainCase& c, int world,
    std::function<void(int, const std::shared_ptr<torch::nn::Module>&, const DeviceMesh&)>
        after_step) {
  std::vector<TrainRecord> records(world);
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(60);
  run_ranks_in_threads(
      world,
      [&](std::shared_ptr<ProcessGroup> group) {
        const int rank = group->rank();
        DeviceMesh mesh = DeviceMesh::hybrid(group, c.replicate);
        auto model = build(c, &mesh);
        c.shard(model, mesh);
        observe_with(*model, std::make_shared<RankMonitor>());
        auto params = unique_parameters(*model);
        auto optimizer = make_optimizer(params, c);
        TrainRecord& record = records[rank];
        for (int64_t step = 0; step < c.steps; ++step) {
          optimizer.zero_grad();
          double loss_sum = 0;
          for (int micro = 0; micro < c.accumulation; ++micro) {
            auto [inputs, targets] = batch_of(c, step * c.accumulation + micro);
            if (c.before_micro_batch) c.before_micro_batch(model, micro);
            at::Tensor loss =
                c.loss(model, slice_rows(inputs, rank, world), slice_rows(targets, rank, world)) /
                c.accumulation;
            loss.backward();
            at::Tensor summed = loss.detach().clone().reshape({1});
            group->all_reduce(summed, ReduceOp::kSum)->wait();
            loss_sum += summed.item<double>() / world;
          }
          record.grad_norms.push_back(clip_grad_norm_(params, c.max_grad_norm, mesh));
          record.losses.push_back(loss_sum);
          optimizer.step();
          if (after_step) after_step(rank, model, mesh);
        }
        // Each tensor under the model's first name for it, as checkpoints name it: a tied
        // table a head's unit owns is still transformer.wte.weight.
        std::unordered_map<const c10::TensorImpl*, std::string> names;
        for (const auto& [name, p] : unique_named_parameters(*model))
          names.emplace(p.unsafeGetTensorImpl(), name);
        for (const auto& unit : fsdp_modules_under(*model)) {
          for (const auto& sp : unit.sharded_parameters()) {
            const std::string& name = names.at(sp.local.unsafeGetTensorImpl());
            record.params[name] = sp.local.detach().clone();
            record.metadata[name] = sp.metadata;
          }
        }
      },
      options);
  return records;
}

TrainRecord train_reference_mixed(const TrainCase& c, at::ScalarType param_dtype) {
  TrainRecord record;
  auto master = c.make_model(nullptr);
  auto compute = c.make_model(nullptr);
  compute->to(param_dtype);
  const auto master_params = unique_parameters(*master);
  const auto compute_params = unique_parameters(*compute);
  torch::optim::AdamW optimizer(master_params,
                                torch::optim::AdamWOptions(c.lr).weight_decay(c.weight_decay));
  for (int64_t step = 0; step < c.steps; ++step) {
    {
      at::NoGradGuard no_grad;
      for (size_t i = 0; i < master_params.size(); ++i) compute_params[i].copy_(master_params[i]);
    }
    for (auto& p : compute_params) p.mutable_grad() = at::Tensor();
    auto [inputs, targets] = c.batch(step);
    at::Tensor loss = c.loss(compute, inputs, targets);
    loss.backward();
    optimizer.zero_grad();
    for (size_t i = 0; i < master_params.size(); ++i) {
      const_cast<at::Tensor&>(master_params[i]).mutable_grad() =
          compute_params[i].grad().to(at::kFloat);
    }
    record.grad_norms.push_back(torch::nn::utils::clip_grad_norm_(master_params, c.max_grad_norm));
    record.losses.push_back(loss.item<double>());
    optimizer.step();
  }
  for (auto& [name, p] : unique_named_parameters(*master)) record.params[name] = p.detach().clone();
  return record;
}

void expect_equivalent(const TrainRecord& reference, const std::vector<TrainRecord>& ranks,
                       double rel_tol, double abs_tol) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const TrainRecord& got = ranks[r];
    ASSERT_EQ(got.losses.size(), reference.losses.size());
    for (size_t s = 0; s < reference.losses.size(); ++s) {
      EXPECT_NEAR(got.losses[s], reference.losses[s], rel_tol * std::abs(reference.losses[s]))
          << "loss, rank " << r << " step " << s;
      EXPECT_NEAR(got.grad_norms[s], reference.grad_norms[s],
                  rel_tol * std::abs(reference.grad_norms[s]))
          << "grad norm, rank " << r << " step " << s;
    }
    size_t compared = 0;
    for (const auto& [key, shard] : got.params) {
      const std::string& name = key;
      auto it = reference.params.find(name);
      ASSERT_NE(it, reference.params.end()) << "no reference parameter " << name;
      const ShardMetadata& m = got.metadata.at(key);
      // Slices [local_offset, + local_rows) along the shard dim, then padding (Shard(d)).
      const int64_t d = m.shard_dim;
      const at::Tensor full = m.global_shape.empty() ? it->second.reshape({1}) : it->second;
      std::vector<int64_t> padded_shape = full.sizes().vec();
      padded_shape[d] = m.padded_rows;
      const at::Tensor local = shard.reshape(padded_shape);
      if (m.local_rows > 0) {
        const at::Tensor mine = local.narrow(d, 0, m.local_rows);
        const at::Tensor want = full.narrow(d, m.local_offset, m.local_rows);
        const double diff = (mine - want).abs().max().item<double>();
        EXPECT_LE(diff, abs_tol) << "parameter " << name << " rank " << r;
      }
      if (m.local_rows < m.padded_rows) {
        EXPECT_EQ(
            local.narrow(d, m.local_rows, m.padded_rows - m.local_rows).abs().sum().item<double>(),
            0.0)
            << "padding of " << name << " on rank " << r << " is not zero";
      }
      ++compared;
    }
    EXPECT_EQ(compared, reference.params.size())
        << "rank " << r << " compared a different set of parameters";
  }
}

void expect_bit_identical(const TrainRecord& reference, const TrainRecord& rank0) {
  ASSERT_EQ(rank0.losses.size(), reference.losses.size());
  for (size_t s = 0; s < reference.losses.size(); ++s) {
    EXPECT_EQ(rank0.losses[s], reference.losses[s]) << "loss at step " << s;
    EXPECT_EQ(rank0.grad_norms[s], reference.grad_norms[s]) << "grad norm at step " << s;
  }
  ASSERT_EQ(rank0.params.size(), reference.params.size());
  for (const auto& [key, shard] : rank0.params) {
    const std::string& name = key;
    const at::Tensor& want = reference.params.at(name);
    const at::Tensor got = shard.reshape(want.sizes());
    EXPECT_TRUE(at::equal(got, want))
        << "parameter " << name << ": " << (got != want).sum().item<int64_t>() << " of "
        << want.numel() << " elements differ, by at most "
        << (got.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>();
  }
}

}  // namespace fsdp::test
