// The step-time planner. Two kinds of check:
// - the timelines, on a made-up machine where every unit computes for a whole second and every
//   collective takes a chosen time, against the schedule worked out by hand from the runtime's
//   rules (prefetch on and off), and the planner's memory against the estimator's (one walk);
// - what the plan counts, against independent counts: its bytes against fsdp-train's runtime on
//   every rank, its FLOPs against torch's FlopCounterMode on transformers' model of the same
//   config (see [Note: the plan is checked for what it counts; its timing is a benchmark]);
//   how well the priced plan predicts a measured step is bench/plan_validation.sh's, recorded in
//   bench/RESULTS.md.
// Hardware files with a field missing or wrong are refused naming the field.
#include "support/checkpoint_util.h"
#include "support/reference_cache.h"
#include "support/test_support.h"

#include <fsdp/models/model.h>
#include <fsdp/step_time_plan.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

// A machine where 1e9 FLOPs take 1 s, copies are free, and a ring step moves 1 byte in beta s.
nlohmann::json toy_hardware(double beta) {
  return {{"name", "toy"},
          {"memory_bytes", 1 << 30},
          {"compute", {{"peak_flops", {{"fp32", 1e9}}}, {"matmul_fraction", 1.0}}},
          {"memory_bandwidth", 1e30},
          {"links", {{"intra_node", {{"alpha_s", 0.0}, {"beta_s_per_byte", beta}}}}}};
}

// Two units with one [2, 1000] fp32 parameter each (a 2-rank gather outputs 8,000 bytes, a ring
// sends half) and a root without parameters; each unit's forward is one 1e9-FLOP matmul.
std::pair<ModelMemorySpec, ModelComputeSpec> toy_model() {
  ModelMemorySpec memory;
  ModelComputeSpec compute;
  compute.tokens = 1000;
  for (int i = 0; i < 2; ++i) {
    UnitMemorySpec unit;
    unit.name = "u" + std::to_string(i);
    unit.param_shapes = {{2, 1000}};
    memory.units.push_back(unit);
    UnitComputeSpec u;
    u.matmuls = {{1000, 1000, 500}};
    compute.units.push_back(u);
  }
  return {memory, compute};
}

StepTimePlan toy_plan(int prefetch, double gather_s) {
  const auto [memory, compute] = toy_model();
  const HardwareSpec hw = HardwareSpec::from_json(toy_hardware(gather_s / 4000).dump(), "toy");
  StepTimeOptions options;
  options.memory(MemoryEstimateOptions().world_size(2).prefetch(prefetch))
      .clip_grad_norm(false)
      .all_reduce_loss(false);
  return plan_step_time(memory, compute, options, hw);
}

// Prefetch on, gathers and reduce-scatters of g = 0.25 s, units of 1 s forward and 2 s backward:
// forward waits for unit 0's gather (g) while unit 1's runs under unit 0's compute; backward
// regathers unit 1 at once (exposed g) while unit 0's gather and unit 1's reduce-scatter run
// under unit 1's backward; unit 0's reduce-scatter is waited for at the end (g). 6 + 3g.
TEST(StepTimePlan, PrefetchHidesAllButTheFirstGatherOfEachPassAndTheLastReduction) {
  const StepTimePlan p = toy_plan(/*prefetch=*/1, 0.25);
  EXPECT_NEAR(p.step_s, 6.75, 1e-9);
  EXPECT_NEAR(p.exposed_comm_s, 0.75, 1e-9);
  EXPECT_NEAR(p.compute_s, 6.0, 1e-9);
  EXPECT_NEAR(p.comm_s, 6 * 0.25, 1e-9);  // 4 gathers and 2 reduce-scatters (the root's: empty)
}

