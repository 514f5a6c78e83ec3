// fsdp-train's --offload and --device as real processes. --offload on a CPU run keeps the state
// where it already is, so it must train exactly as without it (the host-side path a machine
// without a GPU can run); --device cuda is refused with a message naming the flag here (no GPU,
// or a backend that communicates on cpu).
#include "support/test_support.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace fsdp::train {
namespace {

using test::CommandResult;
using test::read_json_lines;
using test::run_fsdp_train;
using ::testing::HasSubstr;

TEST(FsdpTrainDevice, OffloadTrainsExactlyAsWithout) {
  const std::string common =
      "--model tiny --steps 3 --global-batch 4 --seq-len 16 --quiet --seed 11 --nproc 2";
  for (const std::string strategy : {"full_shard", "shard_grad_op"}) {
    const std::string plain = test::temp_path("offload_plain.jsonl");
    const std::string offloaded = test::temp_path("offload_on.jsonl");
    const CommandResult a =
        run_fsdp_train(common + " --strategy " + strategy + " --metrics " + plain);
    ASSERT_EQ(a.exit_code, 0) << a.output;
    const CommandResult b =
        run_fsdp_train(common + " --strategy " + strategy + " --offload --metrics " + offloaded);
    ASSERT_EQ(b.exit_code, 0) << b.output;
    EXPECT_THAT(b.output, ::testing::Not(HasSubstr("pin_memory")))
        << "the trainer asks for no pinning on CPU";
    const auto want = read_json_lines(plain);
    const auto got = read_json_lines(offloaded);
    ASSERT_EQ(got.size(), 3u);
    ASSERT_EQ(want.size(), 3u);
    for (size_t s = 0; s < got.size(); ++s) {
      EXPECT_EQ(got[s]["loss"].get<double>(), want[s]["loss"].get<double>()) << strategy;
      EXPECT_EQ(got[s]["grad_norm"].get<double>(), want[s]["grad_norm"].get<double>()) << strategy;
      for (int r = 0; r < 2; ++r) {
        for (const char* key : {"param_bytes", "grad_bytes", "optim_bytes", "all_gather_bytes",
                                "reduce_scatter_bytes"}) {
          EXPECT_EQ(got[s]["ranks"][r][key], want[s]["ranks"][r][key]) << key << ", " << strategy;
        }
      }
    }
  }
}

TEST(FsdpTrainDevice, CudaWithoutACudaBackendIsRefusedNamingTheFlag) {
  const CommandResult r = run_fsdp_train("--device cuda --model tiny --steps 1 --quiet");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.output, HasSubstr("--device cuda"));
}

}  // namespace
}  // namespace fsdp::train
