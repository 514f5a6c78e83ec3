// Prefetch and overlap: results are bit-identical with prefetch on and off, the number of
// units unsharded at once stays within the current unit plus the prefetch depth, a unit that
// is prefetched but not run neither leaks nor hangs, and ranks whose compute is delayed at
// random still agree with the single-process reference; under HSDP no unit's backward waits
// for an all-reduce across replicas.
#include "support/forwarding_group.h"
#include "support/harness.h"

#include <fsdp/fully_shard.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::test {
namespace {

// A stack of units: x -> x + tanh(W_i x + b_i), with an optional per-rank random delay in
// each unit's forward and a switch that skips one unit (for the "prefetched but not run" case).
struct DeepBlockImpl : torch::nn::Module {
  DeepBlockImpl(int64_t width, uint64_t seed) {
    fc = register_module("fc", torch::nn::Linear(width, width));
    at::NoGradGuard no_grad;
    fc->weight.copy_(seeded_uniform({width, width}, seed, 0.3));
    fc->bias.copy_(seeded_uniform({width}, seed + 1, 0.1));
  }
  at::Tensor forward(const at::Tensor& x) {
    if (delay) delay();
    return x + at::tanh(fc(x));
  }
  torch::nn::Linear fc{nullptr};
  std::function<void()> delay;
};
TORCH_MODULE(DeepBlock);

struct DeepNetImpl : torch::nn::Module {
  DeepNetImpl(int64_t width, int depth) {
    head = register_module("head", torch::nn::Linear(width, 1));
    list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(DeepBlock(width, 1000 + 10 * i));
      list->push_back(blocks.back());
    }
    at::NoGradGuard no_grad;
    head->weight.copy_(seeded_uniform({1, width}, 5, 0.3));
    head->bias.zero_();
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (size_t i = 0; i < blocks.size(); ++i) {
      if (static_cast<int>(i) == skip) continue;
      if (probe) probe();
      h = fsdp::forward(blocks[i], h);
    }
    return head(h);
  }
  torch::nn::Linear head{nullptr};
  torch::nn::ModuleList list{nullptr};
  std::vector<DeepBlock> blocks;
  int skip = -1;
  std::function<void()> probe;
};
TORCH_MODULE(DeepNet);

constexpr int64_t kWidth = 24;
constexpr int kDepth = 6;

TrainCase deep_case(int prefetch) {
  TrainCase c;
  c.make_model = [](const DeviceMesh*) { return DeepNet(kWidth, kDepth).ptr(); };
  c.shard = [prefetch](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto net = std::static_pointer_cast<DeepNetImpl>(m);
    for (auto& block : net->blocks) fully_shard(block, mesh);
    fully_shard(m, mesh).set_implicit_prefetch(prefetch);
  };
  c.loss = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
              const at::Tensor& y) {
    DeepNet net(std::static_pointer_cast<DeepNetImpl>(m));
    return (fsdp::forward(net, x) - y).pow(2).mean();
  };
  c.batch = [](int64_t step) {
    return std::make_pair(seeded_uniform({12, kWidth}, 300 + step),
                          seeded_uniform({12, 1}, 400 + step));
  };
  c.steps = 6;
  c.lr = 1e-3;
  return c;
}

void expect_identical_runs(const std::vector<TrainRecord>& a, const std::vector<TrainRecord>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].losses, b[r].losses) << "rank " << r;
    EXPECT_EQ(a[r].grad_norms, b[r].grad_norms) << "rank " << r;
    for (const auto& [name, t] : a[r].params) {
      EXPECT_TRUE(at::equal(t, b[r].params.at(name))) << name << " on rank " << r;
    }
  }
}

TEST(Prefetch, BitIdenticalToNoPrefetchAndEqualToReference) {
  for (int world : {2, 3}) {
    const auto off = train_sharded(deep_case(0), world);
    const auto on = train_sharded(deep_case(1), world);
    const auto deep = train_sharded(deep_case(3), world);
    expect_identical_runs(off, on);
    expect_identical_runs(off, deep);
    expect_equivalent(train_reference(deep_case(1)), on, 1e-5, 1e-5);
  }
}

// At most the root, the running unit and `prefetch` prefetched units are unsharded or being
// gathered at any time, and nothing is left over after a step.
TEST(Prefetch, UnshardedUnitsAreBounded) {
  for (int prefetch : {0, 1, 2}) {
    train_sharded(deep_case(prefetch), 2,
                  [&](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
                    RankStats& stats = stats_of(*m);
                    const MemorySnapshot peak = stats.peak();
                    EXPECT_LE(peak.unsharded_units, 2 + prefetch) << "prefetch " << prefetch;
                    EXPECT_GE(peak.unsharded_units, prefetch == 0 ? 2 : 3)
                        << "prefetch " << prefetch << " never prefetched";
                    const MemorySnapshot live = stats.live();
                    EXPECT_EQ(live.unsharded_units, 0);
                    EXPECT_EQ(live.unsharded_param_bytes, 0);
                    EXPECT_EQ(live.comm_buffer_bytes, 0);
                    stats.reset_peaks();
                  });
  }
}

