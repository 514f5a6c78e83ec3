// Every flag of every program, given bad values: negative, zero, NaN, infinite, huge, the wrong
// type, a missing file, a directory where a file belongs and the reverse. Each must be refused
// before any work starts, with a message that names the flag.
//
// The catalogue runs in process: each case goes through the program's own parse and checks
// (tools/common/program.h's parse_and_check, which its main() runs too), so the message is the
// one a user sees. A few cases per program also run as real processes, to prove the exit status,
// that nothing starts and that it happens within seconds. The catalogue is checked against each
// program's --help: a flag added without a bad-value case here fails
// FlagCatalogueProcesses.CoversEveryFlag, so the walk stays complete.
#include "support/test_support.h"

#include <common/program.h>
#include <fsdp_comm_bench/cli.h>
#include <fsdp_estimate/cli.h>
#include <fsdp_plan/cli.h>
#include <fsdp_tokenize/cli.h>
#include <fsdp_train/cli.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

struct BadFlag {
  const char* program;
  const char* flag;  // the flag under test; the message must name it
  const char* args;  // the whole command line after the program
};

// A run that refuses its flags starts no rank and loads no data: a few seconds at most, even
// with LibTorch's start-up on a loaded 2-core machine.
constexpr double kWithinSeconds = 10;

// fsdp-plan checks most flags only once it has a hardware file to plan for.
#define FSDP_PLAN_HARDWARE_FLAG "--hardware " FSDP_SOURCE_DIR "/bench/hardware/h100_sxm.json"

