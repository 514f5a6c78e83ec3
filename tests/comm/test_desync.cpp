// Desync detection: ranks that issue different collectives, sizes or dtypes get an error that
// names each rank's collective (sequence number, op, unit, size) instead of a hang. Two ways:
// - by default, the flight recorder: when the mismatched collective times out, the ranks
//   exchange their records over the store and the error names the first divergence;
// - with check_collectives (FSDP_DEBUG=collectives), a fingerprint all-gather before every
//   collective fails every rank at once, before any data is mixed up.
// The expected messages are built from what each rank did, so they check the comparison, not
// a copy of its output.
#include <ATen/ATen.h>
#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "support/test_support.h"

namespace fsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const auto kShortTimeout = std::chrono::milliseconds(1500);

// A directory of this test's own for the flight records.
std::string record_dir(const std::string& name) {
  const std::string dir = test::temp_path(name);
  ::mkdir(dir.c_str(), 0755);
  return dir;
}

ProcessGroupOptions options_with(const std::string& dir, bool check) {
  ProcessGroupOptions options = test::test_options(kShortTimeout);
  options.flight_recorder_dir = dir;
  options.check_collectives = check;
  return options;
}

// Runs body on 2 ranks as threads and returns what each rank threw ("" if nothing).
std::vector<std::string> errors_of_ranks(const ProcessGroupOptions& options,
                                         const std::function<void(ProcessGroup&)>& body) {
  std::vector<std::string> errors(2);
  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> pg) {
        errors[pg->rank()] = test::error_message([&] { body(*pg); });
      },
      options);
  return errors;
}

void two_matched_all_reduces(ProcessGroup& pg) {
  const CollectiveLabel label("warm-up");
  for (int i = 0; i < 2; ++i) {
    at::Tensor t = at::ones({4});
    pg.all_reduce(t, ReduceOp::kSum)->wait();
  }
}

TEST(DesyncTest, DifferentCollectivesTimeOutNamingWhereTheRanksDiverge) {
  const std::string dir = record_dir("desync_ops");
  const auto errors = errors_of_ranks(options_with(dir, false), [](ProcessGroup& pg) {
    two_matched_all_reduces(pg);
    if (pg.rank() == 0) {
      const CollectiveLabel label("h.3");
      pg.all_gather_into_tensor(at::empty({8}), at::ones({4}))->wait();
    } else {
      const CollectiveLabel label("h.2");
      pg.reduce_scatter_tensor(at::empty({4}), at::ones({8}), ReduceOp::kSum)->wait();
    }
  });
  const std::string where =
      "the ranks diverge at collective #3: rank 0 is at all-gather #3 (unit h.3, 4 x Float), "
      "rank 1 at reduce-scatter #3 (unit h.2, 8 x Float)";
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], AllOf(HasSubstr("rank " + std::to_string(r) + " of 2"),
                                 HasSubstr("timed out"), HasSubstr(where)))
        << "rank " << r;
  }
  // Each rank's record is on disk, its last collective failed.
  std::ifstream file(dir + "/fsdp_flight_recorder_world_rank1.json");
  ASSERT_TRUE(file.good()) << errors[1];
  const auto doc = nlohmann::json::parse(file);
  ASSERT_EQ(doc["collectives"].size(), 3u);
  EXPECT_EQ(doc["collectives"][0]["label"], "warm-up");
  EXPECT_EQ(doc["collectives"][0]["state"], "completed");
  EXPECT_EQ(doc["collectives"][2]["op"], "reduce-scatter");
  EXPECT_EQ(doc["collectives"][2]["state"], "failed");
  std::cerr << "rank 0: " << errors[0] << "\n";
}

TEST(DesyncTest, ARankThatSkippedACollectiveIsNamedWithItsLastOne) {
  // Rank 1 skips the third collective and waits in a barrier (#3 for it): the ranks disagree at
  // #3, and rank 1 is named with what it did instead.
  const auto errors =
      errors_of_ranks(options_with(record_dir("desync_skip"), false), [](ProcessGroup& pg) {
        two_matched_all_reduces(pg);
        if (pg.rank() == 0) {
          const CollectiveLabel label("h.1");
          at::Tensor t = at::ones({16});
          pg.all_reduce(t, ReduceOp::kSum)->wait();
        }
        pg.barrier()->wait();
      });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], HasSubstr("the ranks diverge at collective #3: rank 0 is at all-reduce "
                                     "#3 (unit h.1, 16 x Float), rank 1 at barrier #3"))
        << "rank " << r;
  }
}

