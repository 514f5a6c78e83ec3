// The runtime against the stream schedule as data: a real training step, ranks as threads over
// gloo, reports every stream op it issues to the root's observer (RuntimeObserver::stream_op),
// and that log must
// equal build_stream_schedule's for the same units and options, op for op, and pass
// check_schedule. This ties the schedule to the code that issues it. On CPU the streams are the
// calling thread and the ops run in program order; the log is the order and the events a device
// with streams would get. No GPU is involved.
#include "support/harness.h"

#include <fsdp/fully_shard.h>
#include <fsdp/runtime/observer.h>
#include <fsdp/runtime/stream_schedule.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>

namespace fsdp::test {
namespace {

// x -> x + tanh(W x + b): one unit.
struct StepBlockImpl : torch::nn::Module {
  StepBlockImpl(int64_t width, uint64_t seed) {
    fc = register_module("fc", torch::nn::Linear(width, width));
    at::NoGradGuard no_grad;
    fc->weight.copy_(seeded_uniform({width, width}, seed, 0.3));
    fc->bias.copy_(seeded_uniform({width}, seed + 1, 0.1));
  }
  at::Tensor forward(const at::Tensor& x) { return x + at::tanh(fc(x)); }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(StepBlock);

// N units in sequence under a root that holds no parameter of its own, the schedule's model.
struct StepNetImpl : torch::nn::Module {
  StepNetImpl(int64_t width, int depth) {
    list = register_module("blocks", torch::nn::ModuleList());
    for (int i = 0; i < depth; ++i) {
      blocks.push_back(StepBlock(width, 2000 + 10 * i));
      list->push_back(blocks.back());
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = x;
    for (auto& block : blocks) h = fsdp::forward(block, h);
    return h;
  }
  torch::nn::ModuleList list{nullptr};
  std::vector<StepBlock> blocks;
};
TORCH_MODULE(StepNet);

constexpr int64_t kWidth = 8;

// Collects one rank's ops, with the unit paths "blocks.i" turned into the schedule's indices.
class Log : public RuntimeObserver {
 public:
  bool records_schedule() const override { return true; }
  void stream_op(ScheduleOp op, const std::string& unit) override {
    op.unit = unit.empty() ? -1 : index_of(unit);
    for (auto* names : {&op.waits, &op.reads, &op.writes, &op.frees}) {
      for (auto& n : *names) n = renamed(n);
    }
    op.record = renamed(op.record);
    ops.push_back(std::move(op));
  }
  std::vector<ScheduleOp> ops;

