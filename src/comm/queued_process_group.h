// Private to src/comm: what every CPU backend shares. A QueuedProcessGroup checks each call's
// tensors on the caller's thread (collective_checks.h, as every backend does), counts it, and
// queues it for one progress thread that runs the ops one at a time in call order, each against
// a deadline. A backend (gloo, MPI) supplies only the bodies that move the bytes (run_*), for
// groups of two ranks or more: at W = 1 this class answers every collective itself.
//
// Counter conventions (see CommCounters in include/fsdp/comm/process_group.h), the same for
// every backend: calls and payload_bytes are counted when an op is queued; sent_bytes when it
// succeeds, as the bandwidth-optimal ring would send them, whatever algorithm the library picks
// (no backend lets us observe its wire):
//   all_gather:     (W-1) x input bytes = (W-1)/W of the output;
//   reduce_scatter: (W-1)/W of the input (exactly what the gloo backend's own ring sends);
//   all_reduce:     floor(2 (W-1) bytes / W), reduce-scatter then all-gather;
//   broadcast:      the tensor's bytes on the root, 0 elsewhere;
//   reduce:         the tensor's bytes on every rank but the root, 0 on the root.
// barrier is not counted. At W = 1 nothing is sent and sent_bytes stays 0.
//
// The first failed op breaks the group for good (a transport that timed out cannot be trusted
// again): queued ops then fail at once and new calls throw, both quoting the first error.
#pragma once

#include <fsdp/comm/process_group.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::detail {

class QueuedWork;

class QueuedProcessGroup : public ProcessGroup {
 public:
  using Clock = std::chrono::steady_clock;

  // What the progress thread hands an op's body: its name (for messages) and the moment by
  // which it must have finished.
  struct OpContext {
    const char* name;
    Clock::time_point deadline;
  };

  ~QueuedProcessGroup() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  WorkHandle all_gather_into_tensor(const at::Tensor& output, const at::Tensor& input) final;
  WorkHandle reduce_scatter_tensor(const at::Tensor& output, const at::Tensor& input,
                                   ReduceOp op) final;
  WorkHandle all_reduce(const at::Tensor& tensor, ReduceOp op) final;
  WorkHandle broadcast(const at::Tensor& tensor, int root) final;
  WorkHandle reduce(const at::Tensor& tensor, int root, ReduceOp op) final;
  WorkHandle barrier() final;
  std::shared_ptr<ProcessGroup> split(const std::vector<int>& ranks, const std::string& name) final;

 protected:
  QueuedProcessGroup(int rank, int world_size, std::chrono::milliseconds timeout);

  // Starts the progress thread; the derived constructor calls it last, once the bodies' state
  // exists. The derived destructor calls stop_progress() first, before that state goes: the
  // thread runs or fails every queued op, then ends.
  void start_progress();
  void stop_progress();

  // The bodies, run on the progress thread for groups of two ranks or more, on contiguous
  // tensors of this group's device that the caller already checked (matching dtypes and
  // element counts, root in range). Each throws on failure; a message that starts with
  // prefix() is passed on as it is, anything else gets the prefix and the op's name.
  //   run_all_gather: output (flat, W x input's elements) gets every rank's input in rank order.
  //   run_reduce_scatter: output (flat) gets chunk rank() of the reduction of input (flat).
  virtual void run_all_gather(const OpContext& op, const at::Tensor& output,
                              const at::Tensor& input) = 0;
  virtual void run_reduce_scatter(const OpContext& op, const at::Tensor& output,
                                  const at::Tensor& input, ReduceOp reduce_op) = 0;
  virtual void run_all_reduce(const OpContext& op, const at::Tensor& tensor,
                              ReduceOp reduce_op) = 0;
  virtual void run_broadcast(const OpContext& op, const at::Tensor& tensor, int root) = 0;
  // run_reduce: root's tensor gets the reduction; the others' stay as they were.
  virtual void run_reduce(const OpContext& op, const at::Tensor& tensor, int root,
                          ReduceOp reduce_op) = 0;
  virtual void run_barrier(const OpContext& op) = 0;
  // This rank's handle on the subgroup of ranks, in which it is index; only members get here.
  virtual std::shared_ptr<ProcessGroup> split_member(const std::vector<int>& ranks, int index,
                                                     const std::string& name) = 0;

  // Runs body on the progress thread after everything queued before it (for a backend's own
  // setup that must not interleave with collectives, such as creating a communicator).
  WorkHandle enqueue(const char* name, std::vector<at::Tensor> tensors,
                     std::function<void(const OpContext&)> body);

  // "fsdp: rank R of W: ", the start of every message.
  std::string prefix() const;
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct PendingOp {
    const char* name;
    std::shared_ptr<QueuedWork> work;
    std::function<void(const OpContext&)> body;
  };

  void progress_loop();
  // Pops the next op, or returns false when stopping and drained. broken receives why the op
  // must fail without running ("" when it may run).
  bool next_op(PendingOp& op, std::string& broken);
  void run_op(PendingOp& op);

  const int rank_;
  const int size_;
  const std::chrono::milliseconds timeout_;

  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<PendingOp> queue_;
  bool stopping_ = false;
  std::string broken_error_;  // The first failure's message; empty while healthy.
  std::thread progress_thread_;
};

}  // namespace fsdp::detail
