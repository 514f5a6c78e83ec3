// CPU offload (FSDP2's CPUOffloadPolicy) and in-place storage resizing, on the paths a machine
// without a GPU can run: on a CPU mesh the policy is accepted, the state lives in host memory,
// the optimizer steps on host tensors, and training is bit-identical to training without it.
// The copies to and from a device (the rest of the policy) need a GPU and are not run here.
#include "support/gpt_case.h"
#include "support/harness.h"

#include <fsdp/fully_shard.h>
#include <fsdp/runtime/storage.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace fsdp::test {
namespace {

// The tiny GPT-2 (built whole, then sharded) with every unit's FullyShardOptions changed by edit.
TrainCase gpt_with(const GptCaseOptions& opt, const std::function<void(FullyShardOptions&)>& edit) {
  TrainCase c = gpt_case(opt);
  c.shard = [opt, edit](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    auto model = std::static_pointer_cast<models::GPT2LMHeadImpl>(m);
    FullyShardOptions block;
    block.reshard_after_forward(opt.reshard_after_forward).mp_policy(opt.mp_policy);
    edit(block);
    for (auto& b : model->transformer->blocks) fully_shard(b, mesh, block);
    FullyShardOptions root;
    root.mp_policy(opt.mp_policy);
    edit(root);
    fully_shard(m, mesh, root).set_implicit_prefetch(opt.prefetch);
  };
  return c;
}

void offload(FullyShardOptions& o) { o.offload_policy(CPUOffloadPolicy().pin_memory(false)); }
void no_change(FullyShardOptions&) {}

void expect_identical(const std::vector<TrainRecord>& a, const std::vector<TrainRecord>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t r = 0; r < a.size(); ++r) {
    EXPECT_EQ(a[r].losses, b[r].losses) << "rank " << r;
    EXPECT_EQ(a[r].grad_norms, b[r].grad_norms) << "rank " << r;
    ASSERT_EQ(a[r].params.size(), b[r].params.size());
    for (const auto& [name, value] : a[r].params) {
      EXPECT_TRUE(at::equal(value, b[r].params.at(name))) << name << " on rank " << r;
    }
  }
}

TEST(CpuOffload, BitIdenticalToNoOffloadAcrossWorldSizesAndStrategies) {
  for (int world : {1, 2}) {
    for (bool reshard : {true, false}) {  // full_shard, shard_grad_op
      GptCaseOptions opt;
      opt.deferred = false;
      opt.reshard_after_forward = ReshardAfterForward(reshard);
      TrainCase plain = gpt_with(opt, no_change);
      TrainCase offloaded = gpt_with(opt, offload);
      plain.steps = offloaded.steps = 3;
      SCOPED_TRACE("W " + std::to_string(world) + ", reshard after forward " +
                   std::to_string(reshard));
      const auto reference = train_reference(plain);
      const auto a = train_sharded(plain, world);
      const auto b = train_sharded(offloaded, world);
      expect_identical(a, b);
      // And both are the single-process run (bit for bit at W = 1).
      if (world == 1) {
        expect_bit_identical(reference, b[0]);
      } else {
        expect_equivalent(reference, b, 1e-5, 1e-5);
      }
    }
  }
}

// Sharded parameters, their gradients and AdamW's state are host tensors after a step, and the
// optimizer stepped them there.
TEST(CpuOffload, StateLivesInHostMemory) {
  GptCaseOptions opt;
  opt.deferred = false;
  TrainCase c = gpt_with(opt, offload);
  c.steps = 2;
  int checked = 0;
  train_sharded(c, 2,
                [&](int rank, const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh&) {
                  for (const auto& unit : fsdp_modules_under(*m)) {
                    for (const auto& sp : unit.sharded_parameters()) {
                      EXPECT_TRUE(sp.local.device().is_cpu()) << sp.name;
                      ASSERT_TRUE(sp.local.grad().defined()) << sp.name;
                      EXPECT_TRUE(sp.local.grad().device().is_cpu()) << sp.name;
                      EXPECT_FALSE(sp.local.is_pinned()) << "pin_memory(false) was asked for";
                      if (rank == 0) ++checked;
                    }
                  }
                });
  EXPECT_GT(checked, 0);
}

// FSDP2's default pin_memory=true has nothing to pin for on a CPU mesh: accepted, with a warning
// that says why it is ignored; pin_memory(false) is silent.
TEST(CpuOffload, PinMemoryOnACpuMeshWarnsAndIsIgnored) {
  struct Collect : c10::WarningHandler {
    void process(const c10::Warning& w) override { messages.push_back(w.msg()); }
    std::vector<std::string> messages;
  };
  for (bool pin : {true, false}) {
    Collect collect;
    GptCaseOptions opt;
    opt.deferred = false;
    TrainCase c = gpt_with(
        opt, [pin](FullyShardOptions& o) { o.offload_policy(CPUOffloadPolicy().pin_memory(pin)); });
    // Warning handlers are per thread: collect on the rank's thread, where fully_shard runs.
    c.shard = [shard = c.shard, &collect](const std::shared_ptr<torch::nn::Module>& m,
                                          const DeviceMesh& mesh) {
      c10::WarningUtils::WarningHandlerGuard guard(&collect);
      shard(m, mesh);
    };
    c.steps = 1;
    const auto records = train_sharded(c, 1);
    ASSERT_EQ(records[0].losses.size(), 1u);
    const bool warned =
        std::any_of(collect.messages.begin(), collect.messages.end(), [](const std::string& m) {
          return m.find("CPUOffloadPolicy.pin_memory is ignored on a cpu mesh") !=
                 std::string::npos;
        });
    EXPECT_EQ(warned, pin) << "pin_memory " << pin;
  }
}

// The device-generic resize (what runs on CUDA) keeps the StorageImpl, so a view taken before
// the storage was freed sees the values written after it is re-filled, as resize_bytes_cpu does.
TEST(StorageResize, AllocatorPathMatchesTheCpuPath) {
  for (bool generic : {false, true}) {
    const auto resize = generic ? resize_storage_via_allocator : resize_storage;
    at::Tensor t = at::arange(12, at::kFloat).view({3, 4});
    const at::Tensor view = t.t();  // as autograd saves weight.t()
    const c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
    resize(t, 0);
    EXPECT_EQ(t.storage().nbytes(), 0u);
    EXPECT_EQ(t.storage().unsafeGetStorageImpl(), impl);
    resize(t, 12 * sizeof(float));
    EXPECT_EQ(t.storage().nbytes(), 12 * sizeof(float));
    EXPECT_EQ(t.storage().unsafeGetStorageImpl(), impl);
    t.copy_(at::full({3, 4}, 7.0f));
    EXPECT_TRUE(at::equal(view, at::full({4, 3}, 7.0f))) << (generic ? "allocator" : "cpu");
  }
}

TEST(StorageResize, RefusesAResizeThatWouldCopy) {
  at::Tensor t = at::zeros({4});
  try {
    resize_storage_via_allocator(t, 8);
    FAIL() << "expected a refusal";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("resize_storage from 16 to 8 bytes"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace fsdp::test
