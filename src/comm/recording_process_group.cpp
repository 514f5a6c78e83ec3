// The flight-recording wrapper around every backend's group (see recording_process_group.h).
//
// Invariants:
// - Recording costs one lock and one record per collective; it never talks to the other ranks.
//   Only a failure (or check_collectives) does.
// - The report is built once per group, by the first failure a caller sees: later failures of
//   the same group (a broken gloo group fails every queued op) quote the same report instead of
//   waiting for the other ranks again.
// - A rank waits at most kReportWait (or the group's timeout, if shorter) for the others'
//   records, so a dead peer delays the error by seconds, never hangs it.
// - The fingerprint all-gather goes to the wrapped group directly: it is not recorded, and it
//   takes the next slot in the backend's queue, so it pairs with the other ranks' fingerprint
//   of their next collective.
#include "recording_process_group.h"

#include "flight_recorder.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fsdp::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kReportWait = std::chrono::seconds(3);
constexpr auto kReportPoll = std::chrono::milliseconds(20);
// How long past kReportWait a rank waits for the store calls themselves to return.
constexpr auto kReportGrace = std::chrono::seconds(1);

// ---- Settings from options and the environment ----

std::string flight_recorder_dir(const ProcessGroupOptions& options) {
  if (!options.flight_recorder_dir.empty()) return options.flight_recorder_dir;
  const char* env = std::getenv("FSDP_FLIGHT_RECORDER_DIR");
  return env != nullptr && *env != '\0' ? env : ".";
}

// FSDP_DEBUG is a comma-separated list, as TORCH_DISTRIBUTED_DEBUG is a level: "collectives"
// turns the fingerprint check on.
bool debug_collectives_from_environment() {
  const char* env = std::getenv("FSDP_DEBUG");
  if (env == nullptr) return false;
  const std::string value = std::string(",") + env + ",";
  return value.find(",collectives,") != std::string::npos;
}

std::string file_safe(const std::string& name) {
  std::string out = name;
  for (char& c : out) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '.' && c != '-') c = '_';
  }
  return out;
}

// ---- The failure report ----

// What the group and its Works share: the records, and the report built on the first failure.
class Recorder {
 public:
  Recorder(c10::intrusive_ptr<c10d::Store> store, std::string name, int rank, int world_size,
           const ProcessGroupOptions& options)
      : records(static_cast<size_t>(options.flight_recorder_entries)),
        store_(std::move(store)),
        name_(std::move(name)),
        rank_(rank),
        world_size_(world_size),
        options_(options) {}

  FlightRecorder records;

  // Marks collective seq failed and throws error's message followed by the report.
  [[noreturn]] void fail(int64_t seq, const std::string& error) {
    records.finish(seq, CollectiveState::kFailed);
    std::call_once(report_once_, [&] { report_ = build_report(); });
    TORCH_CHECK(false, error, "\n", report_);
  }