// clang-format off
const BadFlag kCatalogue[] = {
    // --- fsdp-train ---
    {"fsdp-train", "--nproc", "--nproc -1"},
    {"fsdp-train", "--nproc", "--nproc 0"},
    {"fsdp-train", "--nproc", "--nproc two"},
    {"fsdp-train", "--nproc", "--nproc 99999999999"},
    {"fsdp-train", "--nproc", "--nproc 500 --global-batch 500"},  // cannot fit the machine
    {"fsdp-train", "--model", "--model gpt5"},
    {"fsdp-train", "--steps", "--steps -1"},
    {"fsdp-train", "--steps", "--steps 1.5"},
    {"fsdp-train", "--steps", "--steps nan"},
    {"fsdp-train", "--global-batch", "--global-batch 0"},
    {"fsdp-train", "--global-batch", "--global-batch -4"},
    {"fsdp-train", "--global-batch", "--global-batch 3"},  // not divisible by the 2 ranks
    {"fsdp-train", "--global-batch", "--global-batch 99999999999998"},
    {"fsdp-train", "--seq-len", "--seq-len 0"},
    {"fsdp-train", "--seq-len", "--seq-len 100000"},
    {"fsdp-train", "--seq-len", "--seq-len x"},
    {"fsdp-train", "--lr", "--lr 0"},
    {"fsdp-train", "--lr", "--lr -1"},
    {"fsdp-train", "--lr", "--lr nan"},
    {"fsdp-train", "--lr", "--lr inf"},
    {"fsdp-train", "--lr", "--lr fast"},
    {"fsdp-train", "--weight-decay", "--weight-decay -0.1"},
    {"fsdp-train", "--weight-decay", "--weight-decay nan"},
    {"fsdp-train", "--weight-decay", "--weight-decay 1e300"},
    {"fsdp-train", "--decay-all", "--decay-all=maybe"},
    {"fsdp-train", "--max-grad-norm", "--max-grad-norm -1"},
    {"fsdp-train", "--max-grad-norm", "--max-grad-norm 0"},
    {"fsdp-train", "--max-grad-norm", "--max-grad-norm nan"},
    {"fsdp-train", "--skip-nonfinite", "--skip-nonfinite -1"},
    {"fsdp-train", "--skip-nonfinite", "--skip-nonfinite many"},
    {"fsdp-train", "--seed", "--seed -1"},
    {"fsdp-train", "--seed", "--seed 1.5"},
    {"fsdp-train", "--seed", "--seed 99999999999999999999"},
    {"fsdp-train", "--reshard-after-forward", "--reshard-after-forward -1"},
    {"fsdp-train", "--reshard-after-forward", "--nproc 4 --global-batch 8 --reshard-after-forward 3"},
    {"fsdp-train", "--activation-checkpoint", "--activation-checkpoint=maybe"},
    {"fsdp-train", "--no-fsdp", "--no-fsdp=maybe"},
    {"fsdp-train", "--no-fsdp", "--no-fsdp --nproc 2"},
    {"fsdp-train", "--device", "--device tpu"},
    {"fsdp-train", "--device", "--device CPU"},
    {"fsdp-train", "--offload", "--offload=maybe"},
    {"fsdp-train", "--offload", "--offload --no-fsdp"},
    {"fsdp-train", "--data", "--data /nonexistent/corpus.txt"},
    {"fsdp-train", "--data", "--data /"},
    {"fsdp-train", "--metrics", "--metrics /nonexistent/dir/m.jsonl"},
    {"fsdp-train", "--metrics", "--metrics /"},
    {"fsdp-train", "--log-every", "--log-every 0"},
    {"fsdp-train", "--log-every", "--log-every -5"},
    {"fsdp-train", "--backend", "--backend carrier-pigeon"},
    {"fsdp-train", "--timeout-s", "--timeout-s -1"},
    {"fsdp-train", "--timeout-s", "--timeout-s 0"},
    {"fsdp-train", "--timeout-s", "--timeout-s nan"},
    {"fsdp-train", "--timeout-s", "--timeout-s inf"},
    {"fsdp-train", "--timeout-s", "--timeout-s 1e300"},
    {"fsdp-train", "--quiet", "--quiet=maybe"},
    {"fsdp-train", "--strategy", "--strategy zero4"},
    {"fsdp-train", "--all-gather", "--all-gather int4"},
    {"fsdp-train", "--all-gather", "--all-gather int8:0"},
    {"fsdp-train", "--all-gather", "--all-gather int8:-3"},
    {"fsdp-train", "--all-gather", "--nproc 1 --all-gather int8"},  // one rank gathers nothing
    {"fsdp-train", "--evenness-priority", "--strategy whole_tensor --evenness-priority 1.5"},
    {"fsdp-train", "--evenness-priority", "--strategy whole_tensor --evenness-priority nan"},
    {"fsdp-train", "--evenness-priority", "--evenness-priority 0.5"},  // needs whole_tensor
    {"fsdp-train", "--shard-dim", "--shard-dim -1"},
    {"fsdp-train", "--shard-dim", "--shard-dim one"},
    {"fsdp-train", "--shard-dim", "--strategy whole_tensor --shard-dim 1"},  // tensors stay whole
    {"fsdp-train", "--replicate", "--replicate 0"},
    {"fsdp-train", "--replicate", "--replicate 2"},  // needs hybrid_shard
    {"fsdp-train", "--replicate", "--nproc 4 --global-batch 8 --strategy hybrid_shard --replicate 3"},
    {"fsdp-train", "--tp", "--tp 0"},
    {"fsdp-train", "--tp", "--nproc 2 --model llama-tiny --tp 3"},  // does not divide W
    {"fsdp-train", "--tp", "--nproc 4 --global-batch 8 --model tiny --tp 4"},  // 2 heads
    {"fsdp-train", "--sequence-parallel", "--sequence-parallel=maybe"},
    {"fsdp-train", "--sequence-parallel", "--nproc 2 --sequence-parallel"},  // no --tp
    {"fsdp-train", "--sequence-parallel",
     "--nproc 2 --model llama-tiny --tp 2 --sequence-parallel --seq-len 15"},
    {"fsdp-train", "--param-dtype", "--param-dtype int8"},
    {"fsdp-train", "--init-scale", "--param-dtype fp16 --init-scale 0"},
    {"fsdp-train", "--init-scale", "--param-dtype fp16 --init-scale inf"},
    {"fsdp-train", "--init-scale", "--param-dtype fp16 --init-scale 1e39"},
    {"fsdp-train", "--growth-factor", "--param-dtype fp16 --growth-factor 1"},
    {"fsdp-train", "--growth-factor", "--param-dtype fp16 --growth-factor nan"},
    {"fsdp-train", "--backoff-factor", "--param-dtype fp16 --backoff-factor 1"},
    {"fsdp-train", "--backoff-factor", "--param-dtype fp16 --backoff-factor 0"},
    {"fsdp-train", "--growth-interval", "--param-dtype fp16 --growth-interval 0"},
    {"fsdp-train", "--growth-interval", "--param-dtype fp16 --growth-interval 1.5"},
    {"fsdp-train", "--growth-interval", "--param-dtype fp16 --growth-interval 2147483648"},
    {"fsdp-train", "--growth-interval", "--growth-interval 100"},  // no scaler without fp16
    {"fsdp-train", "--reduce-dtype", "--reduce-dtype fp64"},
    {"fsdp-train", "--grad-accum", "--grad-accum 0"},
    {"fsdp-train", "--grad-accum", "--grad-accum -2"},
    {"fsdp-train", "--grad-accum", "--global-batch 4 --grad-accum 3"},
    {"fsdp-train", "--accum-mode", "--accum-mode later"},
    {"fsdp-train", "--accum-mode", "--grad-accum 2 --accum-mode no-all-reduce"},  // needs replicas
    {"fsdp-train", "--gradient-divide-factor", "--gradient-divide-factor -1"},
    {"fsdp-train", "--gradient-divide-factor", "--gradient-divide-factor nan"},
    {"fsdp-train", "--gradient-divide-factor", "--gradient-divide-factor inf"},
    {"fsdp-train", "--gradient-divide-factor", "--gradient-divide-factor 2 --no-fsdp"},
    {"fsdp-train", "--head-unit", "--head-unit=maybe"},
    {"fsdp-train", "--head-unit", "--head-unit --no-fsdp"},
    {"fsdp-train", "--head-unit", "--nproc 2 --head-unit --tp 2"},
    {"fsdp-train", "--head-unit", "--nproc 2 --head-unit --strategy whole_tensor"},
    {"fsdp-train", "--head-unit", "--nproc 2 --head-unit --shard-dim 1"},
    {"fsdp-train", "--head-unit", "--nproc 2 --head-unit --wrap-policy min-params:1000"},
    {"fsdp-train", "--force-sum-reduction", "--force-sum-reduction=maybe"},
    {"fsdp-train", "--force-sum-reduction", "--force-sum-reduction --no-fsdp"},
    {"fsdp-train", "--prefetch", "--prefetch 65"},
    {"fsdp-train", "--prefetch", "--prefetch -1"},
    {"fsdp-train", "--wrap-policy", "--wrap-policy blocks"},
    {"fsdp-train", "--wrap-policy", "--wrap-policy min-params:0"},
    {"fsdp-train", "--wrap-policy", "--wrap-policy min-params:x"},
    {"fsdp-train", "--wrap-policy", "--wrap-policy min-params:-3"},
    {"fsdp-train", "--wrap-policy", "--wrap-policy min-params:99999999999999999999"},
    {"fsdp-train", "--trace", "--trace /etc/hostname"},
    {"fsdp-train", "--trace", "--trace /nonexistent/a/b"},
    {"fsdp-train", "--tensorboard", "--tensorboard /etc/hostname"},
    {"fsdp-train", "--tensorboard", "--tensorboard /nonexistent/a/b"},
    {"fsdp-train", "--tensorboard", "--tensorboard ''"},
    {"fsdp-train", "--save", "--save /etc/hostname"},
    {"fsdp-train", "--save", "--save /etc/hostname/ckpt"},
    {"fsdp-train", "--save-every", "--save /tmp/unused --save-every -1"},
    {"fsdp-train", "--save-every", "--save-every 5"},  // needs --save
    {"fsdp-train", "--checkpoint-format", "--checkpoint-format pickle"},
    {"fsdp-train", "--checkpoint-format", "--checkpoint-format dcp-hf"},  // without --save
    {"fsdp-train", "--resume", "--resume /nonexistent/ckpt"},
    {"fsdp-train", "--resume", "--resume /etc/hostname"},
    {"fsdp-train", "--resume", "--resume auto"},  // without --save
    {"fsdp-train", "--export", "--export /"},
    {"fsdp-train", "--export", "--export /etc/hostname/model.safetensors"},
    {"fsdp-train", "--export-dtype", "--export-dtype fp8"},
    {"fsdp-train", "--export-max-shard-bytes", "--export-max-shard-bytes -1"},
    {"fsdp-train", "--export-max-shard-bytes", "--export-max-shard-bytes 1e9"},
    {"fsdp-train", "--vocab-size", "--vocab-size 0"},
    {"fsdp-train", "--vocab-size", "--vocab-size 100"},  // fewer than the 256 byte ids fed
    {"fsdp-train", "--n-positions", "--n-positions 0"},
    {"fsdp-train", "--n-positions", "--n-positions 32"},  // shorter than --seq-len 64
    {"fsdp-train", "--n-embd", "--n-embd -32"},
    {"fsdp-train", "--n-layer", "--n-layer many"},
    {"fsdp-train", "--n-head", "--n-head 5"},  // does not divide n_embd 32
    {"fsdp-train", "--config", "--config /nonexistent/job.toml"},
    {"fsdp-train", "--config", "--config /"},
    {"fsdp-train", "--print-config", "--print-config=maybe"},
    {"fsdp-train", "--init-from", "--init-from /nonexistent/model.safetensors"},
    {"fsdp-train", "--init-from", "--init-from /"},
    {"fsdp-train", "--dump-batches", "--dump-batches /"},
    {"fsdp-train", "--dump-batches", "--dump-batches /nonexistent/dir/b.bin"},
    {"fsdp-train", "--data", "--data /nonexistent/*.bin"},
    {"fsdp-train", "--data", "--data /etc/hostname,"},
    {"fsdp-train", "--tokenizer", "--tokenizer /nonexistent/tokenizer.json"},
    {"fsdp-train", "--tokenizer", "--tokenizer /"},
    {"fsdp-train", "--tokenizer", "--tokenizer /etc/hostname"},  // not a tokenizer.json
    {"fsdp-train", "--text-field", "--text-field ''"},
    {"fsdp-train", "--val-data", "--val-data /nonexistent/val.txt"},
    {"fsdp-train", "--val-data", "--val-data /"},
    {"fsdp-train", "--val-every", "--val-every -1"},
    {"fsdp-train", "--val-every", "--val-every often"},
    {"fsdp-train", "--val-batches", "--val-batches 0"},
    {"fsdp-train", "--val-batches", "--val-batches -3"},
    {"fsdp-train", "--lr-schedule", "--lr-schedule linear"},
    {"fsdp-train", "--warmup-steps", "--warmup-steps -1"},
    {"fsdp-train", "--warmup-steps", "--warmup-steps 1.5"},
    {"fsdp-train", "--min-lr", "--min-lr -1"},
    {"fsdp-train", "--min-lr", "--min-lr nan"},
    {"fsdp-train", "--min-lr", "--lr 1e-3 --min-lr 0.01"},  // above --lr
    {"fsdp-train", "--decay-frac", "--decay-frac 1.5"},
    {"fsdp-train", "--decay-frac", "--decay-frac -0.1"},
    {"fsdp-train", "--decay-frac", "--decay-frac nan"},
    // --- fsdp-estimate ---
    {"fsdp-estimate", "--model", "--model gpt5"},
    {"fsdp-estimate", "--vocab-size", "--vocab-size 0"},
    {"fsdp-estimate", "--vocab-size", "--vocab-size -1"},
    {"fsdp-estimate", "--n-positions", "--n-positions 0"},
    {"fsdp-estimate", "--n-positions", "--n-positions nan"},
    {"fsdp-estimate", "--n-embd", "--n-embd -32"},
    {"fsdp-estimate", "--n-embd", "--n-embd 1000000000"},
    {"fsdp-estimate", "--n-layer", "--n-layer 0"},
    {"fsdp-estimate", "--n-layer", "--n-layer many"},
    {"fsdp-estimate", "--n-head", "--n-head 0"},
    {"fsdp-estimate", "--n-head", "--n-head 5"},  // does not divide n_embd 32
    {"fsdp-estimate", "--world-size", "--world-size 0"},
    {"fsdp-estimate", "--world-size", "--world-size -2"},
    {"fsdp-estimate", "--strategy", "--strategy zero4"},
    {"fsdp-estimate", "--evenness-priority", "--strategy whole_tensor --evenness-priority -1"},
    {"fsdp-estimate", "--evenness-priority", "--evenness-priority 0.5"},  // needs whole_tensor
    {"fsdp-estimate", "--shard-dim", "--shard-dim -1"},
    {"fsdp-estimate", "--shard-dim", "--strategy whole_tensor --shard-dim 1"},
    {"fsdp-estimate", "--replicate", "--replicate 0"},
    {"fsdp-estimate", "--replicate", "--world-size 4 --strategy hybrid_shard --replicate 3"},
    {"fsdp-estimate", "--param-dtype", "--param-dtype int8"},
    {"fsdp-estimate", "--reduce-dtype", "--reduce-dtype x"},
    {"fsdp-estimate", "--master-dtype", "--master-dtype x"},
    {"fsdp-estimate", "--config", "--config /nonexistent/job.toml"},
    {"fsdp-estimate", "--print-config", "--print-config=maybe"},
    {"fsdp-estimate", "--global-batch", "--global-batch 0"},
    {"fsdp-estimate", "--global-batch", "--global-batch 99999999999998"},
    {"fsdp-estimate", "--seq-len", "--seq-len 0"},
    {"fsdp-estimate", "--seq-len", "--seq-len 100000"},
    {"fsdp-estimate", "--activation-checkpoint", "--activation-checkpoint=maybe"},
    {"fsdp-estimate", "--reshard-after-forward", "--reshard-after-forward -1"},
    {"fsdp-estimate", "--reshard-after-forward", "--world-size 4 --reshard-after-forward 3"},
    {"fsdp-estimate", "--prefetch", "--prefetch -1"},
    {"fsdp-estimate", "--tp", "--tp 0"},
    {"fsdp-estimate", "--tp", "--world-size 4 --tp 3"},  // does not divide the world
    {"fsdp-estimate", "--tp", "--world-size 4 --tp 2 --strategy no_shard"},
    {"fsdp-estimate", "--tp", "--world-size 4 --tp 4 --model tiny"},  // 2 heads
    {"fsdp-estimate", "--sequence-parallel", "--sequence-parallel=maybe"},
    {"fsdp-estimate", "--sequence-parallel", "--world-size 2 --sequence-parallel"},  // no --tp
    {"fsdp-estimate", "--sequence-parallel",
     "--world-size 2 --tp 2 --sequence-parallel --seq-len 15"},
    {"fsdp-estimate", "--head-unit", "--head-unit=maybe"},
    {"fsdp-estimate", "--head-unit", "--head-unit --no-fsdp"},
    {"fsdp-estimate", "--head-unit", "--world-size 2 --head-unit --tp 2"},
    {"fsdp-estimate", "--head-unit", "--head-unit --strategy whole_tensor"},
    {"fsdp-estimate", "--head-unit", "--head-unit --shard-dim 1"},
    {"fsdp-estimate", "--grad-accum", "--grad-accum 0"},
    {"fsdp-estimate", "--accum-mode", "--accum-mode later"},
    {"fsdp-estimate", "--no-fsdp", "--no-fsdp=maybe"},
    {"fsdp-estimate", "--pretty", "--pretty=maybe"},
    {"fsdp-estimate", "--timeline", "--timeline=maybe"},
    // --- fsdp-plan (the same model and mode flags as fsdp-estimate, plus the hardware file) ---
    {"fsdp-plan", "--model", "--model gpt5"},
    {"fsdp-plan", "--vocab-size", "--vocab-size 0"},
    {"fsdp-plan", "--n-positions", "--n-positions 0"},
    {"fsdp-plan", "--n-embd", "--n-embd -32"},
    {"fsdp-plan", "--n-layer", "--n-layer many"},
    {"fsdp-plan", "--n-head", FSDP_PLAN_HARDWARE_FLAG " --n-head 5"},
    {"fsdp-plan", "--world-size", "--world-size 0"},
    {"fsdp-plan", "--strategy", "--strategy zero4"},
    {"fsdp-plan", "--replicate", "--replicate 0"},
    {"fsdp-plan", "--shard-dim", "--shard-dim -1"},
    {"fsdp-plan", "--shard-dim", FSDP_PLAN_HARDWARE_FLAG " --strategy whole_tensor --shard-dim 1"},
    {"fsdp-plan", "--replicate", FSDP_PLAN_HARDWARE_FLAG " --world-size 4 --strategy hybrid_shard --replicate 3"},
    {"fsdp-plan", "--param-dtype", FSDP_PLAN_HARDWARE_FLAG " --param-dtype int8"},
    {"fsdp-plan", "--reduce-dtype", FSDP_PLAN_HARDWARE_FLAG " --reduce-dtype x"},
    {"fsdp-plan", "--master-dtype", FSDP_PLAN_HARDWARE_FLAG " --master-dtype x"},
    {"fsdp-plan", "--global-batch", "--global-batch 0"},
    {"fsdp-plan", "--seq-len", FSDP_PLAN_HARDWARE_FLAG " --seq-len 100000"},
    {"fsdp-plan", "--activation-checkpoint", "--activation-checkpoint=maybe"},
    {"fsdp-plan", "--reshard-after-forward", FSDP_PLAN_HARDWARE_FLAG " --world-size 4 --reshard-after-forward 3"},
    {"fsdp-plan", "--prefetch", "--prefetch -1"},
    {"fsdp-plan", "--tp", "--tp 0"},
    {"fsdp-plan", "--tp", FSDP_PLAN_HARDWARE_FLAG " --world-size 4 --tp 3"},  // does not divide W
    {"fsdp-plan", "--sequence-parallel", "--sequence-parallel=maybe"},
    {"fsdp-plan", "--sequence-parallel", FSDP_PLAN_HARDWARE_FLAG " --sequence-parallel"},  // no --tp
    {"fsdp-plan", "--head-unit", "--head-unit=maybe"},
    {"fsdp-plan", "--head-unit", FSDP_PLAN_HARDWARE_FLAG " --head-unit --strategy whole_tensor"},
    {"fsdp-plan", "--grad-accum", "--grad-accum 0"},
    {"fsdp-plan", "--accum-mode", "--accum-mode later"},
    {"fsdp-plan", "--no-fsdp", "--no-fsdp=maybe"},
    {"fsdp-plan", "--max-grad-norm", "--max-grad-norm nan"},
    {"fsdp-plan", "--config", "--config /"},
    {"fsdp-plan", "--print-config", "--print-config=maybe"},
    {"fsdp-plan", "--hardware", "--hardware /nonexistent.json"},
    {"fsdp-plan", "--hardware", "--hardware /"},
    {"fsdp-plan", "--hardware", "--hardware /etc/hostname"},  // not JSON
    {"fsdp-plan", "--hardware", "--world-size 2"},  // required without --calibrate
    {"fsdp-plan", "--json", "--json=maybe"},
    {"fsdp-plan", "--pretty", "--pretty=maybe"},
    {"fsdp-plan", "--calibrate", "--calibrate=maybe"},
    {"fsdp-plan", "--output", "--calibrate --output /"},
    {"fsdp-plan", "--output", "--calibrate"},  // --calibrate needs somewhere to write
    {"fsdp-plan", "--sweep", "--sweep=maybe"},
    {"fsdp-plan", "--evenness-priority", "--evenness-priority 2"},
    {"fsdp-plan", "--evenness-priority", FSDP_PLAN_HARDWARE_FLAG " --evenness-priority 0.5"},  // whole_tensor only
    {"fsdp-plan", "--memory-budget", FSDP_PLAN_HARDWARE_FLAG " --sweep --memory-budget 12Q"},
    {"fsdp-plan", "--memory-budget", FSDP_PLAN_HARDWARE_FLAG " --memory-budget 80G"},  // without --sweep
    // --- fsdp-tokenize (a tokenizer file is read only after every flag passed) ---
    {"fsdp-tokenize", "--tokenizer", "--tokenizer /nonexistent.json --output /tmp/x.bin /etc/hostname"},
    {"fsdp-tokenize", "--tokenizer", "--tokenizer / --output /tmp/x.bin /etc/hostname"},
    {"fsdp-tokenize", "--tokenizer", "--tokenizer /etc/hostname --output /tmp/fsdp_flag_x.bin /etc/hostname"},
    {"fsdp-tokenize", "--tokenizer", "--output /tmp/x.bin /etc/hostname"},  // required
    {"fsdp-tokenize", "--tokenizer-config", "--tokenizer /etc/hostname --tokenizer-config /nonexistent --output /tmp/x.bin /etc/hostname"},
    {"fsdp-tokenize", "--tokenizer-config", "--tokenizer /etc/hostname --tokenizer-config / --output /tmp/x.bin /etc/hostname"},
    {"fsdp-tokenize", "--output", "--tokenizer /etc/hostname --output / /etc/hostname"},
    {"fsdp-tokenize", "--output", "--tokenizer /etc/hostname --output /nonexistent/x.bin /etc/hostname"},
    {"fsdp-tokenize", "--text-field", "--tokenizer /etc/hostname --output /tmp/x.bin --text-field '' /etc/hostname"},
    {"fsdp-tokenize", "--format", "--tokenizer /etc/hostname --output /tmp/x.bin --format int8 /etc/hostname"},
    {"fsdp-tokenize", "--quiet", "--tokenizer /etc/hostname --output /tmp/x.bin --quiet=maybe /etc/hostname"},
    {"fsdp-tokenize", "input", "--tokenizer /etc/hostname --output /tmp/x.bin /nonexistent/corpus.txt"},
    {"fsdp-tokenize", "input", "--tokenizer /etc/hostname --output /tmp/x.bin"},  // none given
    // --- fsdp-comm-bench ---
    {"fsdp-comm-bench", "--nproc", "--nproc 0"},
    {"fsdp-comm-bench", "--nproc", "--nproc two"},
    {"fsdp-comm-bench", "--backend", "--backend carrier-pigeon"},
    {"fsdp-comm-bench", "--collectives", "--collectives all_gather,all_to_all"},
    {"fsdp-comm-bench", "--min-bytes", "--min-bytes 0"},
    {"fsdp-comm-bench", "--min-bytes", "--min-bytes 4X"},
    {"fsdp-comm-bench", "--min-bytes", "--min-bytes -1K"},
    {"fsdp-comm-bench", "--max-bytes", "--max-bytes 99999999G"},
    {"fsdp-comm-bench", "--max-bytes", "--min-bytes 1M --max-bytes 1K"},  // below --min-bytes
    {"fsdp-comm-bench", "--step-factor", "--step-factor 1"},
    {"fsdp-comm-bench", "--iters", "--iters 0"},
    {"fsdp-comm-bench", "--warmup", "--warmup -1"},
    {"fsdp-comm-bench", "--time-budget-s", "--time-budget-s 0"},
    {"fsdp-comm-bench", "--time-budget-s", "--time-budget-s nan"},
    {"fsdp-comm-bench", "--dtype", "--dtype int8"},
    {"fsdp-comm-bench", "--output", "--output /nonexistent/x.json"},
    {"fsdp-comm-bench", "--output", "--output /"},
    {"fsdp-comm-bench", "--timeout-s", "--timeout-s -5"},
};
// clang-format on

