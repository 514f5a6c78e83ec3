// Int8AllGather (ZeRO++ qwZ) over real gloo groups of thread-ranks, against the exact full
// tensor: every gathered element within absmax(its block) / 254 of the truth, equal to a
// quantize-dequantize written here from plain tensor ops, zero padding exact, and the bytes on
// the wire those of the analytic count.
#include "support/test_support.h"

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/comm/rendezvous.h>

#include <ATen/ATen.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using ::testing::HasSubstr;

// The reference: each rank's part quantized on its own, element by element in double, with the
// same rule (scale absmax / 127, round half to even, clamp to +-127), then dequantized.
at::Tensor reference_round_trip(const at::Tensor& full, int world, int64_t block) {
  const int64_t per_rank = full.numel() / world;
  at::Tensor out = at::empty_like(full);
  const auto x = full.accessor<float, 1>();
  auto y = out.accessor<float, 1>();
  for (int r = 0; r < world; ++r) {
    for (int64_t start = 0; start < per_rank; start += block) {
      const int64_t end = std::min(per_rank, start + block);
      float absmax = 0;
      for (int64_t i = start; i < end; ++i)
        absmax = std::max(absmax, std::abs(x[r * per_rank + i]));
      const float scale = absmax / 127.0f;
      for (int64_t i = start; i < end; ++i) {
        const float v = x[r * per_rank + i];
        const float q = scale == 0 ? 0.0f : std::clamp(std::nearbyint(v / scale), -127.0f, 127.0f);
        y[r * per_rank + i] = q * scale;
      }
    }
  }
  return out;
}

// Gathers full (world parts) with Int8AllGather on `world` thread-ranks; returns rank 0's output
// and checks every rank got the same one.
at::Tensor int8_gather(const at::Tensor& full, int world, int64_t block,
                       at::ScalarType dtype = at::kFloat) {
  const int64_t per_rank = full.numel() / world;
  std::vector<at::Tensor> outputs(world);
  run_ranks_in_threads(
      world,
      [&](std::shared_ptr<ProcessGroup> group) {
        const int rank = group->rank();
        Int8AllGather gather(block);
        const at::Tensor input = full.narrow(0, rank * per_rank, per_rank).to(dtype);
        const at::Tensor before = input.clone();
        at::Tensor output = gather.allocate(full.numel(), dtype, at::kCPU);
        gather(output, input, *group)->wait();
        EXPECT_TRUE(input.equal(before)) << "the gather changed its input";
        outputs[rank] = output;
      },
      test_options());
  for (int r = 1; r < world; ++r) EXPECT_TRUE(outputs[r].equal(outputs[0])) << "rank " << r;
  return outputs[0];
}

// Every element within absmax(block) / 254 of the truth (and a float32 rounding of the two
// products), blocks taken per rank.
void expect_within_bound(const at::Tensor& full, const at::Tensor& got, int world, int64_t block,
                         const std::string& what) {
  const int64_t per_rank = full.numel() / world;
  const auto x = full.accessor<float, 1>();
  const auto y = got.accessor<float, 1>();
  for (int r = 0; r < world; ++r) {
    for (int64_t start = 0; start < per_rank; start += block) {
      const int64_t end = std::min(per_rank, start + block);
      float absmax = 0;
      for (int64_t i = start; i < end; ++i)
        absmax = std::max(absmax, std::abs(x[r * per_rank + i]));
      const double bound = absmax / 254.0 + 4 * std::numeric_limits<float>::epsilon() * absmax;
      for (int64_t i = start; i < end; ++i) {
        const int64_t k = r * per_rank + i;
        ASSERT_LE(std::abs(double(x[k]) - double(y[k])), bound)
            << what << ": element " << k << " (rank " << r << ", block at " << start << ") is "
            << y[k] << " for " << x[k];
      }
    }
  }
}

struct Int8Case {
  const char* name;
  int world;
  int64_t per_rank;
  int64_t block;
};

// Sizes that are and are not multiples of the block, a block larger than a rank's part, and
// blocks of 1 (exact up to rounding).
const Int8Case kCases[] = {{"aligned", 2, 512, 256},  {"ragged", 2, 300, 256},
                           {"tiny_part", 4, 37, 256}, {"odd_block", 3, 1000, 77},
                           {"block_of_1", 2, 33, 1},  {"many_ranks", 4, 513, 128}};

void PrintTo(const Int8Case& c, std::ostream* os) { *os << c.name; }

class Int8AllGatherCases : public ::testing::TestWithParam<Int8Case> {};

// Inputs meant to break a quantizer: random, all zeros, one huge outlier per block (the rest
// quantize to 0), a block straddling what would be a rank boundary if blocks were global, and
// tiny magnitudes.
std::vector<std::pair<std::string, at::Tensor>> adversarial_inputs(int64_t numel, int64_t block) {
  std::vector<std::pair<std::string, at::Tensor>> inputs;
  at::manual_seed(7);
  inputs.emplace_back("random", at::randn({numel}));
  inputs.emplace_back("zeros", at::zeros({numel}));
  at::Tensor outliers = at::randn({numel}) * 1e-3;
  for (int64_t i = block / 2; i < numel; i += block) outliers[i] = i % 2 == 0 ? 1e6 : -1e6;
  inputs.emplace_back("outlier_per_block", outliers);
  inputs.emplace_back("ramp", at::linspace(-5, 3, numel));
  inputs.emplace_back("tiny", at::randn({numel}) * 1e-30);
  return inputs;
}

