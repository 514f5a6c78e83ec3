// FSDPModule::set_custom_all_gather / set_custom_reduce_scatter in training, over thread-ranks:
// hooks that do the plain collectives reproduce the default path bit for bit (ZeRO-3, mixed
// precision, hpZ, HSDP) and are called where the header says; Int8AllGather (qwZ) moves the
// analytic bytes, keeps the fp32 master shards exact and trains close to the single-process
// reference; misuse is refused with a message.
#include "support/gpt_case.h"
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/fully_shard.h>
#include <fsdp/runtime/whole_tensor.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <numeric>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

// What a hook saw, shared by the ranks' threads: calls and allocations per group size.
struct HookLog {
  std::mutex mutex;
  std::map<int, int> calls_by_group_size;
  int allocations = 0;
  std::vector<int64_t> input_numels;  // one per call, any rank

  void called(int group_size, int64_t input_numel) {
    std::lock_guard<std::mutex> lock(mutex);
    ++calls_by_group_size[group_size];
    input_numels.push_back(input_numel);
  }
  void allocated() {
    std::lock_guard<std::mutex> lock(mutex);
    ++allocations;
  }
  int calls() {
    std::lock_guard<std::mutex> lock(mutex);
    int n = 0;
    for (const auto& [size, count] : calls_by_group_size) n += count;
    return n;
  }
};

// The process group's own all-gather, through the hook path.
class PlainAllGather : public AllGather {
 public:
  explicit PlainAllGather(HookLog& log) : log_(log) {}
  at::Tensor allocate(int64_t numel, at::ScalarType dtype, c10::Device device) override {
    log_.allocated();
    return AllGather::allocate(numel, dtype, device);
  }
  WorkHandle operator()(const at::Tensor& output, const at::Tensor& input,
                        ProcessGroup& group) override {
    log_.called(group.size(), input.numel());
    return group.all_gather_into_tensor(output, input);
  }

 private:
  HookLog& log_;
};

class PlainReduceScatter : public ReduceScatter {
 public:
  explicit PlainReduceScatter(HookLog& log) : log_(log) {}
  at::Tensor allocate(int64_t numel, at::ScalarType dtype, c10::Device device) override {
    log_.allocated();
    return ReduceScatter::allocate(numel, dtype, device);
  }
  WorkHandle operator()(const at::Tensor& output, const at::Tensor& input, ProcessGroup& group,
                        ReduceOp op) override {
    log_.called(group.size(), input.numel());
    return group.reduce_scatter_tensor(output, input, op);
  }

 private:
  HookLog& log_;
};

// Int8AllGather, logging each call's input numel.
class LoggedInt8AllGather : public Int8AllGather {
 public:
  LoggedInt8AllGather(HookLog& log, int64_t block) : Int8AllGather(block), log_(log) {}
  WorkHandle operator()(const at::Tensor& output, const at::Tensor& input,
                        ProcessGroup& group) override {
    log_.called(group.size(), input.numel());
    return Int8AllGather::operator()(output, input, group);
  }

 private:
  HookLog& log_;
};

// c, with set_hooks run on every unit once the tree is sharded.
TrainCase with_hooks(TrainCase c, std::function<void(FSDPModule&)> set_hooks) {
  auto shard = c.shard;
  c.shard = [shard, set_hooks](const std::shared_ptr<torch::nn::Module>& m,
                               const DeviceMesh& mesh) {
    shard(m, mesh);
    for (FSDPModule& unit : fsdp_modules_under(*m)) set_hooks(unit);
  };
  return c;
}

struct HookCase {
  const char* name;
  int world;
  int replicate;
  ReshardAfterForward reshard_after_forward;
  bool bf16;
};
const HookCase kHookCases[] = {{"zero3_w2", 2, 1, true, false},
                               {"zero3_w2_bf16", 2, 1, true, true},
                               {"hpz_w4_groups_of_2", 4, 1, 2, false},
                               {"hsdp_2x2", 4, 2, true, false}};

void PrintTo(const HookCase& h, std::ostream* os) { *os << h.name; }

class PlainHooks : public ::testing::TestWithParam<HookCase> {};

TrainCase hook_case(const HookCase& h) {
  GptCaseOptions opt;
  opt.reshard_after_forward = h.reshard_after_forward;
  if (h.bf16) opt.mp_policy.param_dtype(at::kBFloat16).reduce_dtype(at::kFloat);
  TrainCase c = gpt_case(opt);
  c.replicate = h.replicate;
  c.steps = 4;
  return c;
}