// The program's command line object, as its main() makes it.
std::unique_ptr<tools::ProgramCli> make_cli(const std::string& program) {
  static const std::map<std::string, std::function<std::unique_ptr<tools::ProgramCli>()>> made = {
      {"fsdp-train", tools::make_train_cli},
      {"fsdp-estimate", tools::make_estimate_cli},
      {"fsdp-plan", tools::make_plan_cli},
      {"fsdp-tokenize", tools::make_tokenize_cli},
      {"fsdp-comm-bench", tools::make_comm_bench_cli}};
  const auto it = made.find(program);
  if (it == made.end()) throw std::runtime_error("no program " + program);
  return it->second();
}

// A command line as the shell splits it: words, and '...' quoting (the catalogue's only quotes).
std::vector<std::string> shell_words(const std::string& line) {
  std::vector<std::string> words;
  std::string word;
  bool quoted = false, any = false;
  for (char ch : line) {
    if (ch == '\'') {
      quoted = !quoted;
      any = true;
    } else if (ch == ' ' && !quoted) {
      if (any) words.push_back(word);
      word.clear();
      any = false;
    } else {
      word += ch;
      any = true;
    }
  }
  if (any) words.push_back(word);
  return words;
}

// A refusal for a person: non-zero status below 128, the flag named, no crash or stack trace.
void expect_refused(const BadFlag& c, int exit_code, const std::string& output) {
  EXPECT_NE(exit_code, 0) << c.program << " " << c.args << " was accepted:\n" << output;
  EXPECT_THAT(output, HasSubstr(c.flag)) << c.program << " " << c.args;
  EXPECT_THAT(output, ::testing::Not(HasSubstr("Exception raised from")));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("terminate called")));
  EXPECT_LT(exit_code, 128) << "killed by a signal: " << output;
}

