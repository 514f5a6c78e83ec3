// The NCCL backend: fsdp::ProcessGroup over c10d::ProcessGroupNCCL, for the tensors of one CUDA
// device.
//
// Invariants:
// - Ops are issued on the caller's thread, in call order, one at a time per process (see
//   issue_c10d), and return at once: c10d queues each on its NCCL stream after making that
//   stream wait for the caller's current stream, so inputs written there are ready. Every rank
//   issues the same ops in the same order, which is the order NCCL matches them in.
// - A Work's deadline is options.timeout from the issue. wait() polls the op's completion
//   event against it and, when it passes, breaks the group and aborts the communicator, so
//   that the kernels still waiting for a peer end instead of holding the device. The error
//   names the rank, the op, the unit (the CollectiveLabel at the issue) and the timeout, like
//   the gloo and MPI backends'. wait_on_stream() leaves the host free, so the group's
//   StreamWatchdog applies the same deadline to it (see [Note: a deadline for stream-ordered
//   waits]). c10d's own watchdog gets a longer timeout (kWatchdogSlack more), so ours speaks
//   first. The issue itself is held to the same deadline: NCCL may block in it, connecting
//   peers (see [Note: a deadline for the issue]).
// - The first failure breaks the group for good, as for every backend: later calls throw
//   quoting it.
// - Reduce-scatter is NCCL's own (ncclReduceScatter): each rank sends (W-1)/W of the input.
//   kAvg is NCCL's ncclAvg, in the tensor's dtype.
// - Tensors all on the host are staged through the device (see [Note: host tensors over
//   NCCL]); a call mixing devices is refused, naming both.
// - The Work keeps its tensors alive until it completed, so a caller dropping them early does
//   not free memory the NCCL kernel still reads or writes.
#include "nccl_process_group.h"

#include "../bootstrap.h"
#include "../collective_checks.h"
#include "../stream_watchdog.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace fsdp::detail {
namespace {

using Clock = std::chrono::steady_clock;

// How much longer than our deadline c10d's watchdog waits before it declares an op hung (and,
// by its default error handling, ends the process): long enough for wait() to report first.
constexpr auto kWatchdogSlack = std::chrono::seconds(30);
// How often wait() looks at an op's completion event once the op has run past kSpinFor.
constexpr auto kSpinFor = std::chrono::microseconds(100);
constexpr auto kPollInterval = std::chrono::microseconds(50);
// How the messages of our timeouts end, after "... waiting for rank R".
constexpr const char* kWaitAborted = " (the NCCL communicator was aborted)";
constexpr const char* kStreamWaitAborted =
    " (a stream-ordered wait; the fsdp watchdog aborted the NCCL communicator)";
constexpr const char* kIssueAborted =
    " (blocked in NCCL's issue of the op, which connects the peers an algorithm needs on its "
    "first use; the fsdp watchdog aborted the NCCL communicator)";

// Runs fn, a call into c10d that starts an operation, one at a time per process: c10d's flight
// recorder is one per process and registers a group on its first collective without a lock
// (see issue_c10d in ../gloo/gloo_process_group.cpp, where this crashed a test). The calls only
// enqueue work on the device; it still runs concurrently.
template <typename Fn>
auto issue_c10d(Fn&& fn) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  return fn();
}

// What a group and its Works share: the communicator and whether it is broken.
struct NcclState {
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> pg;
  std::string prefix;  // "fsdp: rank R of W: "
  int rank = 0;
  int size = 1;
  std::chrono::milliseconds timeout{0};
  // Owned by the group (it must not outlive the group's thread-safe teardown); Works reach it
  // through here to watch their stream-ordered waits.
  std::weak_ptr<StreamWatchdog> watchdog;
  std::mutex mutex;
  std::string broken;  // The first failure's message; empty while healthy.

  // Records message as the group's first failure and aborts the communicator, so that kernels
  // waiting on a peer end. Returns message, naming the first failure too when there was one
  // before (then the abort that failed this op is that failure's doing).
  std::string fail(std::string message) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!broken.empty()) return message + "; the group was broken before that by: " + broken;
      broken = message;
    }
    // Said before the abort, which waits on NCCL: were it to hang (on a device whose kernels
    // still wait for a peer), the rank would otherwise end without a word.
    std::cerr << message << " (aborting the NCCL communicator)" << std::endl;
    try {
      pg->abort();
    } catch (const std::exception&) {
      // The abort is best effort; the error the caller gets is the op's.
    }
    return message;
  }

  // The first failure's message; empty while healthy.
  std::string broken_by() {
    std::lock_guard<std::mutex> lock(mutex);
    return broken;
  }

  void check_healthy(const char* op) {
    std::lock_guard<std::mutex> lock(mutex);
    TORCH_CHECK(broken.empty(), prefix, op,
                " cannot run: the process group is broken by an earlier error: ", broken);
  }
};

