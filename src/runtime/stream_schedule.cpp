// Builds and checks the CUDA stream schedule as data. The builder mirrors the runtime's issue
// order: pre_forward issues the unit's all-gather, then the prefetches, then waits (copy-out);
// post_backward reshards, packs the gradients on compute (FSDP2's order: the full gradients are
// freed at once), issues the reduce-scatter and finishes the oldest beyond the options' cap
// (kMaxReductionsInFlight unless a test says otherwise; see
// [Note: why reductions are capped at two in flight] in in_flight_limits.h), under HSDP by
// issuing its all-reduce, which is finished beyond the same cap in turn; the end of backward
// finishes the rest, the reduce-scatters first. tests/runtime/test_stream_runtime.cpp compares this
// with the ops the runtime reports for the same units and options. The checker builds
// happens-before as a DAG over ops (program order per stream, an edge from each event's recorder to
// its waiters); since an op may only wait on an earlier recorded event, issue order is a
// topological order and one pass suffices.
#include "fsdp/runtime/stream_schedule.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>
#include <sstream>

namespace fsdp {
namespace {

std::string name(const char* base, int unit, const std::string& phase = "") {
  std::string out = std::string(base) + "[" + std::to_string(unit) + "]";
  return phase.empty() ? out : out + "@" + phase;
}

using Names = std::vector<std::string>;

// A function, not brace initialisation, so that every op spells only the fields it uses.
ScheduleOp make_op(ScheduleStream stream, ScheduleOpKind kind, int unit, Names waits = {},
                   Names reads = {}, Names writes = {}, std::string record = "", Names frees = {}) {
  return ScheduleOp{stream,
                    kind,
                    unit,
                    std::move(waits),
                    std::move(reads),
                    std::move(writes),
                    std::move(record),
                    std::move(frees)};
}

enum class Gather { kSharded, kIssued, kUnsharded };

// A buffer whose free waits until its last reader's event has been recorded and the owning
// stream can wait on it.
struct DeferredFree {
  std::string buffer;
  ScheduleStream stream;
  std::string event;
};

class Builder {
 public:
  explicit Builder(const ScheduleOptions& options) : state_(options.units, Gather::kSharded) {
    s_.options = options;
    phase_.assign(options.units, "fwd");
    for (int u = 0; u < options.units; ++u) {
      s_.persistent.push_back(name("shard", u));
      s_.persistent.push_back(name("sharded_grad", u));
    }
  }

  StreamSchedule build() {
    for (int u = 0; u < units(); ++u) forward(u);
    for (int u = units() - 1; u >= 0; --u) backward(u);
    while (!pending_.empty()) finish_reduce();
    while (!all_reducing_.empty()) finish_all_reduce();
    for (int st = 0; st < kScheduleStreams; ++st) flush(static_cast<ScheduleStream>(st));
    return s_;
  }

 private:
  int units() const { return s_.options.units; }
  const ScheduleOp& emit(ScheduleOp op) {
    recorded_.insert(op.record);
    s_.ops.push_back(std::move(op));
    return s_.ops.back();
  }

  // Frees on `stream` whose reader's event exists, in one release op before its next op.
  void flush(ScheduleStream stream) {
    ScheduleOp release = make_op(stream, ScheduleOpKind::kRelease, -1);
    auto ready = [&](const DeferredFree& d) {
      return d.stream == stream && recorded_.count(d.event);
    };
    for (const auto& d : deferred_) {
      if (!ready(d)) continue;
      release.waits.push_back(d.event);
      release.frees.push_back(d.buffer);
    }
    deferred_.erase(std::remove_if(deferred_.begin(), deferred_.end(), ready), deferred_.end());
    if (!release.frees.empty()) emit(release);
  }