// On a CPU host whose cores both compute and copy the collectives' bytes, the hidden part of
// the collectives (6g of them, 3g exposed) slows compute by as much. Collectives between nodes
// take network_cpu_fraction of their hidden time ([Note: hidden collectives take CPU within a
// node]): with a rank per node the step is the plain 6 + 3g, and 6 + 3g + 0.4 * 3g at 0.4.
TEST(StepTimePlan, HiddenCollectivesTakeTheirTimeFromComputeOnACpuHost) {
  const auto [memory, compute] = toy_model();
  nlohmann::json file = toy_hardware(0.25 / 4000);
  file["devices_per_node"] = 2;  // both ranks on the one host
  file["comm_cpu_fraction"] = 1.0;
  const HardwareSpec hw = HardwareSpec::from_json(file.dump(), "toy");
  StepTimeOptions options;
  options.memory(MemoryEstimateOptions().world_size(2))
      .clip_grad_norm(false)
      .all_reduce_loss(false);
  const StepTimePlan p = plan_step_time(memory, compute, options, hw);
  EXPECT_NEAR(p.step_s, 6.75 + 0.75, 1e-9);
  EXPECT_NEAR(p.exposed_comm_s, 0.75, 1e-9);
  file["devices_per_node"] = 1;
  const StepTimePlan apart =
      plan_step_time(memory, compute, options, HardwareSpec::from_json(file.dump(), "toy"));
  EXPECT_NEAR(apart.step_s, 6.75, 1e-9);
  file["network_cpu_fraction"] = 0.4;
  const StepTimePlan paced =
      plan_step_time(memory, compute, options, HardwareSpec::from_json(file.dump(), "toy"));
  EXPECT_NEAR(paced.step_s, 6.75 + 0.4 * 0.75, 1e-9);
  EXPECT_NEAR(paced.exposed_comm_s, 0.75, 1e-9);
  file["network_cpu_fraction"] = 1.5;
  try {
    HardwareSpec::from_json(file.dump(), "toy");
    ADD_FAILURE() << "a fraction above 1 was taken";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("network_cpu_fraction is a fraction, at most 1, got 1.5"));
  }
}

// Prefetch off: each gather is issued when its unit starts, and unit 0's backward gather queues
// behind unit 1's reduce-scatter on the one progress thread (2g). 6 + 6g.
TEST(StepTimePlan, PrefetchOffWaitsForEveryGather) {
  const StepTimePlan p = toy_plan(/*prefetch=*/0, 0.25);
  EXPECT_NEAR(p.step_s, 7.5, 1e-9);
  EXPECT_NEAR(p.exposed_comm_s, 1.5, 1e-9);
  EXPECT_NEAR(p.tokens_per_s, 2 * 1000 / 7.5, 1e-9);
}

// Tensor parallelism over 2 ranks: each unit's forward and backward make two all-reduces of
// 2,000 bytes over the tp group (a ring all-reduce over 2 ranks sends the whole tensor: 2,000
// beta = g / 2 each). The compute thread waits for every one inside the unit ([Note:
// tensor-parallel collectives block the compute thread]), so the step grows by all 8 of them
// (4g = 1 s), FSDP's collectives stay hidden or exposed as before (their units only got longer),
// and the memory walk counts the calls.
TEST(StepTimePlan, TensorParallelCollectivesAddToTheComputeThread) {
  auto [memory, compute] = toy_model();
  for (auto& unit : memory.units) {
    unit.tp_forward.all_reduce.add(4000, 2);
    unit.tp_backward.all_reduce.add(4000, 2);
  }
  const HardwareSpec hw = HardwareSpec::from_json(toy_hardware(0.25 / 4000).dump(), "toy");
  StepTimeOptions options;
  options.memory(MemoryEstimateOptions().world_size(2).prefetch(1))
      .clip_grad_norm(false)
      .all_reduce_loss(false)
      .tensor_parallel(2);
  const StepTimePlan p = plan_step_time(memory, compute, options, hw);
  EXPECT_NEAR(p.step_s, 6.75 + 1.0, 1e-9);
  EXPECT_NEAR(p.tp_comm_s, 1.0, 1e-9);
  EXPECT_NEAR(p.exposed_comm_s, 0.75, 1e-9);
  EXPECT_NEAR(p.compute_s, 6.0, 1e-9);
  EXPECT_EQ(p.memory.tensor_parallel.all_reduce.calls, 8);
  EXPECT_EQ(p.memory.tensor_parallel.all_reduce.bytes, 16000);
  EXPECT_EQ(p.memory.all_reduce_bytes, 16000);
  // Two data-parallel groups of the same tokens: tokens per step count the data-parallel ranks.
  EXPECT_EQ(p.tokens_per_step, 2 * 1000);
}