// The control: a good command line passes the same parse and checks (so a harness that
// refused everything could not pass the catalogue).
TEST(FlagCatalogue, GoodCommandLinesPassInProcess) {
  const std::pair<const char*, const char*> kGood[] = {
      {"fsdp-train", "--steps 1 --nproc 2"},
      {"fsdp-train", "--no-fsdp --steps 1 --activation-checkpoint"},
      {"fsdp-estimate", "--world-size 4 --strategy hybrid_shard --replicate 2"},
      {"fsdp-plan", FSDP_PLAN_HARDWARE_FLAG " --world-size 2 --sweep"},
      {"fsdp-comm-bench", "--min-bytes 1K --max-bytes 1M"}};
  for (const auto& [program, args] : kGood) {
    auto cli = make_cli(program);
    const tools::CheckOutcome outcome = tools::parse_and_check(*cli, shell_words(args));
    EXPECT_EQ(outcome.exit_code, 0) << program << " " << args << ":\n" << outcome.output;
    EXPECT_EQ(outcome.output, "") << program << " " << args;
  }
}

// Every case, in process: the program's parse and checks, as its main() runs them.
TEST(FlagCatalogue, EveryBadValueIsRefusedNamingTheFlag) {
  for (const BadFlag& c : kCatalogue) {
    SCOPED_TRACE(std::string(c.program) + " " + c.args);
    auto cli = make_cli(c.program);
    const tools::CheckOutcome outcome = tools::parse_and_check(*cli, shell_words(c.args));
    expect_refused(c, outcome.exit_code, outcome.output);
  }
}

