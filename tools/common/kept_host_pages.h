// The bound on the freed host pages jemalloc keeps with its decay off, applied at each training
// step's end ([Note: a bound on the kept pages], kept_host_pages.cpp).
#pragma once

#include <common/host_allocator.h>

#include <cstdint>
#include <optional>

namespace fsdp::tools {

// When to give the kept pages back, from the bytes kept at each step's end; no allocator in it,
// so that it is tested on its own. [Note: a bound on the kept pages]
class KeptPagesRule {
 public:
  // A step keeps at most kGrowth times what a step needs, plus kSlackBytes; what a step needs is
  // the most the kMeasuringSteps steps after a give-back kept.
  static constexpr double kGrowth = 1.25;
  static constexpr int64_t kSlackBytes = int64_t{1} << 20;
  static constexpr int kMeasuringSteps = 2;

  // kept: the bytes freed and kept at this step's end. True: give them all back now. The
  // kMeasuringSteps steps after a give-back (the run's first steps come after set-up's) never do.
  bool give_back(int64_t kept);

  // What a step needs kept; none until the steps after a give-back have measured it.
  std::optional<int64_t> need() const {
    return measured_ == kMeasuringSteps ? std::optional<int64_t>(need_) : std::nullopt;
  }

 private:
  int measured_ = 0;  // steps since the last give-back, up to kMeasuringSteps
  int64_t need_ = 0;
};

// What one step's end did: the bytes the allocator keeps after it, and those given back since
// the last step's end (for the first step: set-up's, given back before it).
struct KeptPages {
  int64_t kept_bytes = 0;
  int64_t returned_bytes = 0;
};

// KeptPagesRule applied to the process's jemalloc. Inert (both counts 0) where the process runs
// on another malloc or on jemalloc with a decay of its own (MALLOC_CONF), which then bounds
// what it keeps by time.
class KeptHostPages {
 public:
  KeptHostPages();

  // Whether this process's allocator keeps freed pages for this class to bound.
  bool active() const { return mallctl_ != nullptr; }

  // After set-up, before the first step: gives back every page set-up freed (weights read,
  // the model initialized), which are not a step's.
  void at_run_start();

  // At a step's end, once every tensor of the step is freed: applies the rule.
  KeptPages at_step_end();

 private:
  int64_t kept_bytes() const;
  int64_t give_back_all();  // returns the bytes still kept after

  Mallctl mallctl_ = nullptr;
  int64_t page_bytes_ = 4096;
  KeptPagesRule rule_;
  int64_t returned_at_start_ = 0;  // reported with the first step's end
};

}  // namespace fsdp::tools