// The head as a unit (MemoryEstimateOptions::head_unit): the toy's root gets a [2, 1000] head
// table. Left in the root, its gather is the step's first wait and its reduce-scatter the last:
// 6 + 5g, all five exposed. As a unit of its own it is prefetched by the last block and reduced
// right after the head's backward, beside the blocks': 6 + 3g, as for the two blocks alone.
// Tied, the stem looks one token's row up from the head's shards: a count all-gather (32 bytes,
// 16 sent), the ids' (16 bytes, 8 sent) and the rows' reduce-scatter (8,000 bytes: g) in forward
// and the rows' gradients' all-gather (g) in backward, each waited for at once on a side group,
// so that u0's gather (g) now hides under the forward's lookup: 6 + 3g + 0.006g.
TEST(StepTimePlan, TheHeadAsAUnitHidesTheTablesCollectivesAndWaitsForItsLookup) {
  auto [memory, compute] = toy_model();
  memory.root_param_shapes = {{2, 1000}};
  memory.head.params = {0};
  const double g = 0.25;
  const HardwareSpec hw = HardwareSpec::from_json(toy_hardware(g / 4000).dump(), "toy");
  auto plan = [&](bool head_unit) {
    StepTimeOptions options;
    options.memory(MemoryEstimateOptions().world_size(2).head_unit(head_unit))
        .clip_grad_norm(false)
        .all_reduce_loss(false);
    return plan_step_time(memory, compute, options, hw);
  };
  const StepTimePlan in_root = plan(false);
  EXPECT_NEAR(in_root.step_s, 6 + 5 * g, 1e-9);
  EXPECT_NEAR(in_root.exposed_comm_s, 5 * g, 1e-9);
  const StepTimePlan untied = plan(true);
  EXPECT_NEAR(untied.step_s, 6 + 3 * g, 1e-9);
  EXPECT_NEAR(untied.exposed_comm_s, 3 * g, 1e-9);
  EXPECT_NEAR(untied.comm_s, 8 * g, 1e-9);  // 5 gathers, 3 reduce-scatters (the root's empty)
  EXPECT_EQ(untied.memory.all_gather_bytes, in_root.memory.all_gather_bytes);

  memory.head.lookup_tokens = 1;
  memory.head.lookup_width = 1000;
  const StepTimePlan tied = plan(true);
  EXPECT_NEAR(tied.step_s, 6 + 3.006 * g, 1e-9);
  EXPECT_NEAR(tied.exposed_comm_s, 3.006 * g, 1e-9);
  EXPECT_NEAR(tied.comm_s, 10.006 * g, 1e-9);
  EXPECT_EQ(tied.memory.all_gather_bytes, 5 * 8000 + 32 + 16 + 8000);
  EXPECT_EQ(tied.memory.reduce_scatter_bytes, 3 * 8000 + 8000);
}