  void issue_unshard(int u) {
    if (state_[u] != Gather::kSharded) return;
    const std::string& p = phase_[u];
    const std::string buf = name("ag_buf", u, p);
    flush(ScheduleStream::kCopyIn);  // the previous gathers' buffers: bounds prefetch memory
    Names waits;
    if (!step_begun_) {
      // The step's first copy-in reads shards the optimizer wrote on compute.
      emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kBeginStep, -1, {}, {}, {},
                   "step_begin"));
      waits.push_back("step_begin");
      step_begun_ = true;
    }
    emit(make_op(ScheduleStream::kCopyIn, ScheduleOpKind::kCopyIn, u, std::move(waits),
                 {name("shard", u)}, {buf}, name("copied_in", u, p)));
    // The runtime's shards are one flat buffer already: the all-gather reads them directly,
    // and the copy-in only allocates its output (or casts, or copies from the host).
    emit(make_op(ScheduleStream::kAllGather, ScheduleOpKind::kAllGather, u,
                 {name("copied_in", u, p)}, {name("shard", u)}, {buf}, name("gathered", u, p)));
    state_[u] = Gather::kIssued;
  }

  void wait_unshard(int u) {
    if (state_[u] == Gather::kUnsharded) return;
    const std::string& p = phase_[u];
    emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kCopyOut, u, {name("gathered", u, p)},
                 {name("ag_buf", u, p)}, {name("unsharded", u, p)}, name("copied_out", u, p)));
    deferred_.push_back({name("ag_buf", u, p), ScheduleStream::kCopyIn, name("copied_out", u, p)});
    state_[u] = Gather::kUnsharded;
  }

  void reshard(int u) {
    emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kReshard, u, {}, {}, {}, "",
                 {name("unsharded", u, phase_[u])}));
    state_[u] = Gather::kSharded;
  }

  void forward(int u) {
    issue_unshard(u);
    for (int k = 1; k <= s_.options.prefetch && u + k < units(); ++k) issue_unshard(u + k);
    wait_unshard(u);
    emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kForward, u, {},
                 {name("unsharded", u, "fwd")}));
    if (s_.options.reshard_after_forward) reshard(u);
    // A unit regathered in backward gets fresh buffers; their names say which gather.
    phase_[u] = "bwd";
  }

  void backward(int u) {
    if (state_[u] == Gather::kSharded) phase_[u] = "bwd";
    issue_unshard(u);
    // Only units whose backward is still to come (all of u-1..u-d here).
    for (int k = 1; k <= s_.options.prefetch && u - k >= 0; ++k) issue_unshard(u - k);
    wait_unshard(u);
    const std::string unsharded =
        name("unsharded", u, s_.options.reshard_after_forward ? "bwd" : "fwd");
    emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kBackward, u, {}, {unsharded},
                 {name("grad", u)}));
    emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kReshard, u, {}, {}, {}, "",
                 {unsharded}));
    state_[u] = Gather::kSharded;
    reduce_scatter(u);
  }

  void reduce_scatter(int u) {
    // Packed on compute, where the full gradients were written, so they are freed at once; the
    // packed input, read on the reduce-scatter stream, is freed on compute at finish_reduce.
    emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kRsCopyIn, u, {}, {name("grad", u)},
                 {name("rs_in", u)}, name("rs_copied_in", u), {name("grad", u)}));
    flush(ScheduleStream::kReduceScatter);
    emit(make_op(ScheduleStream::kReduceScatter, ScheduleOpKind::kReduceScatter, u,
                 {name("rs_copied_in", u)}, {name("rs_in", u)}, {name("rs_out", u)},
                 name("reduced", u)));
    pending_.push_back(u);
    while (static_cast<int>(pending_.size()) > s_.options.reduces_in_flight) finish_reduce();
  }

  void finish_reduce() {
    const int u = pending_.front();
    pending_.pop_front();
    if (!s_.options.hsdp) {
      emit_finish(u, name("reduced", u));
      return;
    }
    // See [Note: HSDP's all-reduce runs beside the next units' backward].
    emit(make_op(ScheduleStream::kAllReduce, ScheduleOpKind::kAllReduce, u, {name("reduced", u)},
                 {name("rs_out", u)}, {name("rs_out", u)}, name("all_reduced", u)));
    all_reducing_.push_back(u);
    while (static_cast<int>(all_reducing_.size()) > s_.options.all_reduces_in_flight) {
      finish_all_reduce();
    }
  }

  void finish_all_reduce() {
    const int u = all_reducing_.front();
    all_reducing_.pop_front();
    emit_finish(u, name("all_reduced", u));
  }

  void emit_finish(int u, const std::string& ready) {
    // rs_in[u] was allocated on compute and last read on the reduce-scatter stream, which
    // recorded `reduced` (before `all_reduced`) after that read: waiting on it orders the free.
    emit(make_op(ScheduleStream::kCompute, ScheduleOpKind::kFinishReduce, u, {ready},
                 {name("rs_out", u)}, {name("sharded_grad", u)}, name("finished", u),
                 {name("rs_in", u)}));
    deferred_.push_back({name("rs_out", u), ScheduleStream::kReduceScatter, name("finished", u)});
  }

  StreamSchedule s_;
  std::vector<Gather> state_;
  std::vector<std::string> phase_;
  std::deque<int> pending_;       // reduce-scatters in flight
  std::deque<int> all_reducing_;  // HSDP: all-reduces across replicas in flight
  std::vector<DeferredFree> deferred_;
  std::set<std::string> recorded_;
  bool step_begun_ = false;
};