std::exception_ptr error_at(const std::string& message) {
  return std::make_exception_ptr(
      c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message));
}

class NcclWork final : public Work, public std::enable_shared_from_this<NcclWork> {
 public:
  NcclWork(std::shared_ptr<NcclState> state, const char* op, c10::intrusive_ptr<c10d::Work> work,
           std::vector<at::Tensor> tensors, std::function<void()> on_success)
      : state_(std::move(state)),
        op_(op),
        unit_(CollectiveLabel::current()),
        work_(std::move(work)),
        tensors_(std::move(tensors)),
        on_success_(std::move(on_success)),
        deadline_(Clock::now() + state_->timeout) {
    mark_started();
  }

  void wait() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!done_) finish(wait_for_device());
    if (error_) std::rethrow_exception(error_);
  }

  // c10d's wait: the caller's current stream waits for the op's end event; the host goes on
  // (unless TORCH_NCCL_BLOCKING_WAIT is set). The group's watchdog then holds the op to its
  // deadline (see [Note: a deadline for stream-ordered waits]); a later wait() on this Work
  // applies the same deadline itself.
  void wait_on_stream() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (done_) {
      if (error_) std::rethrow_exception(error_);
      return;
    }
    state_->check_healthy(op_);
    try {
      work_->wait();
    } catch (const std::exception& e) {
      finish(error_at(state_->fail(state_->prefix + op_ + " failed: " + error_message(e))));
      std::rethrow_exception(error_);
    }
    watch_once();
  }

  // Lock-free, so that the watchdog's poll never waits behind a wait() on another thread (which
  // holds mutex_ until the op ends or its deadline passes): c10d's isCompleted is thread-safe.
  bool is_completed() override {
    if (done_) return true;
    try {
      return work_->isCompleted();
    } catch (const std::exception&) {
      return true;  // Failed: wait() reports how.
    }
  }

 private:
  // Waits for the op's completion on the device within the deadline; nullptr on success.
  std::exception_ptr wait_for_device() {
    const auto spin_until = Clock::now() + kSpinFor;
    try {
      while (!work_->isCompleted()) {
        const auto now = Clock::now();
        if (now >= deadline_) return timed_out();
        if (now >= spin_until) std::this_thread::sleep_for(kPollInterval);
      }
      // Completed or failed: rethrows c10d's error, and orders the caller's current stream
      // after the op (already finished, so that costs the host nothing).
      work_->wait();
      return nullptr;
    } catch (const std::exception& e) {
      return error_at(state_->fail(state_->prefix + op_ + " failed: " + error_message(e)));
    }
  }

  std::exception_ptr timed_out() {
    return error_at(state_->fail(timeout_message(timed_op(kWaitAborted))));
  }

  // The op as a timeout message names it, ending in how.
  TimedOp timed_op(const char* how) const {
    return TimedOp{state_->prefix,  op_, unit_, timeout_peer(state_->rank, state_->size),
                   state_->timeout, how};
  }

  // Hands this op to the group's watchdog, the first time only. A group already destroyed has
  // no watchdog; its communicator was shut down with it.
  void watch_once() {
    if (watched_) return;
    watched_ = true;
    if (auto watchdog = state_->watchdog.lock()) {
      watchdog->watch(shared_from_this(), timed_op(kStreamWaitAborted), deadline_);
    }
  }

  void finish(std::exception_ptr error) {
    mark_finished();
    done_ = true;
    error_ = std::move(error);
    tensors_.clear();
    if (!error_ && on_success_) on_success_();
  }

  const std::shared_ptr<NcclState> state_;
  const char* const op_;
  const std::string unit_;  // The CollectiveLabel at the issue: the FSDP unit, "" outside one.
  const c10::intrusive_ptr<c10d::Work> work_;
  std::vector<at::Tensor> tensors_;
  const std::function<void()> on_success_;
  const Clock::time_point deadline_;
  std::mutex mutex_;
  std::atomic<bool> done_{false};
  bool watched_ = false;
  std::exception_ptr error_;
};

