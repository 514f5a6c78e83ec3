// Misuse of fully_shard gets an error that names the fault and the offending values.
#include "support/test_support.h"

#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

namespace fsdp {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(FullyShardErrors, AppliedTwiceToOneModule) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    torch::nn::Linear linear(4, 3);
    fully_shard(linear, mesh);
    EXPECT_THAT(test::error_message([&] { fully_shard(linear, mesh); }),
                AllOf(HasSubstr("already sharded"), HasSubstr("Linear")));
  });
}

TEST(FullyShardErrors, ParameterNotOnTheMeshDevice) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    auto module = std::make_shared<torch::nn::Module>("OnMeta");
    module->register_parameter("weight", at::empty({3, 4}, at::TensorOptions().device(at::kMeta)));
    EXPECT_THAT(
        test::error_message([&] { fully_shard(module, mesh); }),
        AllOf(HasSubstr("'weight'"), HasSubstr("is on meta"), HasSubstr("communicates on cpu")));
  });
}

TEST(FullyShardErrors, MixedDtypesInOneUnit) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    torch::nn::Linear linear(4, 3);
    linear->bias.set_data(linear->bias.data().to(at::kDouble));
    EXPECT_THAT(test::error_message([&] { fully_shard(linear, mesh); }),
                AllOf(HasSubstr("share a dtype"), HasSubstr("'weight' is Float"),
                      HasSubstr("'bias' is Double")));
  });
}

TEST(FullyShardErrors, NullModule) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    EXPECT_THAT(
        test::error_message([&] { fully_shard(std::shared_ptr<torch::nn::Module>(), mesh); }),
        HasSubstr("null"));
  });
}

// The tree-wide settings live in one state the whole tree shares; a unit nested in another
// fully_shard'ed module is not its root, so setting them there throws instead of being lost.
TEST(FullyShardErrors, TreeWideSettersOnANestedUnit) {
  run_ranks_in_threads(1, [](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    auto outer = std::make_shared<torch::nn::Module>("Outer");
    torch::nn::Linear inner(4, 4);
    outer->register_module("inner", inner.ptr());
    FSDPModule nested = fully_shard(inner.ptr(), mesh);
    FSDPModule root = fully_shard(outer, mesh);
    const auto not_root = [](const char* setter) {
      return AllOf(HasSubstr(setter), HasSubstr("unit 'inner'"), HasSubstr("not the root"));
    };
    EXPECT_THAT(test::error_message([&] { nested.set_is_last_backward(false); }),
                not_root("set_is_last_backward"));
    EXPECT_THAT(test::error_message([&] { nested.set_implicit_prefetch(0); }),
                not_root("set_implicit_prefetch"));
    root.set_is_last_backward(true);
    root.set_implicit_prefetch(1);
  });
}

}  // namespace
}  // namespace fsdp