TEST(StepTimePlan, OneRankCommunicatesNothing) {
  const auto [memory, compute] = toy_model();
  const HardwareSpec hw = HardwareSpec::from_json(toy_hardware(1.0).dump(), "toy");
  StepTimeOptions options;
  options.memory(MemoryEstimateOptions().world_size(1))
      .clip_grad_norm(false)
      .all_reduce_loss(false);
  const StepTimePlan p = plan_step_time(memory, compute, options, hw);
  EXPECT_NEAR(p.step_s, 6.0, 1e-9);
  EXPECT_EQ(p.exposed_comm_s, 0);
  EXPECT_EQ(p.comm_s, 0);
  // MFU: 3 x 1e9 FLOPs per unit per step over 6 s of a 1e9 FLOP/s device.
  EXPECT_NEAR(p.mfu, 1.0, 1e-9);
}

// HSDP over 4 ranks, 2 replicas of 2 shards; no clipping and no loss all-reduce.
StepTimeOptions hsdp_over_four_ranks() {
  StepTimeOptions options;
  options
      .memory(MemoryEstimateOptions()
                  .world_size(4)
                  .strategy(ShardingStrategy::kHybridShard)
                  .replicate(2))
      .clip_grad_norm(false)
      .all_reduce_loss(false);
  return options;
}

// HSDP over 4 ranks, 2 replicas of 2 shards, on toy nodes of 2 whose links within a node are
// free: only the all-reduces across replicas cost, one per unit of its 4,000-byte reduced shard
// (a 2-rank ring all-reduce sends all of it: 4,000 beta), so comm_s is 8,000 beta. The replicate
// group has 2 ranks, no more than a node, but its ranks are on different nodes ([Note: which
// groups cross nodes]); with all 4 ranks on one node nothing crosses.
TEST(StepTimePlan, HsdpsReplicateGroupCrossesNodesWhateverItsSize) {
  const auto [memory, compute] = toy_model();
  const StepTimeOptions options = hsdp_over_four_ranks();
  for (const int per_node : {2, 4}) {
    nlohmann::json file = toy_hardware(0.0);
    file["devices_per_node"] = per_node;
    file["links"]["inter_node"] = {{"alpha_s", 0.0}, {"beta_s_per_byte", 1e-4}};
    const HardwareSpec hw = HardwareSpec::from_json(file.dump(), "toy");
    const StepTimePlan p = plan_step_time(memory, compute, options, hw);
    EXPECT_NEAR(p.comm_s, per_node == 2 ? 8000 * 1e-4 : 0.0, 1e-9) << per_node << " per node";
  }
}

// A CPU cluster's file: collectives measured within a host, inter_node_collectives across hosts
// (fsdp-comm-bench over the link). HSDP over 2 hosts of 2 ranks takes the gathers and
// reduce-scatters (in a host) from the first and the all-reduces across replicas from the
// second: 5 gathers, 3 reduce-scatters, 3 all-reduces (the toy's root has no parameters, but its
// collectives are issued and cost their alpha). Without the second, a group across hosts takes
// the first's fit, as on one host.
TEST(StepTimePlan, ACpuClustersGroupsAcrossHostsTakeTheFitsMeasuredAcrossThem) {
  const auto [memory, compute] = toy_model();
  const StepTimeOptions options = hsdp_over_four_ranks();
  nlohmann::json file = toy_hardware(0.0);
  file["cpu_cores"] = 4;
  file["devices_per_node"] = 2;
  auto fit = [](double alpha) {
    return nlohmann::json{{"alpha_s", alpha}, {"beta_s_per_byte", 0}};
  };
  file["collectives"]["2"] = {
      {"all_gather", fit(0.01)}, {"reduce_scatter", fit(0.02)}, {"all_reduce", fit(0.03)}};
  const StepTimePlan within =
      plan_step_time(memory, compute, options, HardwareSpec::from_json(file.dump(), "toy"));
  EXPECT_NEAR(within.comm_s, 5 * 0.01 + 3 * 0.02 + 3 * 0.03, 1e-9);
  file["inter_node_collectives"]["2"] = {{"all_reduce", fit(0.5)}};
  const StepTimePlan across =
      plan_step_time(memory, compute, options, HardwareSpec::from_json(file.dump(), "toy"));
  EXPECT_NEAR(across.comm_s, 5 * 0.01 + 3 * 0.02 + 3 * 0.5, 1e-9);
}

