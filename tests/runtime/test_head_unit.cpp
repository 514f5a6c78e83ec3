// The output head as an FSDP unit of its own, owning GPT-2's tied table, whose lookup reads the
// table's shards (fsdp-train --head-unit; [Note: a lookup from shards]): against the
// single-process reference at W = 1 (bit for bit), W = 2, 3, 4, HSDP, accumulation without
// sync and bf16, and the lookup alone against at::embedding of the whole table, for ranks that
// look up different numbers of ids, and on side groups that do not wait for the shard group's
// queue.
#include "support/gpt_case.h"
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>
#include <fsdp/tensor_parallel.h>
#include <models/gpt2/gpt2.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/embedding.h>

#include <chrono>
#include <mutex>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

TrainCase head_unit_case(GptCaseOptions opt = {}) {
  opt.head_unit = true;
  return gpt_case(opt);
}

TEST(HeadUnit, OneRankIsBitIdenticalToNoFsdp) {
  const TrainCase c = head_unit_case();
  expect_bit_identical(train_reference(c), train_sharded(c, 1)[0]);
}

class HeadUnitW : public ::testing::TestWithParam<int> {};

TEST_P(HeadUnitW, MatchesSingleProcess) {
  const TrainCase c = head_unit_case();
  expect_equivalent(train_reference(c), train_sharded(c, GetParam()), 1e-5, 1e-5);
}

// W = 3 splits the 256-row table unevenly (86, 86, 84 rows).
INSTANTIATE_TEST_SUITE_P(World, HeadUnitW, ::testing::Values(2, 3, 4));

TEST(HeadUnit, TheHeadsUnitOwnsTheTiedTable) {
  TrainCase c = head_unit_case();
  c.steps = 1;
  train_sharded(c, 2, [](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
    auto model = std::static_pointer_cast<models::GPT2LMHeadImpl>(m);
    const c10::TensorImpl* table = model->transformer->wte->weight.unsafeGetTensorImpl();
    const auto owns_table = [table](const FSDPModule& unit) {
      for (const auto& p : unit.sharded_parameters()) {
        if (p.local.unsafeGetTensorImpl() == table) return true;
      }
      return false;
    };
    EXPECT_TRUE(owns_table(*fsdp_module_of(*model->lm_head)));
    EXPECT_FALSE(owns_table(*fsdp_module_of(*model)));
  });
}

TEST(HeadUnit, HybridShardMatchesSingleProcess) {
  TrainCase c = head_unit_case();
  c.replicate = 2;  // 2 replicas x 2 shards: the lookup's gradient is gathered across replicas
  expect_equivalent(train_reference(c), train_sharded(c, 4), 1e-5, 1e-5);
}

TEST(HeadUnit, AccumulationWithoutSyncMatchesSingleProcess) {
  GptCaseOptions opt;
  opt.accumulation = 3;
  TrainCase c = head_unit_case(opt);
  // The lookup's gradient is reduced at every micro-batch and waits for the one that syncs.
  c.before_micro_batch = [](const std::shared_ptr<torch::nn::Module>& m, int micro) {
    fsdp_module_of(*m)->set_requires_gradient_sync(micro == 2);
  };
  expect_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
}

TEST(HeadUnit, Bf16MatchesSingleProcessBf16Compute) {
  GptCaseOptions opt;
  opt.mp_policy.param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  const TrainCase c = head_unit_case(opt);
  // As MixedPrecision.Bf16MatchesSingleProcessBf16ComputeWithFp32Masters.
  expect_equivalent(train_reference_mixed(c, at::kBFloat16), train_sharded(c, 4), 2e-2, 1e-2);
}

// --- the lookup alone ---

constexpr int64_t kRows = 10, kWidth = 4;

// A table whose weight a unit of its own owns (as the tied head owns GPT-2's).
struct TableOwnerImpl : torch::nn::Module {
  explicit TableOwnerImpl(const at::Tensor& w) { weight = register_parameter("weight", w); }
  at::Tensor weight;
};
TORCH_MODULE(TableOwner);

struct TableNetImpl : torch::nn::Module {
  TableNetImpl() {
    table = register_module("table", torch::nn::Embedding(kRows, kWidth));
    at::NoGradGuard no_grad;
    table->weight.set_data(seeded_uniform({kRows, kWidth}, 5));
    owner = register_module("owner", TableOwner(table->weight));
  }
  torch::nn::Embedding table{nullptr};
  TableOwner owner{nullptr};
};
TORCH_MODULE(TableNet);

// Rank r looks up 2r + 1 ids (rank 3: none), each scaled in the loss by its own weight.
at::Tensor ids_of(int rank) {
  if (rank == 3) return at::empty({0}, at::kLong);
  return at::remainder(at::arange(2 * rank + 1, at::kLong) * 7 + rank, kRows).view({1, -1});
}
at::Tensor weights_of(int rank, int64_t n) { return seeded_uniform({1, n, kWidth}, 11 + rank); }

