// Rank 0's console output (progress.h). The banner and the step lines are flushed at once:
// piped to a launcher or a log, stdout is block-buffered.
#include <fsdp_train/progress.h>

#include <common/host_allocator.h>

#include <fmt/format.h>

#include <cstdio>
#include <string>

namespace fsdp::train {
namespace {

std::string format_duration(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

// The FSDP units, in pre-order (the root first), with the parameter elements each owns.
std::string describe_units(const Run& run) {
  std::string list;
  for (const FSDPModule& unit : fsdp_modules_under(*run.model)) {
    int64_t elements = 0;
    for (const ShardedParameter& p : unit.sharded_parameters()) {
      int64_t n = 1;
      for (const int64_t d : p.metadata.global_shape) n *= d;
      elements += n;
    }
    list += fmt::format("{}{} ({})", list.empty() ? "" : ", ",
                        unit.path().empty() ? "root" : unit.path(), elements);
  }
  return list;
}

// The banner's lines about how the model is sharded.
void print_sharding(const Run& run) {
  const JobConfig& o = run.o;
  if (run.root) {
    fmt::print("fsdp-train: {} FSDP units (--wrap-policy {}), parameter elements each: {}\n",
               run.units, to_string(o.parallelism.wrap_policy), describe_units(run));
  }
  if (const auto block = o.parallelism.all_gather.int8_block; block && run.root) {
    fmt::print(
        "fsdp-train: weight all-gathers in int8 (ZeRO++ qwZ), one fp32 scale per {} "
        "elements\n",
        *block);
  }
  if (!run.placement.empty()) {
    fmt::print("fsdp-train: whole_tensor placement (--evenness-priority {}): {}\n",
               o.parallelism.evenness_priority, run.placement);
  }
}

}  // namespace

void print_banner(const Run& run, const TokenDataset& data, double unigram_entropy) {
  if (!run.printing) return;
  const JobConfig& o = run.o;
  fmt::print(
      "fsdp-train: model {} ({:.2f}M parameters), {} on {} rank{}, {} steps of {} x {} tokens, "
      "data: {} ({} {}, unigram entropy {:.3f} nats)\n",
      o.model.name, run.spec->num_parameters() / 1e6, o.parallelism.no_fsdp ? "no FSDP" : "FSDP",
      run.world, run.world == 1 ? "" : "s", o.training.steps, o.training.global_batch,
      o.training.seq_len, data.source(), data.size(),
      data.tokens().scalar_type() == at::kByte ? "bytes" : "tokens", unigram_entropy);
  if (data.labeled()) {
    fmt::print(
        "fsdp-train: fine-tuning data: {} of its {} tokens train (the others are masked); the "
        "loss is the mean over trained targets, and tokens/s counts those\n",
        trained_targets(data.labels()), data.size());
  }
  print_sharding(run);
  fmt::print("fsdp-train: host memory through {}{}\n", tools::describe_host_allocator(),
             run.host_pages.active()
                 ? fmt::format(", given back at a step's end past {}x what a step keeps",
                               tools::KeptPagesRule::kGrowth)
                 : "");
  std::fflush(stdout);
}

void print_progress(const Run& run, const StepRecord& r) {
  const JobConfig& o = run.o;
  const bool due = r.step % o.metrics.log_every == 0 || r.step == 1 || r.step == o.training.steps;
  if (!run.printing || !(due || r.val_loss)) return;
  const int64_t done = r.step - run.first_step;
  const double eta = run.elapsed / double(done) * double(o.training.steps - r.step);
  const std::string val = r.val_loss ? fmt::format(" | val loss {:.4f}", *r.val_loss) : "";
  const std::string scale = r.loss_scale ? fmt::format(" | loss scale {:g}", *r.loss_scale) : "";
  fmt::print(
      "step {:>5}/{} | loss {:.4f}{} | lr {:.3e} | grad norm {:.3f} | {:>8.0f} tokens/s | ETA "
      "{}{}\n",
      r.step, o.training.steps, r.loss, val, r.lr, r.grad_norm, run.tokens_done / run.elapsed,
      format_duration(eta), scale);
  std::fflush(stdout);
}

void print_final(const Run& run, const TrainSummary& summary) {
  if (!run.printing || !summary.last_step) return;
  fmt::print("fsdp-train: final loss {:.4f} nats vs unigram entropy {:.4f} nats, {:.1f}s\n",
             summary.last_step->loss, summary.unigram_entropy, run.elapsed);
}

}  // namespace fsdp::train