// Some cases as real processes: the exit status a shell sees, within seconds, before any rank
// or work starts. One per kind of failure and program: CLI11's parse (a bad value, a missing
// file), the checks after it (flags against each other, the machine), and for fsdp-train the
// check of a launch's ranks.
TEST(FlagCatalogueProcesses, ProgramsExitAtOnceNamingTheFlag) {
  const BadFlag kAsProcesses[] = {
      {"fsdp-train", "--lr", "--lr nan"},
      {"fsdp-train", "--data", "--data /nonexistent/corpus.txt"},
      {"fsdp-train", "--global-batch", "--global-batch 3"},
      {"fsdp-train", "--nproc", "--nproc 500 --global-batch 500"},
      {"fsdp-train", "--no-fsdp", "--no-fsdp --nproc 2"},
      {"fsdp-estimate", "--world-size", "--world-size 0"},
      {"fsdp-estimate", "--replicate", "--replicate 2"},
      {"fsdp-plan", "--hardware", "--hardware /etc/hostname"},
      {"fsdp-plan", "--output", "--calibrate"},
      {"fsdp-tokenize", "--tokenizer",
       "--tokenizer /etc/hostname --output /tmp/fsdp_flag_x.bin /etc/hostname"},
      {"fsdp-tokenize", "input", "--tokenizer /etc/hostname --output /tmp/x.bin"},
      {"fsdp-comm-bench", "--min-bytes", "--min-bytes 4X"},
      {"fsdp-comm-bench", "--max-bytes", "--min-bytes 1M --max-bytes 1K"},
  };
  for (const BadFlag& c : kAsProcesses) {
    SCOPED_TRACE(std::string(c.program) + " " + c.args);
    const auto start = std::chrono::steady_clock::now();
    const CommandResult r = run_command(program_path(c.program) + " " + c.args, 60);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    expect_refused(c, r.exit_code, r.output);
    EXPECT_LT(seconds, kWithinSeconds);
  }
}