TEST(DesyncTest, CheckFailsEveryRankAtOnceOnAUnitRunOnOneRankOnly) {
  // Same sizes and op, different units: without the check these would pair up and mix data.
  const auto start = std::chrono::steady_clock::now();
  const auto errors =
      errors_of_ranks(options_with(record_dir("desync_unit"), true), [](ProcessGroup& pg) {
        two_matched_all_reduces(pg);
        const CollectiveLabel label(pg.rank() == 0 ? "h.1" : "h.2");
        pg.all_gather_into_tensor(at::empty({8}), at::ones({4}))->wait();
      });
  EXPECT_LT(std::chrono::steady_clock::now() - start, kShortTimeout);
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], AllOf(HasSubstr("FSDP_DEBUG=collectives"),
                                 HasSubstr("the ranks diverge at collective #3: rank 0 is at "
                                           "all-gather #3 (unit h.1, 4 x Float), rank 1 at "
                                           "all-gather #3 (unit h.2, 4 x Float)")))
        << "rank " << r;
  }
}

TEST(DesyncTest, CheckNamesRanksThatDisagreeOnSizeOrDtype) {
  const auto sizes =
      errors_of_ranks(options_with(record_dir("desync_size"), true), [](ProcessGroup& pg) {
        const int64_t n = pg.rank() == 0 ? 6 : 4;
        pg.all_gather_into_tensor(at::empty({2 * n}), at::ones({n}))->wait();
      });
  const auto dtypes =
      errors_of_ranks(options_with(record_dir("desync_dtype"), true), [](ProcessGroup& pg) {
        at::Tensor t = at::ones({4}, pg.rank() == 0 ? at::kFloat : at::kDouble);
        pg.all_reduce(t, ReduceOp::kSum)->wait();
      });
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(sizes[r], HasSubstr("rank 0 is at all-gather #1 (6 x Float), rank 1 at all-gather "
                                    "#1 (4 x Float)"));
    EXPECT_THAT(dtypes[r], HasSubstr("rank 0 is at all-reduce #1 (4 x Float), rank 1 at all-reduce "
                                     "#1 (4 x Double)"));
  }
}

TEST(DesyncTest, CheckPassesMatchedCollectivesUntouched) {
  const auto errors =
      errors_of_ranks(options_with(record_dir("desync_none"), true), [](ProcessGroup& pg) {
        at::Tensor t = at::full({4}, pg.rank() + 1.0);
        pg.all_reduce(t, ReduceOp::kSum)->wait();
        TORCH_CHECK(at::equal(t, at::full({4}, 3.0)), "all-reduce under the check gave ", t);
        at::Tensor out = at::empty({4});
        pg.all_gather_into_tensor(out, at::full({2}, static_cast<float>(pg.rank())))->wait();
        TORCH_CHECK(at::equal(out, at::tensor({0.f, 0.f, 1.f, 1.f})), "all-gather gave ", out);
      });
  EXPECT_EQ(errors, std::vector<std::string>(2, ""));
}

// Two FSDP units "0" and "1"; forward skips unit "0" when skip_first is set.
struct TwoUnitsImpl : torch::nn::Module {
  TwoUnitsImpl() {
    units.push_back(register_module("0", torch::nn::Linear(4, 4)));
    units.push_back(register_module("1", torch::nn::Linear(4, 4)));
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t i = skip_first ? 1 : 0; i < units.size(); ++i) x = fsdp::forward(units[i], x);
    return x;
  }
  std::vector<torch::nn::Linear> units;
  bool skip_first = false;
};
TORCH_MODULE(TwoUnits);

TEST(DesyncTest, UnitForwardRunOnOneRankOnlyIsNamedByUnitPath) {
  // fully_shard labels each unit's all-gather with the unit's path; rank 1 skips unit "0".
  std::vector<std::string> errors(2);
  run_ranks_in_threads(
      2,
      [&](std::shared_ptr<ProcessGroup> pg) {
        errors[pg->rank()] = test::error_message([&] {
          DeviceMesh mesh(pg);
          TwoUnits model;
          for (auto& unit : model->units) fully_shard(unit, mesh);
          fully_shard(model, mesh);
          model->skip_first = pg->rank() == 1;
          fsdp::forward(model, at::ones({2, 4}));
        });
      },
      options_with(record_dir("desync_model"), true));
  for (int r = 0; r < 2; ++r) {
    EXPECT_THAT(errors[r], AllOf(HasSubstr("rank 0 is at all-gather"), HasSubstr("(unit 0,"),
                                 HasSubstr("rank 1 at all-gather"), HasSubstr("(unit 1,")))
        << "rank " << r;
  }
  std::cerr << "model desync: " << errors[0] << "\n";
}

}  // namespace
}  // namespace fsdp