 private:
  static int index_of(const std::string& unit) {
    EXPECT_EQ(unit.rfind("blocks.", 0), 0u) << "an op of unit '" << unit << "'";
    return std::stoi(unit.substr(7));
  }
  // "ag_buf[blocks.2]@fwd" -> "ag_buf[2]@fwd"
  static std::string renamed(const std::string& name) {
    const auto open = name.find('[');
    const auto close = name.find(']');
    if (open == std::string::npos || close == std::string::npos) return name;
    const std::string unit = name.substr(open + 1, close - open - 1);
    return name.substr(0, open + 1) + std::to_string(index_of(unit)) + name.substr(close);
  }
};

// The root's observer, not owned: the test's logs outlive the training.
std::shared_ptr<RuntimeObserver> observed_by(Log& log) {
  return std::shared_ptr<RuntimeObserver>(std::shared_ptr<RuntimeObserver>(), &log);
}

std::string text(const ScheduleOp& op) {
  std::ostringstream out;
  out << describe(op);
  auto list = [&](const char* what, const std::vector<std::string>& v) {
    if (v.empty()) return;
    out << " " << what << "{";
    for (const auto& n : v) out << n << (&n == &v.back() ? "" : ",");
    out << "}";
  };
  list("waits", op.waits);
  list("reads", op.reads);
  list("writes", op.writes);
  if (!op.record.empty()) out << " record " << op.record;
  list("frees", op.frees);
  return out.str();
}

struct RunOptions {
  ScheduleOptions schedule;
  int world = 2;
  int replicate = 1;
  std::optional<at::ScalarType> param_dtype;
  std::optional<int> hpz;  // reshard_after_forward as an int (ZeRO++ hpZ), replacing the bool
};

// Trains two steps and returns each rank's log of the second (the steady state: the first has
// no previous forward order to prefetch by).
std::vector<Log> record_second_step(const RunOptions& o) {
  TrainCase c;
  const int depth = o.schedule.units;
  c.make_model = [depth](const DeviceMesh*) { return StepNet(kWidth, depth).ptr(); };
  c.shard = [o](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto net = std::static_pointer_cast<StepNetImpl>(m);
    FullyShardOptions unit;
    unit.reshard_after_forward(o.schedule.reshard_after_forward);
    if (o.hpz) unit.reshard_after_forward(*o.hpz);
    if (o.param_dtype) unit.mp_policy(MixedPrecisionPolicy().param_dtype(*o.param_dtype));
    for (auto& block : net->blocks) fully_shard(block, mesh, unit);
    fully_shard(m, mesh).set_implicit_prefetch(o.schedule.prefetch);
  };
  c.loss = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
              const at::Tensor& y) {
    StepNet net(std::static_pointer_cast<StepNetImpl>(m));
    return (fsdp::forward(net, x) - y).pow(2).mean();
  };
  c.batch = [](int64_t step) {
    return std::make_pair(seeded_uniform({8, kWidth}, 70 + step), seeded_uniform({8, kWidth}, 90));
  };
  c.steps = 2;
  c.replicate = o.replicate;
  std::vector<Log> logs(o.world);
  train_sharded(c, o.world,
                [&](int rank, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
                  auto root = fsdp_module_of(*m);
                  ASSERT_TRUE(root.has_value());
                  // After step 0, record step 1; after step 1, stop.
                  root->set_observer(logs[rank].ops.empty() ? observed_by(logs[rank]) : nullptr);
                });
  return logs;
}

std::string describe_options(const RunOptions& o) {
  std::ostringstream out;
  out << o.schedule.units << " units, prefetch " << o.schedule.prefetch
      << ", reshard after forward " << o.schedule.reshard_after_forward << ", hsdp "
      << o.schedule.hsdp << ", W " << o.world;
  return out.str();
}

ScheduleOptions schedule_options(int units, int prefetch, bool reshard, bool hsdp) {
  ScheduleOptions s;
  s.units = units;
  s.prefetch = prefetch;
  s.reshard_after_forward = reshard;
  s.hsdp = hsdp;
  return s;
}

void expect_same_ops(const std::vector<ScheduleOp>& got, const std::vector<ScheduleOp>& want,
                     const std::string& where) {
  const size_t n = std::min(got.size(), want.size());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(text(got[i]), text(want[i])) << where << ": op " << i << " of " << want.size();
  }
  ASSERT_EQ(got.size(), want.size())
      << where << ": the runtime issued " << (got.size() > n ? "more" : "fewer")
      << " ops; next: " << text(got.size() > n ? got[n] : want[n]);
}

TEST(StreamRuntime, RecordedStepEqualsTheScheduleAsData) {
  for (int prefetch : {0, 1, 2}) {
    for (bool reshard : {true, false}) {
      for (bool hsdp : {false, true}) {
        RunOptions o;
        o.schedule = schedule_options(4, prefetch, reshard, hsdp);
        o.world = hsdp ? 4 : 2;
        o.replicate = hsdp ? 2 : 1;
        const std::string where = describe_options(o);
        const StreamSchedule want = build_stream_schedule(o.schedule);
        const std::vector<Log> logs = record_second_step(o);
        for (size_t rank = 0; rank < logs.size(); ++rank) {
          SCOPED_TRACE(where + ", rank " + std::to_string(rank));
          expect_same_ops(logs[rank].ops, want.ops, where);
          StreamSchedule got{o.schedule, logs[rank].ops, want.persistent};
          const auto violations = check_schedule(got);
          EXPECT_TRUE(violations.empty()) << violations.front();
        }
      }
    }
  }
}

// With a cast to the compute dtype the copy-in writes a separate input, which the all-gather
// reads and the copy-in stream frees once the gather's event is recorded. Not in the data model;
// the recorded step must still pass its checker.
TEST(StreamRuntime, RecordedStepWithACastPassesTheChecker) {
  RunOptions o;
  o.schedule = schedule_options(3, 1, true, false);
  o.param_dtype = at::kDouble;
  const std::vector<Log> logs = record_second_step(o);
  const StreamSchedule want = build_stream_schedule(o.schedule);
  for (const Log& log : logs) {
    StreamSchedule got{o.schedule, log.ops, want.persistent};
    const auto violations = check_schedule(got);
    EXPECT_TRUE(violations.empty()) << violations.front();
    int cast_inputs = 0;
    for (const auto& op : log.ops) {
      if (op.kind == ScheduleOpKind::kAllGather && op.reads.front().rfind("ag_in[", 0) == 0) {
        ++cast_inputs;
      }
    }
    EXPECT_EQ(cast_inputs, 6) << "3 units gathered for forward and again for backward";
    EXPECT_EQ(collective_order(got), collective_order(want));
  }
}

// hpZ (a post-forward piece gathered within groups of 2 of 4 ranks) and DDP-style replication
// (shard groups of one rank, gradients all-reduced) are issued through the same ops but are not
// in the data model: their recorded steps must pass the checker.
TEST(StreamRuntime, RecordedStepsOfHpzAndDdpPassTheChecker) {
  RunOptions hpz;
  hpz.schedule = schedule_options(3, 1, true, false);
  hpz.world = 4;
  hpz.hpz = 2;
  RunOptions ddp;
  ddp.schedule = schedule_options(3, 1, true, false);
  ddp.replicate = 2;
  for (const RunOptions& o : {hpz, ddp}) {
    const bool is_hpz = o.hpz.has_value();
    const std::vector<Log> logs = record_second_step(o);
    for (const Log& log : logs) {
      StreamSchedule got{o.schedule, log.ops, build_stream_schedule(o.schedule).persistent};
      const auto violations = check_schedule(got);
      EXPECT_TRUE(violations.empty()) << (is_hpz ? "hpZ: " : "DDP: ") << violations.front();
      int pieces_read = 0, all_reduces = 0;
      for (const auto& op : log.ops) {
        if (op.kind == ScheduleOpKind::kCopyIn && op.reads.front().rfind("piece[", 0) == 0) {
          ++pieces_read;
        }
        all_reduces += op.kind == ScheduleOpKind::kAllReduce;
      }
      // hpZ: each unit's backward gathers from its piece; DDP: each unit's gradients are
      // all-reduced and nothing is gathered.
      EXPECT_EQ(pieces_read, is_hpz ? 3 : 0);
      EXPECT_EQ(all_reduces, is_hpz ? 0 : 3);
    }
  }
}

// Breaking the runtime's order is caught: a log whose copy-out lost its wait on the gather (as a
// runtime that forgot the event would issue it) differs from the schedule and fails the checker.
TEST(StreamRuntime, ARuntimeLogMissingAWaitIsCaught) {
  RunOptions o;
  o.schedule = schedule_options(3, 1, true, false);
  std::vector<Log> logs = record_second_step(o);
  auto it = std::find_if(logs[0].ops.begin(), logs[0].ops.end(), [](const ScheduleOp& op) {
    return op.kind == ScheduleOpKind::kCopyOut && op.unit == 1;
  });
  ASSERT_NE(it, logs[0].ops.end());
  it->waits.clear();
  StreamSchedule got{o.schedule, logs[0].ops, {}};
  const auto violations = check_schedule(got);
  EXPECT_TRUE(std::any_of(violations.begin(), violations.end(), [](const std::string& v) {
    return v.find("copy_out[1] on compute reads 'ag_buf[1]@fwd'") != std::string::npos;
  }));
}

// The recorder costs nothing when unset: no op is reported, and training is unchanged by one.
TEST(StreamRuntime, RecordingDoesNotChangeTraining) {
  RunOptions o;
  o.schedule = schedule_options(3, 1, true, false);
  TrainCase c;
  c.make_model = [](const DeviceMesh*) { return StepNet(kWidth, 3).ptr(); };
  c.shard = [](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto net = std::static_pointer_cast<StepNetImpl>(m);
    for (auto& block : net->blocks) fully_shard(block, mesh);
    fully_shard(m, mesh);
  };
  c.loss = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
              const at::Tensor& y) {
    StepNet net(std::static_pointer_cast<StepNetImpl>(m));
    return (fsdp::forward(net, x) - y).pow(2).mean();
  };
  c.batch = [](int64_t step) {
    return std::make_pair(seeded_uniform({8, kWidth}, 70 + step), seeded_uniform({8, kWidth}, 90));
  };
  c.steps = 3;
  const auto plain = train_sharded(c, 2);
  std::vector<Log> logs(2);
  const auto recorded = train_sharded(
      c, 2, [&](int rank, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
        fsdp_module_of(*m)->set_observer(observed_by(logs[rank]));
      });
  for (int r = 0; r < 2; ++r) {
    for (size_t s = 0; s < plain[r].losses.size(); ++s) {
      EXPECT_EQ(plain[r].losses[s], recorded[r].losses[s])
          << std::setprecision(17) << "rank " << r << " step " << s + 1;
    }
    EXPECT_FALSE(logs[r].ops.empty());
    for (const auto& [name, value] : plain[r].params) {
      const at::Tensor& other = recorded[r].params.at(name);
      EXPECT_TRUE(at::equal(value, other)) << "rank " << r << " " << name << ": max difference "
                                           << (value - other).abs().max().item<double>();
    }
  }
}

}  // namespace
}  // namespace fsdp::test