// The flags a --help text lists (CLI11 prints each option's names first on its line).
std::set<std::string> flags_in_help(const std::string& help) {
  std::set<std::string> flags;
  const std::regex option_line(R"(^\s+(-[-a-zA-Z0-9,]+))");
  std::istringstream lines(help);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (!std::regex_search(line, m, option_line)) continue;
    std::istringstream names(m[1].str());
    for (std::string name; std::getline(names, name, ',');) {
      if (name.rfind("--", 0) == 0) flags.insert(name);
    }
  }
  return flags;
}

// Each program's --help (a process: exit status 0) lists flags that all have a case in the
// catalogue.
TEST(FlagCatalogueProcesses, CoversEveryFlag) {
  std::map<std::string, std::set<std::string>> covered;
  for (const BadFlag& c : kCatalogue) covered[c.program].insert(c.flag);
  for (const auto& [program, cases] : covered) {
    const CommandResult r = run_command(program_path(program) + " --help", 60);
    EXPECT_EQ(r.exit_code, 0) << r.output;
    const std::set<std::string> flags = flags_in_help(r.output);
    EXPECT_GT(flags.size(), 5u) << program << "'s --help was not understood";
    for (const std::string& flag : flags) {
      // Neither takes a value to get wrong; --version has its own cases below.
      if (flag == "--help" || flag == "--version") continue;
      // A flag with two names (--world-size,--nproc) is covered by either.
      const bool has_case =
          cases.count(flag) > 0 || ((program == "fsdp-estimate" || program == "fsdp-plan") &&
                                    flag == "--nproc" && cases.count("--world-size") > 0);
      EXPECT_TRUE(has_case) << program << " " << flag << " has no bad-value case in the catalogue";
    }
  }
}

