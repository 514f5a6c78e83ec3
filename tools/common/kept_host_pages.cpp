// KeptPagesRule and KeptHostPages (kept_host_pages.h).
//
// [Note: a bound on the kept pages]
// With jemalloc's decay off ([Note: the programs keep freed pages]) a freed page is never given
// back to the kernel, which is what saves a training step from faulting its large tensors in
// again; but nothing then bounds what is kept except how well freed extents fit the next
// requests. Over 3,000 steps of the tiny GPT-2 the pages kept at a step's end grew from 4.4 MB
// to 6.9 MB, and in one 20,000-step soak rank 0's resident memory went from 384 MB to 1.49 GB
// between steps 12,000 and 18,000, where a run with a decay (1 s) stayed at 388 MB. A time decay is
// no bound that fits a step: jemalloc's default 10 s, against HSDP's 12 s GPT-2 steps, gave back
// most pages before the next step could reuse them (15.3-16.0 s a step against 12.1-12.3 s with
// decay off, bench/RESULTS.md's eighth part). So the bound is counted in steps: what a step
// keeps at its end is what the next step can reuse, and a step that ends keeping more than
// kGrowth times what a step needs (plus kSlackBytes, so that a small model's few pages do not
// trip it) gives every kept page back (jemalloc's arena.<all>.purge); the next step faults its
// pages in once, as glibc's malloc makes every step do. What a step needs is measured anew after
// each give-back, as the most that its next kMeasuringSteps steps keep: the first of them keeps
// less than the steady state (GPT-2 HSDP: 1,542 MB, then 1,777-1,785 MB from the second on;
// the tiny model: 4.2 MB, then 4.8), so one step would set the bound too low. Before the first
// step every kept page goes back: what set-up freed (weights read from a checkpoint or from
// Hugging Face files, the model's initialization) is not a step's, and the first step faults its
// pages in anyway (given back after it instead, the second step faulted them in again). A
// one-off (a held-out evaluation, a checkpoint's buffers) goes back at the next step's end when
// it takes what is kept past the bound. --metrics shows both (host_kept_bytes,
// host_returned_bytes per rank).
#include <common/kept_host_pages.h>

#include <sys/types.h>

#include <algorithm>
#include <cstddef>
#include <utility>

namespace fsdp::tools {

bool KeptPagesRule::give_back(int64_t kept) {
  if (measured_ < kMeasuringSteps) {
    need_ = std::max(need_, kept);
    ++measured_;
    return false;
  }
  if (static_cast<double>(kept) <= kGrowth * static_cast<double>(need_) + kSlackBytes) {
    return false;
  }
  need_ = 0;
  measured_ = 0;
  return true;
}

KeptHostPages::KeptHostPages() {
  const Mallctl mallctl = find_mallctl();
  ssize_t dirty_decay = 0;
  // "arenas.dirty_decay_ms" is what new arenas take: MALLOC_CONF's, or jemalloc_config.cpp's.
  // With it off no page reaches the muzzy state, so the dirty decay alone decides.
  if (mallctl == nullptr || !read_mallctl(mallctl, "arenas.dirty_decay_ms", &dirty_decay) ||
      dirty_decay >= 0) {
    return;
  }
  size_t page = 0;
  if (!read_mallctl(mallctl, "arenas.page", &page)) return;
  page_bytes_ = static_cast<int64_t>(page);
  mallctl_ = mallctl;
  if (kept_bytes() < 0) mallctl_ = nullptr;  // a jemalloc built without statistics
}

int64_t KeptHostPages::kept_bytes() const {
  // jemalloc's statistics are a snapshot taken when "epoch" is written.
  uint64_t epoch = 1;
  size_t epoch_size = sizeof(epoch);
  size_t dirty = 0, muzzy = 0;
  if (mallctl_("epoch", &epoch, &epoch_size, &epoch, epoch_size) != 0 ||
      !read_mallctl(mallctl_, "stats.arenas.4096.pdirty", &dirty) ||  // 4096: every arena
      !read_mallctl(mallctl_, "stats.arenas.4096.pmuzzy", &muzzy)) {
    return -1;
  }
  return static_cast<int64_t>(dirty + muzzy) * page_bytes_;
}

int64_t KeptHostPages::give_back_all() {
  mallctl_("arena.4096.purge", nullptr, nullptr, nullptr, 0);
  return kept_bytes();
}

void KeptHostPages::at_run_start() {
  if (!active()) return;
  const int64_t kept = kept_bytes();
  returned_at_start_ = kept - give_back_all();
}

KeptPages KeptHostPages::at_step_end() {
  if (!active()) return {};
  const int64_t earlier = std::exchange(returned_at_start_, 0);
  const int64_t kept = kept_bytes();
  if (!rule_.give_back(kept)) return {kept, earlier};
  const int64_t still_kept = give_back_all();
  return {still_kept, earlier + kept - still_kept};
}

}  // namespace fsdp::tools