// [Note: a collective's measured points]: between two points the straight line between them,
// beyond the largest its time per byte, below the smallest its time; without points the line.
TEST(PlanHardwareFile, ACollectivesMeasuredPointsPriceItAndTheLineOnlyWithoutThem) {
  nlohmann::json file = toy_hardware(0.0);
  file["collectives"]["2"]["all_gather"] = {
      {"alpha_s", 1.0}, {"beta_s_per_byte", 0.0}, {"measured", {{1000, 0.001}, {3000, 0.005}}}};
  file["collectives"]["2"]["reduce_scatter"] = {{"alpha_s", 1.0}, {"beta_s_per_byte", 0.5}};
  const HardwareSpec hw = HardwareSpec::from_json(file.dump(), "toy");
  const CollectiveFit& gather = hw.collectives.at(2).at("all_gather");
  EXPECT_DOUBLE_EQ(gather.seconds(500), 0.001);
  EXPECT_DOUBLE_EQ(gather.seconds(1000), 0.001);
  EXPECT_DOUBLE_EQ(gather.seconds(2000), 0.003);
  EXPECT_DOUBLE_EQ(gather.seconds(3000), 0.005);
  EXPECT_DOUBLE_EQ(gather.seconds(6000), 0.010);
  EXPECT_DOUBLE_EQ(hw.collectives.at(2).at("reduce_scatter").seconds(4), 3.0);
  file["collectives"]["2"]["all_gather"]["measured"] = {{1000, -1}};
  try {
    HardwareSpec::from_json(file.dump(), "toy");
    ADD_FAILURE() << "a negative time was taken";
  } catch (const c10::Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("collectives.2.all_gather.measured"));
    EXPECT_THAT(e.what(), HasSubstr("[1000,-1]"));
  }
}

TEST(StepTimePlan, MemoryIsTheEstimatorsForTheSameWalk) {
  const auto [memory, compute] = toy_model();
  const HardwareSpec hw = HardwareSpec::from_json(toy_hardware(1e-9).dump(), "toy");
  for (int prefetch : {0, 1}) {
    const MemoryEstimateOptions mo = MemoryEstimateOptions().world_size(2).prefetch(prefetch);
    const StepTimePlan p = plan_step_time(memory, compute, StepTimeOptions().memory(mo), hw);
    EXPECT_EQ(p.memory.to_json(), estimate_memory(memory, mo).to_json());
  }
}

TEST(PlanHardwareFile, AMissingOrBadFieldIsNamed) {
  nlohmann::json hw = toy_hardware(1e-9);
  hw.erase("memory_bandwidth");
  EXPECT_THAT(error_message([&] { HardwareSpec::from_json(hw.dump(), "hw.json"); }),
              HasSubstr("hardware file 'hw.json': missing field 'memory_bandwidth'"));
  hw = toy_hardware(1e-9);
  hw["compute"]["matmul_fraction"] = 1.5;
  EXPECT_THAT(error_message([&] { HardwareSpec::from_json(hw.dump(), "hw.json"); }),
              HasSubstr("matmul_fraction is a fraction of the peak, at most 1, got 1.5"));
  hw = toy_hardware(1e-9);
  hw["links"]["intra_node"]["beta_s_per_byte"] = "fast";
  EXPECT_THAT(error_message([&] { HardwareSpec::from_json(hw.dump(), "hw.json"); }),
              HasSubstr("'beta_s_per_byte' must be a number, got \"fast\""));
  EXPECT_THAT(error_message([&] { HardwareSpec::from_json("{", "hw.json"); }),
              HasSubstr("hardware file hw.json is not JSON"));
}