// [Note: a deadline for the issue]
// NCCL (2.22 and later, NCCL_RUNTIME_CONNECT on by default) connects a communicator's peers for
// an algorithm the first time a collective uses it, on the host, inside the issuing call. A
// peer that never issues that collective leaves the caller blocked in NCCL, where neither
// wait()'s deadline nor the watchdog's can reach it: the first H200 runs saw rank 0 of the
// two-process test stuck there until the test's own limit killed it, our timeout never said.
// So the issue is watched as well: an IssueInFlight, complete once the call has returned, goes
// to the group's watchdog with the op's deadline. Its expiry breaks the group and aborts the
// communicator, which releases the blocked call (NCCL's abort is meant to be called from
// another thread for this); issue() then throws the timeout message.
class IssueInFlight final : public Work {
 public:
  void wait() override {}
  bool is_completed() override { return returned_.load(); }
  void returned() { returned_.store(true); }

 private:
  std::atomic<bool> returned_{false};
};

// [Note: host tensors over NCCL]
// The runtime's agreement collectives (the job's settings, checkpoint metadata, the per-step
// stats, the non-finite report) hold a few int64s on the host, and must run on whatever group
// trains. NCCL moves only device memory, so a call whose tensors are all on the CPU copies them
// to the group's device, runs the op there, waits for it within the deadline, and copies the
// written tensor back: the call returns a Work that has completed. That costs two small copies
// and a host wait, which these calls already pay (they read the result at once); the
// runtime's bulk traffic is on the device and never takes this path. A call that mixes host
// and device tensors, or names another device, is still refused by the argument checks.
class StagedWork final : public Work {
 public:
  explicit StagedWork(const Work& device_op) { copy_times_from(device_op); }
  void wait() override {}
  bool is_completed() override { return true; }
};

bool all_on_host(std::initializer_list<at::Tensor> tensors) {
  return std::all_of(tensors.begin(), tensors.end(),
                     [](const at::Tensor& t) { return t.defined() && t.device().is_cpu(); });
}

// "CUDA_VISIBLE_DEVICES=..." when the environment narrows the devices, for the no-device error.
std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible ? std::string(", with CUDA_VISIBLE_DEVICES='") + visible + "'" : "";
}

