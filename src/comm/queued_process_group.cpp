// The queue, the checks and the counters every CPU backend shares (see queued_process_group.h).
//
// Invariants:
// - Every rank issues the same ops in the same order, so queue order is matching order; a
//   backend never needs tags to tell ops apart.
// - Tensors are validated on the caller's thread so that misuse throws where it happened; the
//   progress thread only sees well-formed ops.
// - A Work drops its references to the tensors when it finishes: the caller owns them again
//   once wait() returns, and their storage can go as soon as the caller drops it.
#include "queued_process_group.h"

#include "collective_checks.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <exception>
#include <utility>

namespace fsdp::detail {

class QueuedWork final : public Work {
 public:
  explicit QueuedWork(std::vector<at::Tensor> tensors) : tensors_(std::move(tensors)) {}

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

namespace {

std::exception_ptr error_at(const std::string& message) {
  return std::make_exception_ptr(
      c10::Error({__func__, __FILE__, static_cast<uint32_t>(__LINE__)}, message));
}

}  // namespace

QueuedProcessGroup::QueuedProcessGroup(int rank, int world_size, std::chrono::milliseconds timeout)
    : rank_(rank), size_(world_size), timeout_(timeout) {
  TORCH_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "fsdp: rank ", rank,
              " is outside [0, ", world_size, ")");
  TORCH_CHECK(timeout.count() > 0, "fsdp: the process group timeout must be positive, got ",
              timeout.count(), " ms");
}

QueuedProcessGroup::~QueuedProcessGroup() { stop_progress(); }

void QueuedProcessGroup::start_progress() {
  progress_thread_ = std::thread([this] { progress_loop(); });
}

void QueuedProcessGroup::stop_progress() {
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  if (progress_thread_.joinable()) progress_thread_.join();
}

std::string QueuedProcessGroup::prefix() const { return group_prefix(*this); }

WorkHandle QueuedProcessGroup::all_gather_into_tensor(const at::Tensor& output,
                                                      const at::Tensor& input) {
  check_all_gather_args(*this, output, input);
  const int64_t bytes = output.nbytes();
  update_counters([&](CommCounters& c) {
    c.all_gather.calls += 1;
    c.all_gather.payload_bytes += bytes;
  });
  const int64_t sent = all_gather_sent_bytes(input.nbytes(), size_);
  return enqueue("all_gather_into_tensor", {output, input},
                 [this, output, input, sent](const OpContext& op) {
                   // Our contract is about element counts only, so the bodies get flat views.
                   if (size_ == 1) {
                     output.view(-1).copy_(input.view(-1));
                     return;
                   }
                   run_all_gather(op, output.view(-1), input.view(-1));
                   update_counters([&](CommCounters& c) { c.all_gather.sent_bytes += sent; });
                 });
}

WorkHandle QueuedProcessGroup::reduce_scatter_tensor(const at::Tensor& output,
                                                     const at::Tensor& input, ReduceOp reduce_op) {
  check_reduce_scatter_args(*this, output, input);
  const int64_t bytes = input.nbytes();
  update_counters([&](CommCounters& c) {
    c.reduce_scatter.calls += 1;
    c.reduce_scatter.payload_bytes += bytes;
  });
  const int64_t sent = reduce_scatter_sent_bytes(bytes, size_);
  return enqueue("reduce_scatter_tensor", {output, input},
                 [this, output, input, reduce_op, sent](const OpContext& op) {
                   if (size_ == 1) {
                     output.view(-1).copy_(input.view(-1));  // The average of one is itself.
                     return;
                   }
                   run_reduce_scatter(op, output.view(-1), input.view(-1), reduce_op);
                   update_counters([&](CommCounters& c) { c.reduce_scatter.sent_bytes += sent; });
                 });
}

WorkHandle QueuedProcessGroup::all_reduce(const at::Tensor& tensor, ReduceOp reduce_op) {
  check_all_reduce_args(*this, tensor, reduce_op);
  const int64_t bytes = tensor.nbytes();
  update_counters([&](CommCounters& c) {
    c.all_reduce.calls += 1;
    c.all_reduce.payload_bytes += bytes;
  });
  const int64_t sent = all_reduce_sent_bytes(bytes, size_);
  return enqueue("all_reduce", {tensor}, [this, tensor, reduce_op, sent](const OpContext& op) {
    if (size_ == 1) {
      return;  // The sum, and the average, over one rank is the tensor itself.
    }
    run_all_reduce(op, tensor, reduce_op);
    update_counters([&](CommCounters& c) { c.all_reduce.sent_bytes += sent; });
  });
}

WorkHandle QueuedProcessGroup::broadcast(const at::Tensor& tensor, int root) {
  check_broadcast_args(*this, tensor, root);
  const int64_t bytes = tensor.nbytes();
  update_counters([&](CommCounters& c) {
    c.broadcast.calls += 1;
    c.broadcast.payload_bytes += bytes;
  });
  const int64_t sent = broadcast_sent_bytes(bytes, rank_, root, size_);
  return enqueue("broadcast", {tensor}, [this, tensor, root, sent](const OpContext& op) {
    if (size_ == 1) {
      return;
    }
    run_broadcast(op, tensor, root);
    update_counters([&](CommCounters& c) { c.broadcast.sent_bytes += sent; });
  });
}

WorkHandle QueuedProcessGroup::reduce(const at::Tensor& tensor, int root, ReduceOp reduce_op) {
  check_reduce_args(*this, tensor, root);
  const int64_t bytes = tensor.nbytes();
  update_counters([&](CommCounters& c) {
    c.reduce.calls += 1;
    c.reduce.payload_bytes += bytes;
  });
  const int64_t sent = reduce_sent_bytes(bytes, rank_, root);
  return enqueue("reduce", {tensor}, [this, tensor, root, reduce_op, sent](const OpContext& op) {
    if (size_ == 1) {
      return;
    }
    run_reduce(op, tensor, root, reduce_op);
    update_counters([&](CommCounters& c) { c.reduce.sent_bytes += sent; });
  });
}

WorkHandle QueuedProcessGroup::barrier() {
  return enqueue("barrier", {}, [this](const OpContext& op) {
    if (size_ > 1) run_barrier(op);
  });
}

std::shared_ptr<ProcessGroup> QueuedProcessGroup::split(const std::vector<int>& ranks,
                                                        const std::string& name) {
  const int index = split_index(*this, ranks, name);
  if (index < 0) return nullptr;
  return split_member(ranks, index, name);
}

WorkHandle QueuedProcessGroup::enqueue(const char* name, std::vector<at::Tensor> tensors,
                                       std::function<void(const OpContext&)> body) {
  auto work = std::make_shared<QueuedWork>(std::move(tensors));
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    TORCH_CHECK(broken_error_.empty(), prefix(), name,
                " cannot run: the process group is broken by an earlier error: ", broken_error_);
    queue_.push_back(PendingOp{name, work, std::move(body)});
  }
  queue_cv_.notify_one();
  return work;
}