// ---- Checking ----

struct BufferUse {
  std::vector<int> writers, users, frees;
};

class Checker {
 public:
  explicit Checker(const StreamSchedule& s) : s_(s), n_(static_cast<int>(s.ops.size())) {
    for (const auto& b : s.persistent) persistent_.insert(b);
    order_events();
    order_ops();
    index_buffers();
  }

  std::vector<std::string> run() {
    check_reads();
    check_frees();
    check_reduces_in_flight();
    check_memory();
    return out_;
  }

 private:
  std::string at(int i) const {
    return "unit " + std::to_string(s_.ops[i].unit) + ": " + describe(s_.ops[i]);
  }
  bool before(int a, int b) const { return a == b || anc_[b][a]; }

  // (b): an op may wait only on an event an earlier op recorded.
  void order_events() {
    for (int i = 0; i < n_; ++i) {
      for (const auto& e : s_.ops[i].waits) {
        auto it = recorder_.find(e);
        if (it == recorder_.end()) {
          int later = -1;
          for (int j = i + 1; j < n_ && later < 0; ++j) later = s_.ops[j].record == e ? j : -1;
          out_.push_back(at(i) + " waits on event '" + e + "' " +
                         (later < 0 ? "that is never recorded"
                                    : "recorded later, by " + describe(s_.ops[later])) +
                         ": the stream would wait forever");
        }
      }
      if (!s_.ops[i].record.empty()) recorder_.emplace(s_.ops[i].record, i);
    }
  }

  // Ancestors of each op: the previous op on its stream, and the recorders of its waits.
  void order_ops() {
    anc_.assign(n_, std::vector<char>(n_, 0));
    std::vector<int> last(kScheduleStreams, -1);
    for (int i = 0; i < n_; ++i) {
      std::vector<int> preds;
      const int st = static_cast<int>(s_.ops[i].stream);
      if (last[st] >= 0) preds.push_back(last[st]);
      last[st] = i;
      for (const auto& e : s_.ops[i].waits) {
        auto it = recorder_.find(e);
        if (it != recorder_.end() && it->second < i) preds.push_back(it->second);
      }
      for (int p : preds) {
        anc_[i][p] = 1;
        for (int k = 0; k < p; ++k) anc_[i][k] |= anc_[p][k];
      }
    }
  }

  void index_buffers() {
    for (int i = 0; i < n_; ++i) {
      const auto& op = s_.ops[i];
      for (const auto& b : op.writes) buffers_[b].writers.push_back(i);
      for (const auto& b : op.reads) buffers_[b].users.push_back(i);
      for (const auto& b : op.writes) buffers_[b].users.push_back(i);
      for (const auto& b : op.frees) buffers_[b].frees.push_back(i);
    }
  }