TEST_P(Int8AllGatherCases, WithinTheBoundAndEqualToThePlainRoundTrip) {
  const Int8Case c = GetParam();
  for (const auto& [what, full] : adversarial_inputs(c.world * c.per_rank, c.block)) {
    const at::Tensor got = int8_gather(full, c.world, c.block);
    expect_within_bound(full, got, c.world, c.block, what);
    const at::Tensor expected = reference_round_trip(full, c.world, c.block);
    EXPECT_TRUE(got.equal(expected)) << what << ": differs from the plain round trip by up to "
                                     << (got - expected).abs().max().item<float>();
    if (what == "zeros") EXPECT_EQ(got.abs().max().item<float>(), 0.0f);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Int8AllGatherCases, ::testing::ValuesIn(kCases),
                         [](const auto& info) { return std::string(info.param.name); });

// The runtime pads each parameter's shard with zeros; they must come back exactly zero, next to
// large values in the same block.
TEST(Int8AllGather, ZeroPaddingStaysExactlyZero) {
  at::Tensor full = at::randn({2 * 300}) * 50;
  full.narrow(0, 290, 10).zero_();  // rank 0's last 10 elements: padding
  full.narrow(0, 590, 10).zero_();
  const at::Tensor got = int8_gather(full, 2, 256);
  EXPECT_TRUE(got.narrow(0, 290, 10).eq(0).all().item<bool>());
  EXPECT_TRUE(got.narrow(0, 590, 10).eq(0).all().item<bool>());
}

// A bf16 output (mixed precision's compute dtype) holds the fp32 round trip rounded to bf16.
TEST(Int8AllGather, DequantizesIntoTheOutputDtype) {
  const at::Tensor full = at::randn({2 * 300});
  const at::Tensor got = int8_gather(full, 2, 64, at::kBFloat16);
  ASSERT_EQ(got.scalar_type(), at::kBFloat16);
  const at::Tensor expected =
      reference_round_trip(full.to(at::kBFloat16).to(at::kFloat), 2, 64).to(at::kBFloat16);
  EXPECT_TRUE(got.equal(expected));
}

// Each rank contributes numel int8 values and ceil(numel / block) fp32 scales: the all-gather
// counters (payload = the gathered bytes, W times one rank's) show exactly that, against
// 4 * numel for the fp32 gather.
TEST(Int8AllGather, MovesTheAnalyticByteCount) {
  for (const int64_t per_rank : {256, 300, 1}) {
    const int world = 2;
    const int64_t block = 256;
    run_ranks_in_threads(
        world,
        [&](std::shared_ptr<ProcessGroup> group) {
          const at::Tensor input = at::randn({per_rank});
          at::Tensor output = at::empty({world * per_rank});
          group->reset_counters();
          group->all_gather_into_tensor(output, input)->wait();
          const CommCounters fp32 = group->counters();
          group->reset_counters();
          Int8AllGather int8_gather(block);
          int8_gather(output, input, *group)->wait();
          const CommCounters int8 = group->counters();
          const int64_t blocks = (per_rank + block - 1) / block;
          EXPECT_EQ(fp32.all_gather.payload_bytes, world * 4 * per_rank);
          EXPECT_EQ(Int8AllGather::bytes_per_rank(per_rank, block), per_rank + 4 * blocks);
          EXPECT_EQ(int8.all_gather.payload_bytes, world * (per_rank + 4 * blocks));
          EXPECT_EQ(int8.all_gather.calls, 2);  // the values and the scales
        },
        test_options());
  }
}

// The gloo backend moves int8 tensors (the values' dtype) like any other: a plain all-gather of
// int8 against the concatenation.
TEST(Int8AllGather, GlooGathersInt8Tensors) {
  run_ranks_in_threads(
      3,
      [](std::shared_ptr<ProcessGroup> group) {
        const at::Tensor mine = at::arange(-5, 6, at::kChar) * (group->rank() + 1);
        at::Tensor out = at::empty({3 * mine.numel()}, at::kChar);
        group->all_gather_into_tensor(out, mine)->wait();
        for (int r = 0; r < 3; ++r) {
          EXPECT_TRUE(out.narrow(0, r * mine.numel(), mine.numel())
                          .equal(at::arange(-5, 6, at::kChar) * (r + 1)));
        }
      },
      test_options());
}

TEST(Int8AllGather, BadArgumentsAreRefusedNamingTheValues) {
  EXPECT_THAT(error_message([] { Int8AllGather(0); }),
              HasSubstr("block size of at least 1, got 0"));
  EXPECT_THAT(error_message([] {
                quantize_int8_blockwise(at::zeros({2, 2}), 4);
              }),
              HasSubstr("1-D floating point tensor, got 2-D"));
  EXPECT_THAT(error_message([] {
                const Int8Blocks q = quantize_int8_blockwise(at::ones({10}), 4);
                dequantize_int8_blockwise(q.values, q.scales.narrow(0, 0, 2), 4, at::empty({10}));
              }),
              HasSubstr("needs 3 scales and an output of 10 elements, got 2 scales"));
  run_ranks_in_threads(
      2,
      [](std::shared_ptr<ProcessGroup> group) {
        EXPECT_THAT(error_message([&] {
                      Int8AllGather gather;
                      gather(at::empty({5}), at::ones({3}), *group);
                    }),
                    HasSubstr("output of 6 elements, got 1-D Float of 5"));
      },
      test_options());
}

}  // namespace
}  // namespace fsdp::test