TEST(Prefetch, ForwardPrefetchIsInFlightWhileTheUnitBeforeRuns) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    TrainCase c = deep_case(1);
    DeepNet net(kWidth, kDepth);
    c.shard(net.ptr(), mesh);
    auto [x, y] = c.batch(0);
    c.loss(net.ptr(), x.narrow(0, group->rank() * 4, 4), y.narrow(0, group->rank() * 4, 4))
        .backward();
    // Second step: the forward order is known, so block i+1's gather is issued before block i runs.
    int in_flight = 0;
    for (size_t i = 0; i + 1 < net->blocks.size(); ++i) {
      auto next = fsdp_module_of(*net->blocks[i + 1]);
      net->blocks[i]->delay = [next, &in_flight] { in_flight += next->gather_in_flight() ? 1 : 0; };
    }
    c.loss(net.ptr(), x.narrow(0, group->rank() * 4, 4), y.narrow(0, group->rank() * 4, 4))
        .backward();
    EXPECT_EQ(in_flight, kDepth - 1);
  });
}

TEST(Prefetch, ExplicitPrefetchAndAsyncUnshard) {
  run_ranks_in_threads(2, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    TrainCase c = deep_case(0);  // implicit off: only the explicit lists act
    DeepNet net(kWidth, kDepth);
    c.shard(net.ptr(), mesh);
    observe_with(*net, std::make_shared<RankMonitor>());
    std::vector<FSDPModule> units;
    for (auto& block : net->blocks) units.push_back(*fsdp_module_of(*block));
    for (size_t i = 0; i + 2 < units.size(); ++i)
      units[i].set_modules_to_forward_prefetch({units[i + 1], units[i + 2]});
    for (size_t i = 2; i < units.size(); ++i)
      units[i].set_modules_to_backward_prefetch({units[i - 1]});
    int forward_hits = 0;
    for (size_t i = 0; i + 2 < units.size(); ++i) {
      FSDPModule a = units[i + 1], b = units[i + 2];
      net->blocks[i]->delay = [a, b, &forward_hits] {
        forward_hits += (a.gather_in_flight() || a.is_unsharded()) && b.gather_in_flight() ? 1 : 0;
      };
    }
    auto [x, y] = c.batch(0);
    c.loss(net.ptr(), x.narrow(0, group->rank() * 4, 4), y.narrow(0, group->rank() * 4, 4))
        .backward();
    EXPECT_EQ(forward_hits, kDepth - 2);
    EXPECT_EQ(stats_of(*net).live().unsharded_units, 0);

    // unshard(async): issued, then completed by the handle.
    UnshardHandle handle = units[0].unshard(/*async_op=*/true);
    EXPECT_TRUE(units[0].gather_in_flight());
    handle.wait();
    EXPECT_TRUE(units[0].is_unsharded());
    EXPECT_EQ(net->blocks[0]->fc->weight.sizes(), (std::vector<int64_t>{kWidth, kWidth}));
    units[0].reshard();
    EXPECT_FALSE(units[0].is_unsharded());
    EXPECT_EQ(net->blocks[0]->fc->weight.size(0), kWidth / 2);
  });
}

TEST(Prefetch, UnitPrefetchedButNotRunNeitherLeaksNorHangs) {
  ProcessGroupOptions options;
  options.timeout = std::chrono::seconds(20);
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        TrainCase c = deep_case(2);
        DeepNet net(kWidth, kDepth);
        c.shard(net.ptr(), mesh);
        observe_with(*net, std::make_shared<RankMonitor>());
        auto [x, y] = c.batch(0);
        const at::Tensor xs = x.narrow(0, group->rank() * 4, 4),
                         ys = y.narrow(0, group->rank() * 4, 4);
        c.loss(net.ptr(), xs, ys).backward();  // records the order
        for (auto& p : unique_parameters(*net)) p.mutable_grad() = at::Tensor();  // zero_grad
        net->skip = 2;  // block 2 is prefetched (from blocks 0 and 1) but skipped
        c.loss(net.ptr(), xs, ys).backward();
        EXPECT_EQ(stats_of(*net).live().unsharded_units, 0);
        EXPECT_EQ(stats_of(*net).live().comm_buffer_bytes, 0);
        EXPECT_EQ(stats_of(*net).live().unsharded_param_bytes, 0);
        EXPECT_FALSE(fsdp_module_of(*net->blocks[2])->gather_in_flight());
        // The skipped block took no part in the step, so, as in plain LibTorch, it has no gradient
        // (and no rank reduce-scattered one for it).
        EXPECT_FALSE(net->blocks[2]->fc->weight.grad().defined());
        EXPECT_TRUE(net->blocks[1]->fc->weight.grad().defined());
        net->skip = -1;
        c.loss(net.ptr(), xs, ys).backward();  // and the group still works
        EXPECT_EQ(stats_of(*net).live().unsharded_units, 0);
      },
      options);
}

