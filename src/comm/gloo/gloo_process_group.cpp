// The gloo backend: fsdp::ProcessGroup over c10d::ProcessGroupGloo, for CPU tensors.
//
// Invariants:
// - One progress thread per group runs the queued ops one at a time in call order. Every rank
//   issues the same ops in the same order, so queue order is matching order, and the tags our
//   ring draws from p2p_tag_ agree across ranks without any exchange.
// - An op runs against a deadline of options.timeout from the moment it starts. Each wait on
//   c10d gets what is left of it (never 0, which c10d reads as "no timeout").
// - The first failed op breaks the group for good: gloo tears down every pair of the context on
//   a timeout, so nothing sent afterwards could be trusted. Queued ops then fail at once, and new
//   calls throw, both quoting the first error.
// - reduce_scatter_tensor is our own ring over send/recv, because c10d's gloo reduce-scatter is
//   an all-reduce in disguise (twice the traffic). It never writes the caller's input.
// - Tensors are validated on the caller's thread so that misuse throws where it happened; the
//   progress thread only sees well-formed ops.
#include "gloo_process_group.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <utility>
#include <vector>
#include "../bootstrap.h"

namespace fsdp::detail {
namespace {

using Clock = std::chrono::steady_clock;

// c10d send/recv tags must be non-negative ints; wrapping long before INT_MAX is safe because
// only one op is in flight per group and each op uses at most W-1 consecutive tags.
constexpr int kTagWrap = 1 << 30;

bool mentions_timeout(const std::string& message) {
  std::string lower = message;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower.find("timed out") != std::string::npos || lower.find("timeout") != std::string::npos;
}

// Ranks as threads leave the hostname empty: they all live on this host's loopback.
std::string transport_hostname(const ProcessGroupOptions& options) {
  return options.hostname.empty() ? "127.0.0.1" : options.hostname;
}

class GlooWork final : public Work {
 public:
  explicit GlooWork(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {}

  void wait() override {
    std::unique_lock<std::mutex> lock(mutex_);
    done_cv_.wait(lock, [&] { return done_; });
    if (error_) {
      std::rethrow_exception(error_);
    }
  }

  bool is_completed() override {
    std::lock_guard<std::mutex> lock(mutex_);
    return done_;
  }

  void start() { mark_started(); }

  void finish(std::exception_ptr error) {
    mark_finished();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
      error_ = std::move(error);
      // The caller owns the tensors again once wait() returns; dropping our references here
      // lets their storage go as soon as the caller drops theirs.
      tensors_.clear();
    }
    done_cv_.notify_all();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
  std::vector<at::Tensor> tensors_;
};

// Runs fn, a call into c10d's ProcessGroupGloo that starts an operation, one at a time per
// process. c10d's flight recorder is one per process, and on a group's first collective it
// adds the group to a map without holding its lock (PyTorch 2.11,
// FlightRecorder::recordWithResetEnabled; every later call reads that map unlocked too). Two
// groups issuing collectives from different threads at once, which happens whenever a process
// has several groups (ranks as threads, HSDP, hpZ), could corrupt the map: a test crashed with
// SIGSEGV inside it. The calls only enqueue; the collectives still run and complete
// concurrently.
template <typename Fn>
auto issue_c10d(Fn&& fn) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  return fn();
}

class GlooProcessGroup final : public ProcessGroup {
 public:
  GlooProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                   const ProcessGroupOptions& options)
      : store_(store),
        options_(options),
        rank_(rank),
        size_(world_size),
        timeout_(options.timeout) {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout_);
    // One c10d worker thread: our progress thread already serializes ops, so more would only
    // idle.
    gloo_options->threads = 1;
    try {
      gloo_options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(transport_hostname(options)));
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank_, size_, gloo_options);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, prefix(), "gloo could not connect to the other ranks on hostname '",
                  transport_hostname(options), "' within ", timeout_.count(),
                  " ms: ", error_message(e));
    }
    progress_thread_ = std::thread([this] { progress_loop(); });
  }

  ~GlooProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stopping_ = true;
    }
    queue_cv_.notify_all();
    progress_thread_.join();
    // pg_ goes after the thread: nothing can be using it any more. Its destructor closes the
    // pairs, which peers still waiting on us see as an error rather than a hang.
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::string backend_name() const override { return "gloo"; }

  WorkHandle all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) override {
    static constexpr const char* kOp = "all_gather_into_tensor";
    check_tensor(kOp, "output", output);
    check_tensor(kOp, "input", input);
    check_same_dtype(kOp, output, input);
    TORCH_CHECK(output.numel() == size_ * input.numel(), prefix(), kOp, ": output has ",
                output.numel(), " elements (sizes ", output.sizes(), ") but ", size_,
                " ranks x input of ", input.numel(), " elements (sizes ", input.sizes(), ") need ",
                size_ * input.numel());
    const int64_t bytes = output.nbytes();
    update_counters([&](CommCounters& c) {
      c.all_gather.calls += 1;
      c.all_gather.payload_bytes += bytes;
    });
    const int64_t sent = static_cast<int64_t>(input.nbytes()) * (size_ - 1);
    return enqueue(kOp, {output, input}, [this, output, input, sent](const OpContext& op) {
      if (size_ == 1) {
        output.view(-1).copy_(input.view(-1));
        return;
      }
      // c10d checks output.chunk(W)[i] against input's shape; our contract is about element
      // counts only, so hand it flat views.
      at::Tensor out = output.view(-1);
      at::Tensor in = input.view(-1);
      wait_c10d(issue_c10d([&] { return pg_->_allgather_base(out, in); }), op, -1);
      update_counters([&](CommCounters& c) { c.all_gather.sent_bytes += sent; });
    });
  }

  WorkHandle reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                   ReduceOp reduce_op) override {
    static constexpr const char* kOp = "reduce_scatter_tensor";
    check_tensor(kOp, "output", output);
    check_tensor(kOp, "input", input);
    check_same_dtype(kOp, output, input);
    const auto dtype = input.scalar_type();
    TORCH_CHECK(
        dtype == at::kFloat || dtype == at::kDouble || dtype == at::kBFloat16 || dtype == at::kHalf,
        prefix(), kOp, ": the gloo backend reduces Float, Double, BFloat16 and Half, got ", dtype);
    TORCH_CHECK(input.numel() == size_ * output.numel(), prefix(), kOp, ": input has ",
                input.numel(), " elements (sizes ", input.sizes(), ") but ", size_,
                " ranks x output of ", output.numel(), " elements (sizes ", output.sizes(),
                ") need ", size_ * output.numel());
    const int64_t bytes = input.nbytes();
    update_counters([&](CommCounters& c) {
      c.reduce_scatter.calls += 1;
      c.reduce_scatter.payload_bytes += bytes;
    });
    return enqueue(kOp, {output, input}, [this, output, input, reduce_op](const OpContext& op) {
      ring_reduce_scatter(op, output.view(-1), input.view(-1), reduce_op);
    });
  }

  WorkHandle all_reduce(const at::Tensor& tensor, ReduceOp reduce_op) override {
    static constexpr const char* kOp = "all_reduce";
    check_tensor(kOp, "tensor", tensor);
    TORCH_CHECK(reduce_op != ReduceOp::kAvg || at::isFloatingType(tensor.scalar_type()), prefix(),
                kOp, ": kAvg needs a floating point tensor, got ", tensor.scalar_type());
    const int64_t bytes = tensor.nbytes();
    update_counters([&](CommCounters& c) {
      c.all_reduce.calls += 1;
      c.all_reduce.payload_bytes += bytes;
    });
    const int64_t sent = 2 * (size_ - 1) * bytes / size_;
    return enqueue(kOp, {tensor}, [this, tensor, reduce_op, sent](const OpContext& op) {
      if (size_ == 1) {
        return;  // The sum, and the average, over one rank is the tensor itself.
      }
      std::vector<at::Tensor> tensors{tensor};
      c10d::AllreduceOptions opts;
      opts.reduceOp = c10d::ReduceOp::SUM;  // gloo has no AVG; we divide below.
      wait_c10d(issue_c10d([&] { return pg_->allreduce(tensors, opts); }), op, -1);
      if (reduce_op == ReduceOp::kAvg) {
        tensor.div_(size_);
      }
      update_counters([&](CommCounters& c) { c.all_reduce.sent_bytes += sent; });
    });
  }

  WorkHandle broadcast(const at::Tensor& tensor, int root) override {
    static constexpr const char* kOp = "broadcast";
    check_tensor(kOp, "tensor", tensor);
    TORCH_CHECK(root >= 0 && root < size_, prefix(), kOp, ": root ", root,
                " is not a rank of a group of ", size_);
    const int64_t bytes = tensor.nbytes();
    update_counters([&](CommCounters& c) {
      c.broadcast.calls += 1;
      c.broadcast.payload_bytes += bytes;
    });
    const int64_t sent = root == rank_ ? bytes : 0;
    return enqueue(kOp, {tensor}, [this, tensor, root, sent](const OpContext& op) {
      if (size_ == 1) {
        return;
      }
      std::vector<at::Tensor> tensors{tensor};
      c10d::BroadcastOptions opts;
      opts.rootRank = root;
      opts.rootTensor = 0;
      wait_c10d(issue_c10d([&] { return pg_->broadcast(tensors, opts); }), op,
                root == rank_ ? -1 : root);
      update_counters([&](CommCounters& c) { c.broadcast.sent_bytes += sent; });
    });
  }

  WorkHandle barrier() override {
    static constexpr const char* kOp = "barrier";
    return enqueue(kOp, {}, [this](const OpContext& op) {
      if (size_ == 1) {
        return;
      }
      wait_c10d(issue_c10d([&] { return pg_->barrier(); }), op, -1);
    });
  }

  std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks,
                                      const std::string& name) override {
    TORCH_CHECK(!ranks.empty(), prefix(), "split '", name, "': no ranks given");
    std::vector<bool> seen(size_, false);
    int index = -1;
    for (size_t i = 0; i < ranks.size(); ++i) {
      const int r = ranks[i];
      TORCH_CHECK(r >= 0 && r < size_, prefix(), "split '", name, "': rank ", r,
                  " is outside this group of ", size_);
      TORCH_CHECK(!seen[r], prefix(), "split '", name, "': rank ", r, " is listed twice");
      seen[r] = true;
      if (r == rank_) index = static_cast<int>(i);
    }
    if (index < 0) return nullptr;
    // The subgroup rendezvouses on its own key space of this group's store.
    auto store = c10::make_intrusive<c10d::PrefixStore>("split/" + name, store_);
    const int size = static_cast<int>(ranks.size());
    const std::string base = join_ranks(*store, index, size, options_.timeout);
    return make_gloo_process_group(c10::make_intrusive<c10d::PrefixStore>(base + "gloo", store),
                                   index, size, options_);
  }

 private:
  struct OpContext {
    const char* name;
    Clock::time_point deadline;
  };
  struct PendingOp {
    const char* name;
    std::shared_ptr<GlooWork> work;
    std::function<void(const OpContext&)> body;
  };

  std::string prefix() const {
    std::ostringstream out;
    out << "fsdp: rank " << rank_ << " of " << size_ << ": ";
    return out.str();
  }

  void check_tensor(const char* op, const char* what, const at::Tensor& t) const {
    TORCH_CHECK(t.defined(), prefix(), op, ": ", what, " is an undefined tensor");
    TORCH_CHECK(t.device().is_cpu(), prefix(), op, ": the gloo backend moves CPU tensors, but ",
                what, " is on ", t.device());
    TORCH_CHECK(t.is_contiguous(), prefix(), op, ": ", what, " (sizes ", t.sizes(), ", strides ",
                t.strides(), ") must be contiguous");
  }

  void check_same_dtype(const char* op, const at::Tensor& output, const at::Tensor& input) const {
    TORCH_CHECK(output.scalar_type() == input.scalar_type(), prefix(), op, ": output is ",
                output.scalar_type(), " but input is ", input.scalar_type());
  }

  WorkHandle enqueue(const char* name, std::vector<at::Tensor> tensors,
                     std::function<void(const OpContext&)> body) {
    auto work = std::make_shared<GlooWork>(std::move(tensors));
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      TORCH_CHECK(broken_error_.empty(), prefix(), name,
                  " cannot run: the process group is broken by an earlier error: ", broken_error_);
      queue_.push_back(PendingOp{name, work, std::move(body)});
    }
    queue_cv_.notify_one();
    return work;
  }

  void progress_loop() {
    while (true) {
      PendingOp op;
      std::string broken;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        if (queue_.empty()) {
          return;  // stopping_ and drained.
        }
        op = std::move(queue_.front());
        queue_.pop_front();
        broken = broken_error_;
        if (stopping_ && broken.empty()) {
          // The caller dropped the group with ops it never waited for; their peers may be gone,
          // so running them could only time out.
          broken = "the process group was destroyed before this op ran";
        }
      }
      if (!broken.empty()) {
        op.work->finish(std::make_exception_ptr(c10::Error(
            {__func__, __FILE__, static_cast<uint32_t>(__LINE__)},
            prefix() + op.name +
                " cannot run: the process group is broken by an earlier error: " + broken)));
        continue;
      }
      std::exception_ptr error;
      op.work->start();
      try {
        op.body(OpContext{op.name, Clock::now() + timeout_});
      } catch (const std::exception& e) {
        std::string message = error_message(e);
        // Errors from wait_c10d already carry the prefix; anything else (a c10d call that threw
        // before returning a Work, an ATen error) gets it here.
        if (message.rfind("fsdp: rank", 0) != 0) {
          message = prefix() + op.name + " failed: " + message;
        }
        {
          std::lock_guard<std::mutex> lock(queue_mutex_);
          broken_error_ = message;
        }
        error = std::make_exception_ptr(
            c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message));
      }
      op.work->finish(error);
    }
  }

  // Waits for a c10d work within what is left of op's deadline; on failure throws an error that
  // names this rank, the op, the peer (peer < 0: unknown, unless W = 2) and the timeout.
  void wait_c10d(const c10::intrusive_ptr<c10d::Work>& work, const OpContext& op, int peer) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(op.deadline - Clock::now());
    const auto budget = std::max(left, std::chrono::milliseconds(1));
    std::string detail;
    try {
      if (work->wait(budget)) {
        return;
      }
      detail = "the operation was aborted";
    } catch (const std::exception& e) {
      detail = error_message(e);
    }
    if (peer < 0 && size_ == 2) {
      peer = 1 - rank_;
    }
    const std::string whom = peer >= 0 ? "rank " + std::to_string(peer) : "another rank";
    if (mentions_timeout(detail)) {
      TORCH_CHECK(false, prefix(), op.name, " timed out after ", timeout_.count(),
                  " ms waiting for ", whom, " (", detail, ")");
    }
    TORCH_CHECK(false, prefix(), op.name, " failed waiting for ", whom, ": ", detail);
  }

  int next_tag() {
    const int tag = p2p_tag_;
    p2p_tag_ = (p2p_tag_ + 1) % kTagWrap;
    return tag;
  }

  // Ring reduce-scatter over W ranks, in W-1 steps. At step s rank r sends chunk (r-s-1) mod W,
  // its running partial sum of that chunk (its own input chunk at s = 0), to rank r+1, receives
  // chunk (r-s-2) mod W from rank r-1 and adds its own contribution. After step W-2 the chunk
  // received is chunk r with all W contributions. Each rank sends W-1 chunks: (W-1)/W of input.
  //
  // Bytes on the wire are in the tensor's dtype. For BFloat16 and Half each hop adds in float32
  // and rounds once, so the result carries W-1 roundings, like NCCL's ring; sending float32
  // partials would double the traffic. kAvg divides by W before the final rounding.
  void ring_reduce_scatter(const OpContext& op, at::Tensor output, const at::Tensor& input,
                           ReduceOp reduce_op) {
    const int64_t n = output.numel();
    auto chunk = [&](int64_t c) { return input.narrow(0, c * n, n); };
    if (size_ == 1) {
      output.copy_(input);  // The average over one rank is the value itself.
      return;
    }
    const bool widen = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
    const int right = (rank_ + 1) % size_;
    const int left = (rank_ + size_ - 1) % size_;
    const int64_t chunk_bytes = n * static_cast<int64_t>(input.element_size());

    at::Tensor send_buf = chunk((rank_ + size_ - 1) % size_);  // read only, never written
    at::Tensor partial = at::empty({n}, input.options());
    at::Tensor recv_buf = at::empty({n}, input.options());
    for (int step = 0; step < size_ - 1; ++step) {
      const int tag = next_tag();
      std::vector<at::Tensor> send_tensors{send_buf};
      std::vector<at::Tensor> recv_tensors{recv_buf};
      auto send_work = issue_c10d([&] { return pg_->send(send_tensors, right, tag); });
      auto recv_work = issue_c10d([&] { return pg_->recv(recv_tensors, left, tag); });
      wait_c10d(send_work, op, right);
      wait_c10d(recv_work, op, left);
      update_counters([&](CommCounters& c) { c.reduce_scatter.sent_bytes += chunk_bytes; });

      const int64_t received = ((rank_ - step - 2) % size_ + size_) % size_;
      const bool last = step == size_ - 2;
      TORCH_INTERNAL_ASSERT(!last || received == rank_, "ring ended on chunk ", received,
                            " at rank ", rank_);
      at::Tensor mine = chunk(received);
      if (!last) {
        // Both sends of this step completed, so partial is free to be overwritten.
        if (widen) {
          partial.copy_(recv_buf.to(at::kFloat).add_(mine.to(at::kFloat)));
        } else {
          at::add_out(partial, recv_buf, mine);
        }
        send_buf = partial;
        continue;
      }
      if (widen) {
        at::Tensor sum = recv_buf.to(at::kFloat).add_(mine.to(at::kFloat));
        if (reduce_op == ReduceOp::kAvg) {
          sum.div_(size_);
        }
        output.copy_(sum);
      } else {
        at::add_out(output, recv_buf, mine);
        if (reduce_op == ReduceOp::kAvg) {
          output.div_(size_);
        }
      }
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;  // Kept: a TCPStore server must outlive the group.
  ProcessGroupOptions options_;            // for the groups split from this one
  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int p2p_tag_ = 0;  // Only touched by the progress thread.

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<PendingOp> queue_;
  bool stopping_ = false;
  std::string broken_error_;  // The first failure's message; empty while healthy.
  std::thread progress_thread_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int world_size,
                                                      const ProcessGroupOptions& options) {
  TORCH_CHECK(store, "fsdp: make_gloo_process_group needs a store, got null");
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size,
              "fsdp: make_gloo_process_group: rank ", rank, " is outside [0, ", world_size, ")");
  TORCH_CHECK(options.timeout.count() > 0, "fsdp: the process group timeout must be positive, got ",
              options.timeout.count(), " ms");
  return std::make_shared<GlooProcessGroup>(store, rank, world_size, options);
}

}  // namespace fsdp::detail