TEST_P(PlainHooks, ReproduceTheDefaultPathBitForBit) {
  const HookCase h = GetParam();
  const TrainCase c = hook_case(h);
  const std::vector<TrainRecord> plain = train_sharded(c, h.world);
  HookLog gathers, reduces;
  const std::vector<TrainRecord> hooked = train_sharded(
      with_hooks(c,
                 [&](FSDPModule& unit) {
                   unit.set_custom_all_gather(std::make_shared<PlainAllGather>(gathers));
                   unit.set_custom_reduce_scatter(std::make_shared<PlainReduceScatter>(reduces));
                 }),
      h.world);
  for (int r = 0; r < h.world; ++r) expect_bit_identical(plain[r], hooked[r]);
  // Every gather and reduce-scatter went through the hooks, in the groups the header names.
  const int shard = h.world / h.replicate;
  const int units = 1 + 2;  // the tiny GPT-2: the root and 2 blocks
  std::lock_guard<std::mutex> lock(gathers.mutex);
  // Per rank per step: every unit gathers in forward, the blocks again in backward (the root
  // stays gathered); each unit reduce-scatters once.
  const int forward = h.world * static_cast<int>(c.steps) * units;
  const int backward = h.world * static_cast<int>(c.steps) * (units - 1);
  if (h.reshard_after_forward.group_size(shard) == 2 && shard == 4) {
    EXPECT_EQ(gathers.calls_by_group_size, (std::map<int, int>{{4, forward}, {2, backward}}));
  } else {
    EXPECT_EQ(gathers.calls_by_group_size, (std::map<int, int>{{shard, forward + backward}}));
  }
  EXPECT_EQ(gathers.allocations, forward + backward);
  std::lock_guard<std::mutex> lock2(reduces.mutex);
  EXPECT_EQ(reduces.calls_by_group_size,
            (std::map<int, int>{{shard, h.world * static_cast<int>(c.steps) * units}}));
  EXPECT_EQ(reduces.allocations, 2 * h.world * c.steps * units);  // input and output
}

INSTANTIATE_TEST_SUITE_P(Strategies, PlainHooks, ::testing::ValuesIn(kHookCases),
                         [](const auto& info) { return std::string(info.param.name); });

// Setting nullptr restores the default path: no hook call after it.
TEST(PlainHooksReset, NullRestoresTheDefault) {
  HookLog gathers;
  TrainCase c = gpt_case();
  c.steps = 1;
  train_sharded(with_hooks(c,
                           [&](FSDPModule& unit) {
                             unit.set_custom_all_gather(std::make_shared<PlainAllGather>(gathers));
                             unit.set_custom_all_gather(nullptr);
                           }),
                2);
  EXPECT_EQ(gathers.calls(), 0);
}

// --- int8 (qwZ) ---

// One step with Int8AllGather on every unit moves, per gather of a unit whose shard has S
// elements, W * (S + 4 * ceil(S / block)) bytes, where the fp32 default moves W * 4 * S; the
// gathers are the default run's, one for one.
TEST(Int8Training, AllGatherBytesMatchTheAnalyticCount) {
  const int world = 2;
  const int64_t block = 256;
  TrainCase c = gpt_case();
  c.steps = 1;
  std::vector<int64_t> fp32_bytes(world), int8_bytes(world);
  train_sharded(c, world,
                [&](int rank, const std::shared_ptr<torch::nn::Module>&, const DeviceMesh& mesh) {
                  fp32_bytes[rank] = mesh.shard_group().counters().all_gather.payload_bytes;
                });
  HookLog log;
  train_sharded(
      with_hooks(c,
                 [&](FSDPModule& unit) {
                   unit.set_custom_all_gather(std::make_shared<LoggedInt8AllGather>(log, block));
                 }),
      world, [&](int rank, const std::shared_ptr<torch::nn::Module>&, const DeviceMesh& mesh) {
        int8_bytes[rank] = mesh.shard_group().counters().all_gather.payload_bytes;
      });
  // The runs' step-end bookkeeping gathers nothing: the shard group's gathers are the units'.
  int64_t int8_expected = 0, fp32_expected = 0;
  for (const int64_t numel : log.input_numels) {
    int8_expected += world * Int8AllGather::bytes_per_rank(numel, block);
    fp32_expected += world * 4 * numel;
  }
  // input_numels holds every rank's calls; each rank's counters see its own.
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(fp32_bytes[r], fp32_expected / world);
    EXPECT_EQ(int8_bytes[r], int8_expected / world);
  }
  EXPECT_LT(int8_bytes[0] * 3, fp32_bytes[0]);  // about 4x fewer bytes, 1.56% on scales
}

