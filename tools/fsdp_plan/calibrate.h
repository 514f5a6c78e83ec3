// fsdp-plan --calibrate: measures this machine into a hardware file (fsdp/step_time_plan.h).
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace fsdp::tools {

struct CalibrateOptions {
  std::string comm_bench;              // the fsdp-comm-bench program
  std::vector<int> world_sizes{2, 4};  // comm-bench runs, one per group size
  double seconds_per_point = 0.15;     // timing budget of each compute measurement
};

// Measures, with LibTorch on one thread: a linear layer's forward and backward FLOP/s over a
// range of sizes and attention (scaled_dot_product_attention, causal, forward and backward)
// over head sizes, both as fractions of the best matmul rate, which becomes the peak; the rate
// of the remaining work of two small reference transformers (see other_work_bandwidth); one
// AdamW step per parameter; the speed-up of all cores over one. Then runs fsdp-comm-bench at
// each world size for the alpha-beta fits. Returns the hardware file's JSON. Takes well under a
// minute on a 2-core machine.
nlohmann::json calibrate(const CalibrateOptions& options);

}  // namespace fsdp::tools