TEST(Prefetch, RandomComputeDelaysPerRank) {
  TrainCase c = deep_case(2);
  c.steps = 4;
  const TrainRecord reference = train_reference(c);
  auto base_make = c.make_model;
  c.make_model = [base_make](const DeviceMesh* mesh) {
    auto model = base_make(mesh);
    auto net = std::static_pointer_cast<DeepNetImpl>(model);
    const int rank = mesh != nullptr ? mesh->shard_rank() : 0;
    auto gen = std::make_shared<std::mt19937>(1234 + rank);
    for (auto& block : net->blocks) {
      block->delay = [gen] {
        std::this_thread::sleep_for(
            std::chrono::microseconds(std::uniform_int_distribution<int>(0, 3000)(*gen)));
      };
    }
    return model;
  };
  const auto ranks =
      train_sharded(c, 3, [](int, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
        RankStats& stats = stats_of(*m);
        EXPECT_LE(stats.peak().unsharded_units, 2 + 2);
        EXPECT_EQ(stats.live().unsharded_units, 0);
        stats.reset_peaks();
      });
  expect_equivalent(reference, ranks, 1e-5, 1e-5);
}

// --- HSDP: when the all-reduces across replicas are waited ---

// Records, in order, when each gradient all-reduce (more than one element: the harness's loss
// average is a scalar) is issued and when it is waited.
struct AllReduceLog {
  std::mutex mutex;
  std::vector<std::string> events;  // "issue" and "wait"
  void add(const char* event) {
    std::lock_guard<std::mutex> lock(mutex);
    events.emplace_back(event);
  }
};

class LoggedWork : public Work {
 public:
  LoggedWork(WorkHandle inner, std::shared_ptr<AllReduceLog> log)
      : inner_(std::move(inner)), log_(std::move(log)) {}
  void wait() override {
    log_->add("wait");
    inner_->wait();
  }
  void wait_on_stream() override {
    log_->add("wait");
    inner_->wait_on_stream();
  }
  bool is_completed() override { return inner_->is_completed(); }

 private:
  WorkHandle inner_;
  std::shared_ptr<AllReduceLog> log_;
};

class AllReduceLoggingGroup : public ForwardingGroup {
 public:
  AllReduceLoggingGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<AllReduceLog> log)
      : ForwardingGroup(std::move(inner)), log_(std::move(log)) {}
  WorkHandle all_reduce(const at::Tensor& t, ReduceOp op) override {
    WorkHandle work = inner().all_reduce(t, op);
    if (!log_ || t.numel() == 1) return work;
    log_->add("issue");
    return std::make_shared<LoggedWork>(std::move(work), log_);
  }

 private:
  std::shared_ptr<ProcessGroup> wrap_split(std::shared_ptr<ProcessGroup> inner) override {
    return std::make_shared<AllReduceLoggingGroup>(std::move(inner), log_);
  }
  std::shared_ptr<AllReduceLog> log_;  // null: record nothing (every rank but 0)
};

// [Note: HSDP's all-reduce runs beside the next units' backward]: on a 2 x 2 mesh every unit's
// all-reduce across replicas is issued before the first is waited, at the end of backward, so
// no unit's backward waits for one. (The estimator's replay and the stream schedule assume the
// same; with a cap of two in flight, the third unit's post-backward waited for the first's.)
TEST(Prefetch, HsdpWaitsForNoAllReduceBeforeTheEndOfBackward) {
  auto log = std::make_shared<AllReduceLog>();
  run_ranks_in_threads(4, [&](std::shared_ptr<ProcessGroup> group) {
    auto logged =
        std::make_shared<AllReduceLoggingGroup>(group, group->rank() == 0 ? log : nullptr);
    const DeviceMesh mesh = DeviceMesh::hybrid(logged, 2);
    TrainCase c = deep_case(1);
    auto model = c.make_model(&mesh);
    c.shard(model, mesh);
    auto [x, y] = c.batch(0);
    c.loss(model, x.narrow(0, 3 * group->rank(), 3), y.narrow(0, 3 * group->rank(), 3)).backward();
  });
  std::vector<std::string> expected(kDepth + 1, "issue");
  expected.resize(2 * (kDepth + 1), "wait");
  EXPECT_EQ(log->events, expected);
}

}  // namespace
}  // namespace fsdp::test