// During forward the unsharded parameters are the int8 round trip of the exact ones: within
// absmax / 254 of their (fp32) values, and not equal to them; the sharded parameters the
// optimizer steps stay the exact fp32 values.
TEST(Int8Training, GathersTheRoundTripAndKeepsTheMastersExact) {
  const int world = 2;
  TrainCase c = gpt_case();
  auto exact_model = c.make_model(nullptr);
  std::map<std::string, at::Tensor> exact;
  for (auto& [name, p] : unique_named_parameters(*exact_model)) exact[name] = p.detach().clone();
  run_ranks_in_threads(
      world,
      [&](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto model = c.make_model(&mesh);
        c.shard(model, mesh);
        std::vector<at::Tensor> shards_before;
        for (FSDPModule& unit : fsdp_modules_under(*model)) {
          unit.set_custom_all_gather(std::make_shared<Int8AllGather>(64));
          for (const auto& sp : unit.sharded_parameters())
            shards_before.push_back(sp.local.clone());
        }
        for (FSDPModule& unit : fsdp_modules_under(*model)) {
          unit.unshard();
          for (const auto& sp : unit.sharded_parameters()) {
            const std::string name = unit.path().empty() ? sp.name : unit.path() + "." + sp.name;
            const at::Tensor& truth = exact.at(name);
            at::Tensor gathered;
            for (auto& [n, p] : unique_named_parameters(*model)) {
              if (n == name) gathered = p.detach();
            }
            ASSERT_TRUE(gathered.defined()) << name;
            ASSERT_EQ(gathered.sizes(), truth.sizes()) << name;
            // A block of 64 may span parameters: the unit's largest magnitude bounds its absmax.
            double unit_absmax = 0;
            for (const auto& other : unit.sharded_parameters()) {
              const std::string other_name =
                  unit.path().empty() ? other.name : unit.path() + "." + other.name;
              unit_absmax = std::max(unit_absmax, exact.at(other_name).abs().max().item<double>());
            }
            const double err = (gathered - truth).abs().max().item<double>();
            EXPECT_LE(err, unit_absmax / 254 * (1 + 1e-5)) << name;
            if (truth.dim() == 2) {  // random weights; a norm's ones may round-trip exactly
              EXPECT_GT(err, 0) << name << " was gathered exactly: no quantization happened";
            }
          }
          unit.reshard();
        }
        size_t i = 0;
        for (FSDPModule& unit : fsdp_modules_under(*model)) {
          for (const auto& sp : unit.sharded_parameters()) {
            EXPECT_TRUE(sp.local.equal(shards_before[i++])) << sp.name << " master changed";
          }
        }
      },
      test_options());
}

// Trained with int8 gathers, the model follows the single-process fp32 run: the losses within
// 2% (the gathered weights are off by at most 1/254 of their block's largest magnitude, which
// moves the tiny model's loss by well under 1%; a wrong rank's part or scale moves it by whole
// nats), and every padding row of the master shards still exactly zero.
TEST(Int8Training, TracksTheSingleProcessLoss) {
  TrainCase c = gpt_case();
  const TrainRecord reference = train_reference(c);
  const std::vector<TrainRecord> ranks = train_sharded(
      with_hooks(
          c,
          [](FSDPModule& unit) { unit.set_custom_all_gather(std::make_shared<Int8AllGather>()); }),
      2);
  ASSERT_EQ(ranks[0].losses.size(), reference.losses.size());
  bool any_different = false;
  for (size_t s = 0; s < reference.losses.size(); ++s) {
    EXPECT_NEAR(ranks[0].losses[s], reference.losses[s], 0.02 * reference.losses[s])
        << "step " << s;
    any_different |= ranks[0].losses[s] != reference.losses[s];
  }
  EXPECT_TRUE(any_different) << "int8 gathers gave fp32's losses exactly: not quantized";
  for (const TrainRecord& r : ranks) {
    for (const auto& [name, shard] : r.params) {
      const ShardMetadata& m = r.metadata.at(name);
      if (m.global_shape.empty()) continue;
      if (m.local_rows < m.padded_rows) {
        EXPECT_EQ(
            shard.narrow(0, m.local_rows, m.padded_rows - m.local_rows).abs().max().item<float>(),
            0.0f)
            << name;
      }
    }
  }
}