bool QueuedProcessGroup::next_op(PendingOp& op, std::string& broken) {
  std::unique_lock<std::mutex> lock(queue_mutex_);
  queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
  if (queue_.empty()) {
    return false;  // stopping_ and drained.
  }
  op = std::move(queue_.front());
  queue_.pop_front();
  broken = broken_error_;
  if (stopping_ && broken.empty()) {
    // The caller dropped the group with ops it never waited for; their peers may be gone, so
    // running them could only time out.
    broken = "the process group was destroyed before this op ran";
  }
  return true;
}

// [Note: a finished op holds no tensor]
// An op's body captures its tensors (the all-gather's output, the reduce-scatter's input). The
// body is dropped before the work is marked finished: dropped after, the waiter, woken by the
// finish, could go on and release its own references while the body still held the buffers, so
// that they outlived the wait by a moment that depends on the scheduler. (c10d's gloo worker
// keeps the same kind of moment for its own flat all-gather output, which no change here can
// reach; tests/estimate/'s LargeRootMemory allows for it.)
void QueuedProcessGroup::run_op(PendingOp& op) {
  op.work->start();
  const auto start = Clock::now();
  std::exception_ptr failure;
  try {
    op.body(OpContext{op.name, start + timeout_});
  } catch (const std::exception& e) {
    std::string message = error_message(e);
    // The backends' own errors already carry the prefix; anything else (an ATen error, a
    // library call that threw) gets it here.
    if (message.rfind("fsdp: rank", 0) != 0) {
      message = prefix() + op.name + " failed: " + message;
    }
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      broken_error_ = message;
    }
    failure = error_at(message);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  update_counters([&](CommCounters& c) { c.busy_s += seconds; });
  op.body = nullptr;  // See [Note: a finished op holds no tensor].
  op.work->finish(failure);
}

void QueuedProcessGroup::progress_loop() {
  PendingOp op;
  std::string broken;
  while (next_op(op, broken)) {
    if (broken.empty()) {
      run_op(op);
    } else {
      op.body = nullptr;  // See [Note: a finished op holds no tensor].
      op.work->finish(
          error_at(prefix() + op.name +
                   " cannot run: the process group is broken by an earlier error: " + broken));
    }
    op = PendingOp{};
  }
}

}  // namespace fsdp::detail