TEST(PlanHardwareFile, ADtypeWithoutAPeakIsNamed) {
  const auto [memory, compute] = toy_model();
  const HardwareSpec hw = HardwareSpec::from_json(toy_hardware(1e-9).dump(), "toy");
  StepTimeOptions options;
  options.memory(MemoryEstimateOptions().world_size(2).param_dtype(at::kBFloat16));
  EXPECT_THAT(error_message([&] { plan_step_time(memory, compute, options, hw); }),
              HasSubstr("gives no peak_flops for bf16, the compute dtype"));
}

TEST(FsdpPlanProgram, RefusesAHardwareFileWithoutItsFieldAndWithoutHardware) {
  const std::string path = temp_path("bad_hw.json");
  nlohmann::json hw = toy_hardware(1e-9);
  hw.erase("links");
  std::ofstream(path) << hw.dump();
  CommandResult r = run_command(program_path("fsdp-plan") + " --hardware " + path + " 2>&1", 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("missing field 'links'"));
  r = run_command(program_path("fsdp-plan") + " 2>&1", 60);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_THAT(r.output, HasSubstr("--hardware FILE is required"));
}

std::string job_flags(const std::string& model) {
  return " --model " + model + " --global-batch 8 --seq-len 128 --prefetch 1";
}

// One training step's FLOPs of each model (global batch 8 x 128 tokens), as torch's FlopCounterMode
// counts them on the transformers model that our spec's config.json describes
// (tests/tools/model_flops.py): {model: {"total", "by_op"}}.
nlohmann::json torch_step_flops(const std::vector<std::string>& models) {
  const std::string root = temp_dir("plan_flops"), configs = root + "/configs";
  const std::string out = root + "/flops.json";
  for (const std::string& model : models) {
    EXPECT_TRUE(make_directories(configs + "/" + model));
    std::ofstream(configs + "/" + model + "/config.json")
        << models::model_spec(model)->hf_config_json(at::kFloat);
  }
  const ReferenceResult r =
      run_reference(reference_python(), {FSDP_SOURCE_DIR "/tests/tools/model_flops.py",
                                         "8 128 " + configs + " " + out,
                                         {configs},
                                         {out},
                                         false,
                                         300});
  EXPECT_EQ(r.exit_code, 0) << r.output;
  if (r.exit_code != 0) return nlohmann::json::object();
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

// fsdp-train's --metrics of one step of `model` at W = 2: its last line, with every rank's bytes.
// extra: more flags (--tp 2).
nlohmann::json trained_step(const std::string& model, const std::string& extra = "") {
  const std::string metrics = temp_path(model + "_metrics.jsonl");
  const CommandResult r =
      run_command(program_path("fsdp-train") + " --nproc 2" + job_flags(model) + extra +
                      " --steps 1 --val-every 0 --quiet --metrics " + metrics + " 2>&1",
                  120);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? read_json_lines(metrics).back() : nlohmann::json::object();
}

// fsdp-plan --json for `model` at W = 2. The hardware file only prices the counts this test
// checks, so the checked-in one serves.
nlohmann::json planned_step(const std::string& model, const std::string& extra = "") {
  const CommandResult r = run_command(program_path("fsdp-plan") +
                                          " --hardware " FSDP_SOURCE_DIR
                                          "/bench/hardware/dev_vm_2core.json --world-size 2" +
                                          job_flags(model) + extra + " --json 2>&1",
                                      60);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  return r.exit_code == 0 ? nlohmann::json::parse(r.output) : nlohmann::json::object();
}

// [Note: the plan is checked for what it counts; its timing is a benchmark]
// The planner's step time is what it counts (the bytes each collective moves, the FLOPs each
// kernel does) priced by a hardware file. This test holds the counts exactly to independent ones:
// the bytes to what fsdp-train's runtime reports on every rank, the FLOPs to torch's
// FlopCounterMode over one training step of transformers' model for the same config.json, so a
// planner that mis-counted a matmul, attention or the output head fails here on any machine.
// How well the priced plan predicts a measured step is a benchmark: bench/plan_validation.sh,
// every strategy at W = 1, 2 and 4, its table in bench/RESULTS.md. Until stop 36 this test also
// timed it, as the ratio of two models' predicted and measured step times, and failed CI: on
// the 2-core VM the machine's own speed moves by up to 40% within seconds (the fastest of 0.5 s
// of 512 x 512 matmul calls: 6.9 to 9.7 ms over six rounds on an idle machine), so calibrations a
// minute apart priced other work at 1.7, 5.1 and 19 GB/s and predicted ratios of 0.37 to 0.54,
// while measurements gave 0.44 to 0.65. No tolerance that holds there would catch a real bug.
TEST(FsdpPlanAccounting, FlopsAreTorchsCountAndBytesAreTheRuntimes) {
  // GPT-2; Llama; Llama with grouped-query attention (4 heads, 2 key-value heads).
  const std::vector<std::string> models = {"small", "llama-debug", "llama-tiny"};
  const nlohmann::json flops = torch_step_flops(models);
  for (const std::string& model : models) {
    SCOPED_TRACE(model);
    const nlohmann::json plan = planned_step(model), measured = trained_step(model);
    ASSERT_EQ(plan["ranks"].size(), 2u);
    ASSERT_EQ(measured["ranks"].size(), 2u);
    for (int rank = 0; rank < 2; ++rank) {
      // all_reduce_bytes is left out: the runtime also counts clipping's scalar all-reduce
      // there, which the estimator does not.
      for (const char* key : {"param_bytes", "grad_bytes", "optim_bytes", "all_gather_bytes",
                              "reduce_scatter_bytes"}) {
        EXPECT_EQ(plan["ranks"][rank][key], measured["ranks"][rank][key])
            << "rank " << rank << ": " << key;
      }
    }
    // Integers below 2^53: the two counts are equal as doubles or the planner miscounts.
    EXPECT_EQ(plan["model_flops_per_step"].get<double>(), flops.at(model).at("total").get<double>())
        << "torch's count by op: " << flops.at(model).at("by_op").dump();
  }
  // Tensor parallelism over both ranks, with and without sequence parallelism: each rank's
  // slices and collectives as the runtime counts them, and the whole model's FLOPs still
  // torch's (the ranks' parts add up to the model: llama-debug's vocabulary splits too).
  for (const std::string extra : {" --tp 2", " --tp 2 --sequence-parallel"}) {
    SCOPED_TRACE("llama-debug" + extra);
    const nlohmann::json plan = planned_step("llama-debug", extra);
    const nlohmann::json measured = trained_step("llama-debug", extra);
    ASSERT_EQ(measured["ranks"].size(), 2u);
    for (int rank = 0; rank < 2; ++rank) {
      for (const char* key :
           {"param_bytes", "grad_bytes", "optim_bytes", "all_gather_bytes", "reduce_scatter_bytes",
            "tp_all_gather_calls", "tp_reduce_scatter_calls"}) {
        EXPECT_EQ(plan["ranks"][rank][key], measured["ranks"][rank][key])
            << "rank " << rank << ": " << key;
      }
      // The runtime's tp group also runs clipping's all-reduce and, being the whole world here,
      // the trainer's all-reduce of the loss: two calls the estimator leaves out.
      EXPECT_EQ(plan["ranks"][rank]["tp_all_reduce_calls"].get<int64_t>() + 2,
                measured["ranks"][rank]["tp_all_reduce_calls"].get<int64_t>())
          << "rank " << rank;
    }
    EXPECT_GT(plan["tp_comm_s"].get<double>(), 0);
    EXPECT_EQ(plan["model_flops_per_step"].get<double>(),
              flops.at("llama-debug").at("total").get<double>());
  }
}

}  // namespace
}  // namespace fsdp::test
