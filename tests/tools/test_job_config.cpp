// A job's settings as TOML: --print-config writes every setting, --config reads them back to
// the same settings, flags override the file, and what a file can get wrong (an unknown section
// or key, a wrong type, bad TOML, a value its flag refuses) is refused naming the file, the
// section and the key, or the flag. In process, through the programs' own parse (program.h);
// one multiprocess case proves that a run from --config trains exactly as the flags' run.
#include <common/config_flags.h>
#include <common/job_flags.h>
#include <common/program.h>
#include <fsdp_estimate/cli.h>
#include <fsdp_plan/cli.h>
#include <fsdp_train/cli.h>

#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

namespace fsdp::tools {
namespace {

using ::testing::HasSubstr;

// fsdp-train's settings after parsing args (with --config's file, as run_program reads it).
struct Parsed {
  train::JobConfig job;
  std::string toml;
};

Parsed parse_train_flags(const std::vector<std::string>& args) {
  Parsed parsed;
  CLI::App app;
  ConfigFlags flags(app);
  add_job_flags(flags, parsed.job);
  flags.add_config_options();
  std::vector<std::string> all = flags.file_args(args);
  all.insert(all.end(), args.begin(), args.end());
  app.parse(std::vector<std::string>(all.rbegin(), all.rend()));
  parsed.toml = flags.to_toml();
  return parsed;
}

std::string write_file(const std::string& name, const std::string& text) {
  const std::string path = test::temp_path("job_config_" + name);
  std::ofstream(path) << text;
  return path;
}

// What fsdp-train prints for args, as run_program would (exit status and message).
CheckOutcome train_outcome(const std::vector<std::string>& args) {
  auto cli = make_train_cli();
  return parse_and_check(*cli, args);
}

TEST(JobConfigFile, PrintConfigReadsBackToTheSameSettings) {
  const Parsed flags = parse_train_flags({"--steps",
                                          "7",
                                          "--lr",
                                          "0.0003",
                                          "--param-dtype",
                                          "bf16",
                                          "--reduce-dtype",
                                          "fp32",
                                          "--all-gather",
                                          "int8:128",
                                          "--wrap-policy",
                                          "min-params:1000",
                                          "--strategy",
                                          "hybrid_shard",
                                          "--replicate",
                                          "2",
                                          "--max-grad-norm",
                                          "inf",
                                          "--lr-schedule",
                                          "cosine",
                                          "--min-lr",
                                          "1e-05",
                                          "--text-field",
                                          "body",
                                          "--nproc",
                                          "4",
                                          "--decay-all",
                                          "--n-layer",
                                          "3",
                                          "--accum-mode",
                                          "no-all-reduce",
                                          "--timeout-s",
                                          "12.5"});
  const std::string path = write_file("roundtrip.toml", flags.toml);
  const Parsed file = parse_train_flags({"--config", path});
  EXPECT_EQ(file.toml, flags.toml);
  // The typed values themselves, not only their text.
  EXPECT_EQ(file.job.training.steps, 7);
  EXPECT_EQ(file.job.training.lr, 0.0003);
  EXPECT_EQ(file.job.training.min_lr, 1e-05);
  EXPECT_TRUE(std::isinf(file.job.training.max_grad_norm));
  EXPECT_EQ(file.job.training.lr_schedule, train::LrScheduleKind::kCosine);
  EXPECT_EQ(file.job.training.accum_mode, AccumulationMode::kNoAllReduce);
  EXPECT_EQ(file.job.parallelism.param_dtype, at::kBFloat16);
  EXPECT_EQ(file.job.parallelism.reduce_dtype, at::kFloat);
  EXPECT_EQ(file.job.parallelism.all_gather.int8_block, 128);
  EXPECT_EQ(file.job.parallelism.wrap_policy.min_params, 1000);
  EXPECT_EQ(file.job.parallelism.strategy, ShardingStrategy::kHybridShard);
  EXPECT_EQ(file.job.parallelism.replicate, 2);
  EXPECT_EQ(file.job.data.text_field, "body");
  EXPECT_EQ(file.job.launch.nproc, 4);
  EXPECT_EQ(file.job.launch.timeout_s, 12.5);
  EXPECT_EQ(file.job.model.n_layer, 3);
  EXPECT_TRUE(file.job.training.decay_all);
  EXPECT_EQ(file.job.model.init_from, "");
  EXPECT_THAT(flags.toml, HasSubstr("# init_from is unset"));
}

// Unset settings (no --reduce-dtype, no --nproc, no size override) stay unset through a file.
TEST(JobConfigFile, UnsetSettingsStayUnset) {
  const Parsed flags = parse_train_flags({});
  EXPECT_THAT(flags.toml, HasSubstr("# reduce_dtype is unset"));
  EXPECT_THAT(flags.toml, HasSubstr("# nproc is unset"));
  EXPECT_THAT(flags.toml, HasSubstr("# n_embd is unset"));
  const Parsed file = parse_train_flags({"--config", write_file("unset.toml", flags.toml)});
  EXPECT_FALSE(file.job.parallelism.reduce_dtype.has_value());
  EXPECT_EQ(file.job.launch.nproc, 0);
  EXPECT_EQ(file.job.model.n_embd, 0);
  EXPECT_EQ(file.toml, flags.toml);
}

TEST(JobConfigFile, FlagsOverrideTheFile) {
  const std::string path =
      write_file("override.toml", "[training]\nsteps = 9\nlr = 0.5\n[metrics]\nquiet = true\n");
  const Parsed parsed = parse_train_flags({"--config", path, "--steps=11", "--quiet=false"});
  EXPECT_EQ(parsed.job.training.steps, 11);
  EXPECT_EQ(parsed.job.training.lr, 0.5);
  EXPECT_FALSE(parsed.job.metrics.quiet);
  // The order does not matter: a flag before --config overrides it too.
  EXPECT_EQ(parse_train_flags({"--steps", "12", "--config", path}).job.training.steps, 12);
}

TEST(JobConfigFile, AFloatSettingTakesAnInteger) {
  const std::string path = write_file("integer.toml", "[training]\nlr = 1\nmin_lr = 0\n");
  const Parsed parsed = parse_train_flags({"--config", path});
  EXPECT_EQ(parsed.job.training.lr, 1.0);
  EXPECT_THAT(parsed.toml, HasSubstr("lr = 1.0\n"));
}

struct BadFile {
  const char* name;
  const char* text;
  const char* message;  // a part of the error
};

TEST(JobConfigFile, WhatAFileGetsWrongIsRefusedByName) {
  const std::vector<BadFile> cases = {
      {"key", "[training]\nstepz = 3\n", "[training] stepz is not a setting; [training] has"},
      {"section", "[trainin]\nsteps = 3\n", "[trainin] steps is not a setting; the sections are"},
      {"top", "steps = 3\n", "'steps' is not a [section]"},
      {"type", "[training]\nsteps = \"3\"\n", "[training] steps must be an integer, got string"},
      {"bool", "[metrics]\nquiet = 1\n", "[metrics] quiet must be true or false, got integer"},
      {"float", "[training]\nlr = \"fast\"\n", "[training] lr must be a number, got string"},
      {"nested", "[training.more]\nsteps = 3\n", "[training] more is not a setting"},
      {"syntax", "[training\nsteps = 3\n", "line 1, column 10"},
      {"range", "[training]\nsteps = -3\n", "--steps: -3 is less than 0"},
      {"name", "[parallelism]\nstrategy = \"zero9\"\n",
       "--strategy must be full_shard, shard_grad_op, no_shard, hybrid_shard or whole_tensor, "
       "got 'zero9'"},
      {"nan", "[training]\nlr = nan\n", "--lr: nan is not a finite number"},
      {"cross", "[training]\nglobal_batch = 3\n", "--global-batch 3 is not divisible"},
  };
  for (const BadFile& c : cases) {
    const std::string path = write_file(std::string("bad_") + c.name + ".toml", c.text);
    const CheckOutcome outcome = train_outcome({"--config", path});
    EXPECT_NE(outcome.exit_code, 0) << c.name << " was accepted";
    EXPECT_THAT(outcome.output, HasSubstr(c.message)) << c.name;
  }
}

// [Note: one set of allowed values for flags and files]: the file's value and the flag's get
// the same message.
TEST(JobConfigFile, AFileValueIsRefusedAsItsFlagIs) {
  const std::string path = write_file("same.toml", "[parallelism]\nall_gather = \"int7\"\n");
  const CheckOutcome from_file = train_outcome({"--config", path});
  const CheckOutcome from_flag = train_outcome({"--all-gather", "int7"});
  EXPECT_NE(from_file.exit_code, 0);
  EXPECT_EQ(from_file.output, from_flag.output);
}

// fsdp-estimate and fsdp-plan take fsdp-train's job file: the settings that change a prediction
// are read (under the same keys), the others accepted and left alone; a key no program has is
// still refused.
TEST(JobConfigFile, ThePredictorsTakeTheTrainingJobFile) {
  const Parsed job = parse_train_flags({"--model", "small", "--nproc", "4", "--global-batch", "8"});
  const std::string path = write_file("predict.toml", job.toml);
  auto estimate_cli = make_estimate_cli();
  const CheckOutcome estimate = parse_and_check(*estimate_cli, {"--config", path});
  EXPECT_EQ(estimate.exit_code, 0) << estimate.output;
  auto plan_cli = make_plan_cli();
  const CheckOutcome plan = parse_and_check(
      *plan_cli, {"--config", path, "--hardware", FSDP_SOURCE_DIR "/bench/hardware/h100_sxm.json"});
  EXPECT_EQ(plan.exit_code, 0) << plan.output;
  const std::string bad = write_file("predict_bad.toml", "[training]\nstepz = 1\n");
  const CheckOutcome refused = parse_and_check(*estimate_cli, {"--config", bad});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.output, HasSubstr("stepz is not a setting"));
}

// A --config file naming local ranks is read again by every rank that --nproc starts, which must
// not launch ranks of its own (see kLocalRankMarker).
TEST(JobConfigProcesses, ARunFromPrintConfigTrainsAsTheFlagsRunBitForBit) {
  const std::string flags =
      "--nproc 2 --model tiny --steps 3 --global-batch 4 --seq-len 16 --seed 5 --lr 0.002 "
      "--lr-schedule cosine --warmup-steps 1 --quiet";
  const std::string by_flags = test::temp_path("job_config_flags.jsonl");
  const std::string by_file = test::temp_path("job_config_file.jsonl");
  const std::string toml = test::temp_path("job_config_run.toml");
  const std::string train = test::fsdp_train_binary();
  auto a = test::run_command(train + " " + flags + " --metrics " + by_flags, 240);
  ASSERT_EQ(a.exit_code, 0) << a.output;
  auto p = test::run_command(train + " " + flags + " --print-config > " + toml, 60);
  ASSERT_EQ(p.exit_code, 0) << p.output;
  auto b = test::run_command(train + " --config " + toml + " --metrics " + by_file, 240);
  ASSERT_EQ(b.exit_code, 0) << b.output;
  const auto want = test::read_json_lines(by_flags);
  const auto got = test::read_json_lines(by_file);
  ASSERT_EQ(want.size(), 3u);
  ASSERT_EQ(got.size(), want.size());
  for (size_t s = 0; s < want.size(); ++s) {
    EXPECT_EQ(got[s]["loss"].get<double>(), want[s]["loss"].get<double>()) << "step " << s + 1;
    EXPECT_EQ(got[s]["grad_norm"].get<double>(), want[s]["grad_norm"].get<double>());
    EXPECT_EQ(got[s]["lr"].get<double>(), want[s]["lr"].get<double>());
    EXPECT_EQ(got[s]["ranks"].size(), 2u);
  }
}

}  // namespace
}  // namespace fsdp::tools