  // (c): some other op's write of the buffer happens before each read. A persistent buffer
  // (shards) was written by the optimizer on compute before the step: its readers must be
  // ordered after the step's begin_step op.
  void check_reads() {
    int begin = -1;
    for (int i = 0; i < n_ && begin < 0; ++i) {
      if (s_.ops[i].kind == ScheduleOpKind::kBeginStep) begin = i;
    }
    for (int i = 0; i < n_; ++i) {
      for (const auto& b : s_.ops[i].reads) {
        if (persistent_.count(b)) {
          if (begin >= 0 && !before(begin, i)) {
            out_.push_back(at(i) + " reads '" + b +
                           "' with no wait ordering it after begin_step (the optimizer's write)");
          }
          continue;
        }
        const auto& w = buffers_[b].writers;
        const bool ok =
            std::any_of(w.begin(), w.end(), [&](int j) { return j != i && before(j, i); });
        if (!ok)
          out_.push_back(at(i) + " reads '" + b +
                         "' with no write of it ordered before (a missing event wait)");
      }
    }
  }

  // (a): freed once, on the allocating stream, after every use of it.
  void check_frees() {
    for (const auto& [b, use] : buffers_) {
      if (persistent_.count(b)) continue;
      if (use.frees.empty() && !use.writers.empty()) {
        out_.push_back(at(use.writers.front()) + " allocates '" + b + "', which is never freed");
      }
      for (int f : use.frees) check_free(b, use, f);
    }
  }

  void check_free(const std::string& b, const BufferUse& use, int f) {
    if (!use.writers.empty() && s_.ops[use.writers.front()].stream != s_.ops[f].stream) {
      out_.push_back(at(f) + " frees '" + b + "', allocated on " +
                     to_string(s_.ops[use.writers.front()].stream) +
                     ": the caching allocator would reuse it unordered");
    }
    for (int u : use.users) {
      if (u == f || before(u, f)) continue;
      out_.push_back(at(f) + " frees '" + b + "' before the event of its reader " +
                     describe(s_.ops[u]) + " has been waited on");
    }
  }

  // (d): when a reduce-scatter is issued, at most kMaxReductionsInFlight earlier ones unfinished
  // (see [Note: why reductions are capped at two in flight]); under HSDP a reduce-scatter is
  // finished once its all-reduce is issued, and the all-reduces have a cap of their own,
  // kMaxAllReducesInFlight (see [Note: HSDP's all-reduce runs beside the next units' backward]).
  void check_reduces_in_flight() {
    std::vector<int> scattering, all_reducing;
    auto finished = [](std::vector<int>& units, int u) {
      units.erase(std::remove(units.begin(), units.end(), u), units.end());
    };
    for (int i = 0; i < n_; ++i) {
      const auto& op = s_.ops[i];
      if (op.kind == ScheduleOpKind::kFinishReduce) {
        finished(scattering, op.unit);
        finished(all_reducing, op.unit);
      } else if (op.kind == ScheduleOpKind::kReduceScatter) {
        check_cap(i, scattering, "reduce-scatters", kMaxReductionsInFlight);
        scattering.push_back(op.unit);
      } else if (op.kind == ScheduleOpKind::kAllReduce) {
        finished(scattering, op.unit);
        check_cap(i, all_reducing, "all-reduces across replicas", kMaxAllReducesInFlight);
        all_reducing.push_back(op.unit);
      }
    }
  }

  void check_cap(int i, const std::vector<int>& unfinished, const char* what, int cap) {
    if (static_cast<int>(unfinished.size()) <= cap) return;
    std::string units;
    for (int u : unfinished) units += " " + std::to_string(u);
    out_.push_back(at(i) + " is issued with " + std::to_string(unfinished.size()) + " " + what +
                   " unfinished (units" + units + "); the runtime allows " + std::to_string(cap));
  }

  void check_memory() {
    bound("unsharded parameter", peak_unsharded(s_), max_unsharded(s_.options));
    bound("all-gather", peak_gathered(s_), max_gathered(s_.options));
  }

  void bound(const char* what, int peak, int most) {
    if (peak <= most) return;
    out_.push_back("step: " + std::to_string(peak) + " " + what +
                   " buffers live at once, more than " + std::to_string(most) + " (prefetch " +
                   std::to_string(s_.options.prefetch) + ")");
  }

  const StreamSchedule& s_;
  int n_;
  std::set<std::string> persistent_;
  std::map<std::string, int> recorder_;
  std::vector<std::vector<char>> anc_;
  std::map<std::string, BufferUse> buffers_;
  std::vector<std::string> out_;
};