TEST(LookupFromShards, EqualsTheWholeTablesLookupAndGradient) {
  constexpr int kWorld = 4;  // 10 rows: 3, 3, 3 and 1 real rows per rank
  const at::Tensor full = seeded_uniform({kRows, kWidth}, 5);
  // Reference gradient: every rank's tokens summed, divided by W (the units' mean).
  at::Tensor expected_grad = at::zeros({kRows, kWidth});
  for (int r = 0; r < kWorld; ++r) {
    const at::Tensor ids = ids_of(r).reshape({-1});
    expected_grad.index_add_(0, ids, weights_of(r, ids.numel()).reshape({-1, kWidth}));
  }
  expected_grad.div_(kWorld);
  std::mutex mu;
  std::vector<std::string> failures;
  run_ranks_in_threads(kWorld, [&](std::shared_ptr<ProcessGroup> group) {
    const int rank = group->rank();
    DeviceMesh mesh(group);
    TableNet net;
    fully_shard(net->owner.ptr(), mesh);
    fully_shard(net.ptr(), mesh);
    const at::Tensor ids = ids_of(rank);
    const at::Tensor rows = fsdp::embedding(net->table, ids);
    EXPECT_TRUE(at::equal(rows, at::embedding(full, ids))) << "rank " << rank;
    (rows * weights_of(rank, ids.numel())).sum().backward();
    const ShardedParameter shard = fsdp_module_of(*net->owner)->sharded_parameters().at(0);
    const int64_t first = shard.metadata.local_offset, n = shard.metadata.local_rows;
    const at::Tensor grad = net->table->weight.grad();
    if (!grad.defined() ||
        !at::allclose(grad.narrow(0, 0, n), expected_grad.narrow(0, first, n), 1e-6, 1e-6)) {
      std::lock_guard<std::mutex> lock(mu);
      failures.push_back("rank " + std::to_string(rank) + ": gradient " +
                         (grad.defined() ? "differs" : "missing"));
    }
  });
  EXPECT_TRUE(failures.empty()) << ::testing::PrintToString(failures);
}

// [Note: a lookup's collectives on side groups] Rank 0 leaves an all-gather queued on the shard
// group that rank 1 joins only after its lookup: on the shard group rank 0's lookup would wait
// behind it (and pair its first collective with rank 1's lookup); on the side group both ranks'
// lookups finish first. The side group's counters hold the lookup's collectives, and the mesh's
// counters count them.
TEST(LookupFromShards, DoesNotQueueBehindTheShardGroupsCollectives) {
  const at::Tensor full = seeded_uniform({kRows, kWidth}, 5);
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(20);
  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> group) {
        const int rank = group->rank();
        DeviceMesh mesh(group);
        TableNet net;
        fully_shard(net->owner.ptr(), mesh);
        const ProcessGroup& side = *mesh.side_groups().shard;
        ASSERT_NE(&side, group.get());
        const int64_t mesh_calls_before = mesh.counters().all_gather.calls;
        const at::Tensor in = at::full({3}, rank, at::kFloat), out = at::empty({2, 3});
        WorkHandle pending;
        if (rank == 0) pending = group->all_gather_into_tensor(out, in);
        const at::Tensor ids = ids_of(rank);
        EXPECT_TRUE(at::equal(fsdp::embedding(net->table, ids), at::embedding(full, ids)));
        if (rank == 1) pending = group->all_gather_into_tensor(out, in);
        pending->wait();
        EXPECT_TRUE(at::equal(out, at::stack({at::zeros({3}), at::ones({3})})));
        EXPECT_EQ(side.counters().all_gather.calls, 2);  // the counts, then the ids
        EXPECT_EQ(side.counters().reduce_scatter.calls, 1);
        EXPECT_EQ(mesh.counters().all_gather.calls, mesh_calls_before + 3);
      },
      options);
}

TEST(LookupFromShards, AnIdOutsideTheTableFailsOnEveryRankNamingTheRank) {
  std::mutex mu;
  std::vector<std::string> errors(2);
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    const int rank = group->rank();
    DeviceMesh mesh(group);
    TableNet net;
    fully_shard(net->owner.ptr(), mesh);
    const at::Tensor ids = at::tensor({int64_t{1}, rank == 1 ? kRows : int64_t{2}}, at::kLong);
    const std::string message = error_message([&] { fsdp::embedding(net->table, ids); });
    std::lock_guard<std::mutex> lock(mu);
    errors[rank] = message;
  });
  for (const std::string& e : errors) {
    EXPECT_THAT(e, HasSubstr("rank 1 of the shard group looks up a token id outside [0, 10)"));
  }
  EXPECT_THAT(errors[1], HasSubstr("this rank: ids from 1 to 10"));
}

}  // namespace
}  // namespace fsdp::test