  const std::string& name() const { return name_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  std::string build_report() {
    const std::vector<CollectiveRecord> mine = records.snapshot();
    std::map<int, std::vector<CollectiveRecord>> by_rank = exchange(mine);
    by_rank[rank_] = mine;
    return "fsdp: rank " + std::to_string(rank_) + " of group '" + name_ +
           "': flight recorder: " + describe_divergence(by_rank, world_size_) + "; " + dump(mine);
  }

  // Publishes this rank's records and collects the others' that arrive in time. The store
  // calls run on a thread of their own: a store whose host is unreachable (a cut link) blocks
  // a socket read for minutes, and a rank that has already failed must not wait for that. Such
  // a thread is left behind, detached, and ends with the process.
  std::map<int, std::vector<CollectiveRecord>> exchange(const std::vector<CollectiveRecord>& mine) {
    if (!store_) return {};
    const auto wait = std::min<Clock::duration>(kReportWait, options_.timeout);
    auto result = std::make_shared<std::promise<std::map<int, std::vector<CollectiveRecord>>>>();
    std::future<std::map<int, std::vector<CollectiveRecord>>> done = result->get_future();
    std::thread([store = store_, rank = rank_, world = world_size_, text = encode_records(mine),
                 deadline = Clock::now() + wait, result] {
      result->set_value(collect_records(*store, rank, world, text, deadline));
    }).detach();
    if (done.wait_for(wait + kReportGrace) != std::future_status::ready) return {};
    return done.get();
  }

  static std::map<int, std::vector<CollectiveRecord>> collect_records(c10d::Store& store, int rank,
                                                                      int world_size,
                                                                      const std::string& text,
                                                                      Clock::time_point deadline) {
    std::map<int, std::vector<CollectiveRecord>> by_rank;
    auto key = [](int r) { return "flight/" + std::to_string(r); };
    try {
      store.set(key(rank), std::vector<uint8_t>(text.begin(), text.end()));
      while (static_cast<int>(by_rank.size()) < world_size - 1 && Clock::now() < deadline) {
        for (int r = 0; r < world_size; ++r) {
          if (r == rank || by_rank.count(r) != 0 || !store.check({key(r)})) continue;
          const std::vector<uint8_t> bytes = store.get(key(r));
          by_rank[r] = decode_records(std::string(bytes.begin(), bytes.end()));
        }
        std::this_thread::sleep_for(kReportPoll);
      }
    } catch (const std::exception& e) {
      // The store went with a dead rank 0: report what this rank knows.
      by_rank.clear();
    }
    return by_rank;
  }

  // Writes this rank's records; returns where, or why not.
  std::string dump(const std::vector<CollectiveRecord>& mine) const {
    const std::string path = flight_recorder_dir(options_) + "/fsdp_flight_recorder_" +
                             file_safe(name_) + "_rank" + std::to_string(rank_) + ".json";
    std::ofstream out(path);
    out << records_to_json(rank_, name_, options_.timeout.count(), mine);
    out.close();
    if (!out) return "could not write its flight record to " + path + ": " + std::strerror(errno);
    return "its last " + std::to_string(mine.size()) + " collectives are in " + path;
  }

  c10::intrusive_ptr<c10d::Store> store_;
  std::string name_;
  int rank_;
  int world_size_;
  ProcessGroupOptions options_;
  std::once_flag report_once_;
  std::string report_;
};

// ---- The fingerprint check ----

constexpr std::array<const char*, 6> kOps = {"all-gather", "reduce-scatter", "all-reduce",
                                             "broadcast",  "barrier",        "reduce"};
constexpr int64_t kLabelWords = 4;  // the first 32 bytes of the label travel with the check
constexpr int64_t kFingerprintWords = 4 + kLabelWords;

at::Tensor fingerprint(const char* op, const at::Tensor& input, int root) {
  at::Tensor fp = at::zeros({kFingerprintWords}, at::kLong);
  int64_t* w = fp.data_ptr<int64_t>();
  w[0] =
      std::find_if(kOps.begin(), kOps.end(), [&](const char* o) { return !std::strcmp(o, op); }) -
      kOps.begin();
  w[1] = input.defined() ? static_cast<int64_t>(input.scalar_type()) : -1;
  w[2] = input.defined() ? input.numel() : 0;
  w[3] = root;
  const std::string& label = CollectiveLabel::current();
  std::memcpy(w + 4, label.data(), std::min<size_t>(label.size(), kLabelWords * 8));
  return fp;
}

CollectiveRecord record_of_fingerprint(int64_t seq, const int64_t* w) {
  CollectiveRecord r;
  r.seq = seq;
  r.op = w[0] >= 0 && w[0] < static_cast<int64_t>(kOps.size()) ? kOps[w[0]] : "unknown op";
  r.dtype = w[1] < 0 ? "" : c10::toString(static_cast<c10::ScalarType>(w[1]));
  r.numel = w[2];
  const char* label = reinterpret_cast<const char*>(w + 4);
  r.label.assign(label, strnlen(label, kLabelWords * 8));
  if (r.op == "broadcast") r.op += " from rank " + std::to_string(w[3]);
  if (r.op == "reduce") r.op += " to rank " + std::to_string(w[3]);
  return r;
}

// ---- The Work and the group ----

class RecordedWork final : public Work {
 public:
  RecordedWork(WorkHandle inner, std::shared_ptr<Recorder> recorder, int64_t seq)
      : inner_(std::move(inner)), recorder_(std::move(recorder)), seq_(seq) {}

  void wait() override {
    try {
      inner_->wait();
    } catch (const std::exception& e) {
      recorder_->fail(seq_, error_message(e));
    }
    copy_times_from(*inner_);
    if (!settled_.exchange(true)) recorder_->records.finish(seq_, CollectiveState::kCompleted);
  }

  bool is_completed() override {
    if (!inner_->is_completed()) return false;
    copy_times_from(*inner_);
    return true;
  }

  // Stream-ordered: whether the op succeeds is known only later, so the record stays in flight
  // until a wait() or is_completed() settles it.
  void wait_on_stream() override {
    try {
      inner_->wait_on_stream();
    } catch (const std::exception& e) {
      recorder_->fail(seq_, error_message(e));
    }
  }