int peak_live(const StreamSchedule& schedule, const std::string& prefix) {
  std::set<std::string> live;
  size_t peak = 0;
  for (const auto& op : schedule.ops) {
    for (const auto& b : op.writes) {
      if (b.rfind(prefix, 0) == 0) live.insert(b);
    }
    peak = std::max(peak, live.size());
    for (const auto& b : op.frees) live.erase(b);
  }
  return static_cast<int>(peak);
}

}  // namespace

StreamSchedule build_stream_schedule(const ScheduleOptions& options) {
  TORCH_CHECK(options.units >= 1, "stream schedule: units must be >= 1, got ", options.units);
  TORCH_CHECK(options.prefetch >= 0, "stream schedule: prefetch must be >= 0, got ",
              options.prefetch);
  TORCH_CHECK(options.reduces_in_flight >= 0,
              "stream schedule: reduces_in_flight must be >= 0, got ", options.reduces_in_flight);
  TORCH_CHECK(options.all_reduces_in_flight >= 0,
              "stream schedule: all_reduces_in_flight must be >= 0, got ",
              options.all_reduces_in_flight);
  return Builder(options).build();
}

std::vector<std::string> check_schedule(const StreamSchedule& schedule) {
  return Checker(schedule).run();
}

int peak_unsharded(const StreamSchedule& schedule) { return peak_live(schedule, "unsharded["); }
int peak_gathered(const StreamSchedule& schedule) { return peak_live(schedule, "ag_buf["); }

int max_unsharded(const ScheduleOptions& options) {
  return options.reshard_after_forward ? 1 : options.units;
}
int max_gathered(const ScheduleOptions& options) {
  return std::min(options.units, 1 + options.prefetch);
}

std::vector<std::string> collective_order(const StreamSchedule& schedule) {
  std::vector<std::string> out;
  for (const auto& op : schedule.ops) {
    if (op.kind == ScheduleOpKind::kAllGather || op.kind == ScheduleOpKind::kReduceScatter ||
        op.kind == ScheduleOpKind::kAllReduce) {
      out.push_back(std::string(to_string(op.kind)) + " " + std::to_string(op.unit));
    }
  }
  return out;
}

const char* to_string(ScheduleStream stream) {
  static const char* names[] = {"compute", "copy-in", "all-gather", "reduce-scatter", "all-reduce"};
  return names[static_cast<int>(stream)];
}

const char* to_string(ScheduleOpKind kind) {
  static const char* names[] = {"copy_in",    "all_gather",    "copy_out",   "forward",
                                "reshard",    "backward",      "rs_copy_in", "reduce_scatter",
                                "all_reduce", "finish_reduce", "release",    "begin_step"};
  return names[static_cast<int>(kind)];
}

std::string describe(const ScheduleOp& op) {
  return std::string(to_string(op.kind)) + "[" + std::to_string(op.unit) + "] on " +
         to_string(op.stream);
}

std::string to_text(const StreamSchedule& schedule) {
  constexpr int kWidth = 26;
  std::ostringstream out;
  auto row = [&](int column, const std::string& text) {
    std::string line(static_cast<size_t>(kWidth * column), ' ');
    for (int c = 0; c < column; ++c) line[static_cast<size_t>(c * kWidth)] = '|';
    out << line << "| " << text << "\n";
  };
  for (int st = 0; st < kScheduleStreams; ++st) {
    std::string head = to_string(static_cast<ScheduleStream>(st));
    out << "| " << head << std::string(static_cast<size_t>(kWidth - 2) - head.size(), ' ');
  }
  out << "\n";
  for (const auto& op : schedule.ops) {
    const int column = static_cast<int>(op.stream);
    for (const auto& e : op.waits) row(column, "wait " + e);
    row(column,
        std::string(to_string(op.kind)) + (op.unit >= 0 ? " " + std::to_string(op.unit) : ""));
    if (!op.record.empty()) row(column, "record " + op.record);
    for (const auto& b : op.frees) row(column, "free " + b);
  }
  return out.str();
}

}  // namespace fsdp