class NcclProcessGroup final : public ProcessGroup {
 public:
  NcclProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                   const ProcessGroupOptions& options, c10::DeviceIndex device_index)
      : state_(std::make_shared<NcclState>()),
        store_(store),
        options_(options),
        device_(c10::kCUDA, device_index) {
    state_->prefix =
        "fsdp: rank " + std::to_string(rank) + " of " + std::to_string(world_size) + ": ";
    state_->rank = rank;
    state_->size = world_size;
    state_->timeout = options.timeout;
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout + kWatchdogSlack;
    try {
      state_->pg =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, nccl_options);
      // Connect now, as the other backends do, so that a missing rank or an NCCL set-up error
      // surfaces here, not at the first collective.
      state_->pg->eagerConnectSingleDevice(device_);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, state_->prefix, "NCCL could not connect the ranks on ", device_,
                  " within ", options.timeout.count(), " ms: ", error_message(e));
    }
    watchdog_ = make_watchdog(state_);
    state_->watchdog = watchdog_;
  }

  // The watchdog stops first, so that no abort of its races with the shutdown. A healthy
  // communicator is shut down; a broken one was aborted already.
  ~NcclProcessGroup() override {
    watchdog_.reset();
    try {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (state_->broken.empty()) state_->pg->shutdown();
    } catch (const std::exception&) {
      // Nothing to report to at destruction; the process's next group starts afresh.
    }
  }

  int rank() const override { return state_->rank; }
  int size() const override { return state_->size; }
  c10::Device device() const override { return device_; }
  std::string backend_name() const override { return "nccl"; }

  WorkHandle all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) override {
    if (all_on_host({output, input})) {
      return staged({output, input},
                    [&](const Tensors& d) { return all_gather_into_tensor(d[0], d[1]); });
    }
    check_all_gather_args(*this, output, input);
    const int64_t payload = output.nbytes();
    const int64_t sent = all_gather_sent_bytes(input.nbytes(), size());
    update_counters([&](CommCounters& c) {
      c.all_gather.calls += 1;
      c.all_gather.payload_bytes += payload;
    });
    at::Tensor out = output.view(-1);
    at::Tensor in = input.view(-1);
    return issue(
        "all_gather_into_tensor", {output, input},
        [&] { return state_->pg->_allgather_base(out, in); },
        [this, sent] {
          update_counters([&](CommCounters& c) { c.all_gather.sent_bytes += sent; });
        });
  }

  WorkHandle reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                   ReduceOp op) override {
    if (all_on_host({output, input})) {
      return staged({output, input},
                    [&](const Tensors& d) { return reduce_scatter_tensor(d[0], d[1], op); });
    }
    check_reduce_scatter_args(*this, output, input);
    const int64_t payload = input.nbytes();
    const int64_t sent = reduce_scatter_sent_bytes(payload, size());
    update_counters([&](CommCounters& c) {
      c.reduce_scatter.calls += 1;
      c.reduce_scatter.payload_bytes += payload;
    });
    at::Tensor out = output.view(-1);
    at::Tensor in = input.view(-1);
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d_op(op);
    return issue(
        "reduce_scatter_tensor", {output, input},
        [&] { return state_->pg->_reduce_scatter_base(out, in, opts); },
        [this, sent] {
          update_counters([&](CommCounters& c) { c.reduce_scatter.sent_bytes += sent; });
        });
  }

  WorkHandle all_reduce(const at::Tensor& tensor, ReduceOp op) override {
    if (all_on_host({tensor})) {
      return staged({tensor}, [&](const Tensors& d) { return all_reduce(d[0], op); });
    }
    check_all_reduce_args(*this, tensor, op);
    const int64_t bytes = tensor.nbytes();
    const int64_t sent = all_reduce_sent_bytes(bytes, size());
    update_counters([&](CommCounters& c) {
      c.all_reduce.calls += 1;
      c.all_reduce.payload_bytes += bytes;
    });
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d_op(op);
    return issue(
        "all_reduce", {tensor}, [&] { return state_->pg->allreduce(tensors, opts); },
        [this, sent] {
          update_counters([&](CommCounters& c) { c.all_reduce.sent_bytes += sent; });
        });
  }

  WorkHandle broadcast(const at::Tensor& tensor, int root) override {
    if (all_on_host({tensor})) {
      return staged({tensor}, [&](const Tensors& d) { return broadcast(d[0], root); });
    }
    check_broadcast_args(*this, tensor, root);
    const int64_t bytes = tensor.nbytes();
    const int64_t sent = broadcast_sent_bytes(bytes, rank(), root, size());
    update_counters([&](CommCounters& c) {
      c.broadcast.calls += 1;
      c.broadcast.payload_bytes += bytes;
    });
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    return issue(
        "broadcast", {tensor}, [&] { return state_->pg->broadcast(tensors, opts); },
        [this, sent] {
          update_counters([&](CommCounters& c) { c.broadcast.sent_bytes += sent; });
        });
  }

  // ncclReduce reads the non-roots' buffers and writes only the root's, as our contract asks.
  WorkHandle reduce(const at::Tensor& tensor, int root, ReduceOp op) override {
    if (all_on_host({tensor})) {
      return staged({tensor}, [&](const Tensors& d) { return reduce(d[0], root, op); });
    }
    check_reduce_args(*this, tensor, root);
    const int64_t bytes = tensor.nbytes();
    const int64_t sent = reduce_sent_bytes(bytes, rank(), root);
    update_counters([&](CommCounters& c) {
      c.reduce.calls += 1;
      c.reduce.payload_bytes += bytes;
    });
    std::vector<at::Tensor> tensors{tensor};
    c10d::ReduceOptions opts;
    opts.reduceOp = c10d_op(op);
    opts.rootRank = root;
    opts.rootTensor = 0;
    return issue(
        "reduce", {tensor}, [&] { return state_->pg->reduce(tensors, opts); },
        [this, sent] { update_counters([&](CommCounters& c) { c.reduce.sent_bytes += sent; }); });
  }

  // An all-reduce of one element on this group's device: it completes on a rank only once every
  // rank has joined it. (c10d's barrier guesses the device; this one knows it.)
  WorkHandle barrier() override {
    std::vector<at::Tensor> tensors{at::zeros({1}, at::TensorOptions(device_).dtype(at::kFloat))};
    return issue(
        "barrier", tensors, [&] { return state_->pg->allreduce(tensors); }, nullptr);
  }

  // Each subgroup is a communicator of its own, formed over its members' part of the store.
  std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks,
                                      const std::string& name) override {
    const int index = split_index(*this, ranks, name);
    if (index < 0) return nullptr;
    const int size = static_cast<int>(ranks.size());
    return std::make_shared<NcclProcessGroup>(
        join_subgroup(store_, name, index, size, "nccl", options_.timeout), index, size, options_,
        device_.index());
  }

 private:
  // Its expiry breaks the group with our message, so the next call here throws it, and aborts
  // the communicator. The host may not call the group again for a while (or at all, after a
  // last step), so the message goes to stderr at once as well: fail() writes it there.
  static std::shared_ptr<StreamWatchdog> make_watchdog(const std::shared_ptr<NcclState>& state) {
    return std::make_shared<StreamWatchdog>(
        [state](const std::string& message) { state->fail(message); });
  }

  static c10d::ReduceOp c10d_op(ReduceOp op) {
    return op == ReduceOp::kAvg ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  }

  using Tensors = std::vector<at::Tensor>;

  // Runs op on device copies of host (all on the CPU), waits for it, and copies the first
  // tensor, the one every op writes, back (see [Note: host tensors over NCCL]).
  WorkHandle staged(const Tensors& host, const std::function<WorkHandle(const Tensors&)>& op) {
    Tensors on_device;
    on_device.reserve(host.size());
    for (const at::Tensor& t : host) on_device.push_back(t.to(device_));
    WorkHandle work = op(on_device);
    work->wait();
    host[0].copy_(on_device[0]);
    return std::make_shared<StagedWork>(*work);
  }

  // Starts op with start() and returns its Work; on_success runs when a wait() saw it succeed.
  WorkHandle issue(const char* op, std::vector<at::Tensor> tensors,
                   const std::function<c10::intrusive_ptr<c10d::Work>()>& start,
                   std::function<void()> on_success) {
    state_->check_healthy(op);
    // Watched while it runs (see [Note: a deadline for the issue]).
    auto in_flight = std::make_shared<IssueInFlight>();
    watchdog_->watch(
        in_flight,
        TimedOp{state_->prefix, op, CollectiveLabel::current(),
                timeout_peer(state_->rank, state_->size), state_->timeout, kIssueAborted},
        Clock::now() + state_->timeout);
    c10::intrusive_ptr<c10d::Work> work;
    try {
      work = issue_c10d(start);
    } catch (const std::exception& e) {
      in_flight->returned();
      TORCH_CHECK(false,
                  state_->fail(state_->prefix + op + " failed to start: " + error_message(e)));
    }
    in_flight->returned();
    // The watchdog's abort released a blocked issue: its message is the op's error.
    const std::string broken_by = state_->broken_by();
    TORCH_CHECK(broken_by.empty(), broken_by);
    return std::make_shared<NcclWork>(state_, op, std::move(work), std::move(tensors),
                                      std::move(on_success));
  }

  const std::shared_ptr<NcclState> state_;
  std::shared_ptr<StreamWatchdog> watchdog_;     // Shared only so Works can reach it weakly.
  const c10::intrusive_ptr<c10d::Store> store_;  // Where subgroups meet; a TCPStore server
                                                 // must outlive the group.
  const ProcessGroupOptions options_;            // For the groups split from this one.
  const c10::Device device_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_nccl_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int world_size,
                                                      const ProcessGroupOptions& options) {
  TORCH_CHECK(store, "fsdp: make_nccl_process_group needs a store, got null");
  TORCH_CHECK(!options.cuda_device || *options.cuda_device >= 0, "fsdp: rank ", rank, " of ",
              world_size, ": ProcessGroupOptions::cuda_device must not be negative, got ",
              *options.cuda_device);
  const c10::DeviceIndex devices = c10::cuda::device_count();
  TORCH_CHECK(devices > 0, "fsdp: rank ", rank, " of ", world_size,
              ": the nccl backend moves CUDA tensors, but this process sees no CUDA device "
              "(c10::cuda::device_count() is 0",
              visible_devices_note(), "); use the gloo backend to train on the CPU");
  const auto device = options.cuda_device
                          ? static_cast<c10::DeviceIndex>(*options.cuda_device % devices)
                          : c10::cuda::current_device();
  return std::make_shared<NcclProcessGroup>(store, rank, world_size, options, device);
}

}  // namespace fsdp::detail