 private:
  WorkHandle inner_;
  std::shared_ptr<Recorder> recorder_;
  int64_t seq_;
  std::atomic<bool> settled_{false};
};

class RecordingProcessGroup final : public ProcessGroup {
 public:
  RecordingProcessGroup(std::shared_ptr<ProcessGroup> inner, c10::intrusive_ptr<c10d::Store> store,
                        std::string name, const ProcessGroupOptions& options)
      : inner_(std::move(inner)),
        store_(std::move(store)),
        options_(options),
        check_(options.check_collectives.value_or(debug_collectives_from_environment())),
        recorder_(std::make_shared<Recorder>(store_, std::move(name), inner_->rank(),
                                             inner_->size(), options)) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  c10::Device device() const override { return inner_->device(); }
  std::string backend_name() const override { return inner_->backend_name(); }
  CommCounters counters() const override { return inner_->counters(); }
  void add_waited(double seconds) override { inner_->add_waited(seconds); }
  void reset_counters() override { inner_->reset_counters(); }

  WorkHandle all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) override {
    return run("all-gather", input, -1,
               [&] { return inner_->all_gather_into_tensor(output, input); });
  }
  WorkHandle reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                   ReduceOp op) override {
    return run("reduce-scatter", input, -1,
               [&] { return inner_->reduce_scatter_tensor(output, input, op); });
  }
  WorkHandle all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    return run("all-reduce", tensor, -1, [&] { return inner_->all_reduce(tensor, op); });
  }
  WorkHandle broadcast(const at::Tensor& tensor, int root) override {
    return run("broadcast", tensor, root, [&] { return inner_->broadcast(tensor, root); });
  }
  WorkHandle reduce(const at::Tensor& tensor, int root, ReduceOp op) override {
    return run("reduce", tensor, root, [&] { return inner_->reduce(tensor, root, op); });
  }
  WorkHandle barrier() override {
    return run("barrier", at::Tensor(), -1, [&] { return inner_->barrier(); });
  }

  std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks,
                                      const std::string& name) override {
    std::shared_ptr<ProcessGroup> sub = inner_->split(ranks, name);
    if (!sub) return nullptr;
    c10::intrusive_ptr<c10d::Store> store;
    if (store_) store = c10::make_intrusive<c10d::PrefixStore>("split/" + name, store_);
    return make_recording_group(std::move(sub), std::move(store), recorder_->name() + "." + name,
                                options_);
  }

 private:
  template <typename Issue>
  WorkHandle run(const char* op, const at::Tensor& input, int root, Issue&& issue) {
    const int64_t seq = recorder_->records.record(op, CollectiveLabel::current(), input);
    if (check_) check_same_collective(seq, op, input, root);
    WorkHandle work;
    try {
      work = issue();
    } catch (const std::exception& e) {
      recorder_->fail(seq, error_message(e));
    }
    return std::make_shared<RecordedWork>(std::move(work), recorder_, seq);
  }

  // Throws on every rank, naming each rank's collective, unless all ranks are about to issue
  // the same one.
  void check_same_collective(int64_t seq, const char* op, const at::Tensor& input, int root) {
    // The fingerprints travel on the backend's device (NCCL moves only CUDA tensors); .cpu()
    // is the tensor itself on a CPU backend.
    const at::Tensor mine = fingerprint(op, input, root).to(inner_->device());
    const at::Tensor all = at::empty({size() * kFingerprintWords}, mine.options());
    try {
      inner_->all_gather_into_tensor(all, mine)->wait();
    } catch (const std::exception& e) {
      recorder_->fail(seq, error_message(e));
    }
    const at::Tensor gathered = all.cpu();
    const int64_t* w = gathered.data_ptr<int64_t>();
    bool same = true;
    for (int r = 1; r < size(); ++r) {
      same = same && std::equal(w, w + kFingerprintWords, w + r * kFingerprintWords);
    }
    if (same) return;
    std::map<int, std::vector<CollectiveRecord>> by_rank;
    for (int r = 0; r < size(); ++r) {
      by_rank[r] = {record_of_fingerprint(seq, w + r * kFingerprintWords)};
    }
    recorder_->records.finish(seq, CollectiveState::kFailed);
    TORCH_CHECK(
        false, "fsdp: rank ", rank(), " of group '", recorder_->name(),
        "': collective check (FSDP_DEBUG=collectives): ", describe_divergence(by_rank, size()));
  }

  std::shared_ptr<ProcessGroup> inner_;
  c10::intrusive_ptr<c10d::Store> store_;
  ProcessGroupOptions options_;
  bool check_;
  std::shared_ptr<Recorder> recorder_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_recording_group(std::shared_ptr<ProcessGroup> inner,
                                                   c10::intrusive_ptr<c10d::Store> store,
                                                   std::string name,
                                                   const ProcessGroupOptions& options) {
  TORCH_CHECK(options.flight_recorder_entries > 0,
              "fsdp: flight_recorder_entries must be positive, got ",
              options.flight_recorder_entries);
  return std::make_shared<RecordingProcessGroup>(std::move(inner), std::move(store),
                                                 std::move(name), options);
}

}  // namespace fsdp::detail