// Under hpZ the backward gather re-quantizes the piece each rank kept, whose values are already
// on int8 levels: where the piece's blocks line up with the shards' that changes nothing, else a
// second rounding adds at most another absmax / 254, to backward's weights only. HSDP gathers
// within shard groups of 2, so its blocks fall elsewhere: another rounding of the same weights.
// Each moves the loss by about what int8 itself moves it at the first step (3e-5, FsdpTrainQwz):
// measured at most 3e-4 relative over these 5 steps; 1e-3 leaves room while a gather of a wrong
// piece or group would move it by far more.
TEST(Int8Training, HpzAndHsdpTrackInt8FullShard) {
  const auto int8 = [](FSDPModule& unit) {
    unit.set_custom_all_gather(std::make_shared<Int8AllGather>());
  };
  GptCaseOptions opt;
  TrainCase full = gpt_case(opt);
  full.steps = 5;
  const std::vector<TrainRecord> zero3 = train_sharded(with_hooks(full, int8), 4);
  opt.reshard_after_forward = 2;
  TrainCase hpz = gpt_case(opt);
  hpz.steps = 5;
  const std::vector<TrainRecord> hpz_run = train_sharded(with_hooks(hpz, int8), 4);
  TrainCase hsdp = gpt_case();
  hsdp.steps = 5;
  hsdp.replicate = 2;
  const std::vector<TrainRecord> hsdp_run = train_sharded(with_hooks(hsdp, int8), 4);
  // The first forward gathers over the same shard group with the same blocks.
  EXPECT_EQ(hpz_run[0].losses[0], zero3[0].losses[0]);
  for (size_t s = 0; s < zero3[0].losses.size(); ++s) {
    const double want = zero3[0].losses[s];
    EXPECT_NEAR(hpz_run[0].losses[s], want, 1e-3 * want) << "hpZ, step " << s;
    EXPECT_NEAR(hsdp_run[0].losses[s], want, 1e-3 * want) << "HSDP, step " << s;
  }
}

// --- errors ---

TEST(CustomCollectiveErrors, WholeTensorUnitsRefuseHooks) {
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto lin = torch::nn::Linear(4, 3);
        auto placement = std::make_shared<WholeTensorPlacement>();
        placement->set_owner(lin->weight, 0);
        placement->set_owner(lin->bias, 1);
        FSDPModule unit = fully_shard(lin, mesh, FullyShardOptions().whole_tensor(placement));
        EXPECT_THAT(
            error_message([&] { unit.set_custom_all_gather(std::make_shared<Int8AllGather>()); }),
            HasSubstr("set_custom_all_gather needs the all-gather / reduce-scatter of "
                      "Shard(0) placement, but this unit was sharded with whole_tensor"));
        HookLog log;
        EXPECT_THAT(error_message([&] {
                      unit.set_custom_reduce_scatter(std::make_shared<PlainReduceScatter>(log));
                    }),
                    HasSubstr("set_custom_reduce_scatter needs the all-gather"));
      },
      test_options());
}

// A hook whose allocate returns the wrong buffer, or which returns no Work, fails the unshard
// with a message naming the unit, on every rank, without a hang.
class WrongSizeAllGather : public AllGather {
 public:
  at::Tensor allocate(int64_t numel, at::ScalarType dtype, c10::Device device) override {
    return AllGather::allocate(numel + 1, dtype, device);
  }
  WorkHandle operator()(const at::Tensor&, const at::Tensor&, ProcessGroup&) override {
    return nullptr;
  }
};
class NoWorkAllGather : public AllGather {
 public:
  WorkHandle operator()(const at::Tensor&, const at::Tensor&, ProcessGroup&) override {
    return nullptr;
  }
};

TEST(CustomCollectiveErrors, BadHookResultsAreRefused) {
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> group) {
        DeviceMesh mesh(group);
        auto lin = torch::nn::Linear(4, 3);
        FSDPModule unit = fully_shard(lin, mesh);
        unit.set_custom_all_gather(std::make_shared<WrongSizeAllGather>());
        EXPECT_THAT(error_message([&] { unit.unshard(); }),
                    // The unit's shards: weight [3, 4] -> 2 rows of 4, bias [3] -> 2; x 2 ranks.
                    HasSubstr("the custom all-gather's allocate(20, Float, cpu) must return a "
                              "contiguous 1-D tensor of 20 elements with that dtype and device, "
                              "got Float of shape [21] on cpu"));
        unit.set_custom_all_gather(std::make_shared<NoWorkAllGather>());
        EXPECT_THAT(error_message([&] { unit.unshard(); }),
                    HasSubstr("the custom all-gather returned no Work"));
        EXPECT_FALSE(unit.is_unsharded());
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::test