const char* const kPrograms[] = {"fsdp-train", "fsdp-estimate", "fsdp-plan", "fsdp-tokenize",
                                 "fsdp-comm-bench"};

// "<program> <version> (<commit>)\n": CMake's project version, and git describe's commit (or
// "unknown"), one word either way.
void expect_version_line(const std::string& program, const std::string& output) {
  const std::regex line("^" + program + " " FSDP_PROJECT_VERSION R"( \(([0-9A-Za-z._-]+)\)\n$)");
  EXPECT_TRUE(std::regex_match(output, line)) << program << " --version printed '" << output << "'";
}

// --version on every program, in process: status 0, the line, nothing else (not even the
// required flags fsdp-tokenize otherwise asks for), the same commit everywhere.
TEST(FlagCatalogue, EveryProgramPrintsItsVersion) {
  std::set<std::string> commits;
  for (const char* program : kPrograms) {
    auto cli = make_cli(program);
    const tools::CheckOutcome outcome = tools::parse_and_check(*cli, {"--version"});
    EXPECT_EQ(outcome.exit_code, 0) << program << ":\n" << outcome.output;
    expect_version_line(program, outcome.output);
    commits.insert(outcome.output.substr(outcome.output.find('(')));
  }
  EXPECT_EQ(commits.size(), 1u) << "the programs disagree on the commit";
}

// The same as real processes: exit status 0 and the line on stdout.
TEST(FlagCatalogueProcesses, EveryProgramPrintsItsVersion) {
  for (const char* program : kPrograms) {
    const CommandResult r = run_command(program_path(program) + " --version 2>/dev/null", 60);
    EXPECT_EQ(r.exit_code, 0) << program << ":\n" << r.output;
    expect_version_line(program, r.output);
  }
}

}  // namespace
}  // namespace fsdp::test
