// The gloo backend: fsdp::ProcessGroup over c10d::ProcessGroupGloo, for CPU tensors.
//
// The queue, the checks, the counters and the W = 1 answers are QueuedProcessGroup's. Here:
// - The ops run one at a time on the base's progress thread, in the same order on every rank,
//   so the tags our ring draws from p2p_tag_ agree across ranks without any exchange.
// - An op runs against a deadline of options.timeout from the moment it starts. Each wait on
//   c10d gets what is left of it (never 0, which c10d reads as "no timeout"). gloo tears down
//   every pair of the context on a timeout, which is why the base breaks the group for good.
// - reduce_scatter_tensor is our own ring over send/recv, because c10d's gloo reduce-scatter is
//   an all-reduce in disguise (twice the traffic). It never writes the caller's input.
// - all_reduce of 64 KiB and more is our own ring too ([Note: gloo's all-reduce as a ring of our
//   own]); smaller ones, latency-bound, stay c10d's. So is all_gather from 64 KiB of output
//   ([Note: gloo's receive before its send]), and every ring step posts its receive first.
#include "gloo_process_group.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>
#include "../bootstrap.h"
#include "../queued_process_group.h"

namespace fsdp::detail {
namespace {

// c10d send/recv tags must be non-negative ints; wrapping long before INT_MAX is safe because
// only one op is in flight per group and each op uses at most W-1 consecutive tags.
constexpr int kTagWrap = 1 << 30;

// From this size up, all_reduce is our ring ([Note: gloo's all-reduce as a ring of our own]).
constexpr int64_t kRingAllReduceMinBytes = int64_t{64} << 10;
// From this output size up, all_gather is our ring ([Note: gloo's receive before its send]).
constexpr int64_t kRingAllGatherMinBytes = int64_t{64} << 10;

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

class GlooProcessGroup final : public QueuedProcessGroup {
 public:
  GlooProcessGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                   const ProcessGroupOptions& options)
      : QueuedProcessGroup(rank, world_size, options.timeout), store_(store), options_(options) {
    auto gloo_options = c10d::ProcessGroupGloo::Options::create(timeout());
    // One c10d worker thread: our progress thread already serializes ops, so more would only
    // idle.
    gloo_options->threads = 1;
    try {
      gloo_options->devices.push_back(
          c10d::ProcessGroupGloo::createDeviceForHostname(transport_hostname(options)));
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, rank, world_size, gloo_options);
    } catch (const std::exception& e) {
      TORCH_CHECK(false, prefix(), "gloo could not connect to the other ranks on hostname '",
                  transport_hostname(options), "' within ", timeout().count(),
                  " ms: ", error_message(e));
    }
    start_progress();
  }

  // pg_ goes after the progress thread: nothing can be using it any more. Its destructor closes
  // the pairs, which peers still waiting on us see as an error rather than a hang.
  ~GlooProcessGroup() override { stop_progress(); }

  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::string backend_name() const override { return "gloo"; }

 private:
  void run_all_gather(const OpContext& op, const at::Tensor& output,
                      const at::Tensor& input) override {
    if (output.nbytes() >= kRingAllGatherMinBytes) {
      ring_all_gather(op, output, input.reshape(-1));
      return;
    }
    at::Tensor out = output;
    at::Tensor in = input;
    wait_c10d(issue_c10d([&] { return pg_->_allgather_base(out, in); }), op, -1);
  }

  void run_reduce_scatter(const OpContext& op, const at::Tensor& output, const at::Tensor& input,
                          ReduceOp reduce_op) override {
    ring_reduce_scatter(op, output, input, reduce_op);
  }

  void run_all_reduce(const OpContext& op, const at::Tensor& tensor, ReduceOp reduce_op) override {
    if (tensor.nbytes() >= kRingAllReduceMinBytes && tensor.is_floating_point()) {
      ring_all_reduce(op, tensor.view(-1), reduce_op);
      return;
    }
    std::vector<at::Tensor> tensors{tensor};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;  // gloo has no AVG; we divide below.
    wait_c10d(issue_c10d([&] { return pg_->allreduce(tensors, opts); }), op, -1);
    if (reduce_op == ReduceOp::kAvg) {
      tensor.div_(size());
    }
  }

  void run_broadcast(const OpContext& op, const at::Tensor& tensor, int root) override {
    std::vector<at::Tensor> tensors{tensor};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.rootTensor = 0;
    wait_c10d(issue_c10d([&] { return pg_->broadcast(tensors, opts); }), op,
              root == rank() ? -1 : root);
  }

  // c10d's gloo reduce may leave partial sums in the non-roots' tensors, which our contract
  // says stay untouched: they reduce a copy.
  void run_reduce(const OpContext& op, const at::Tensor& tensor, int root,
                  ReduceOp reduce_op) override {
    std::vector<at::Tensor> tensors{root == rank() ? tensor : tensor.clone()};
    c10d::ReduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.rootRank = root;
    opts.rootTensor = 0;
    wait_c10d(issue_c10d([&] { return pg_->reduce(tensors, opts); }), op,
              root == rank() ? -1 : root);
    if (root == rank() && reduce_op == ReduceOp::kAvg) tensor.div_(size());
  }

  void run_barrier(const OpContext& op) override {
    wait_c10d(issue_c10d([&] { return pg_->barrier(); }), op, -1);
  }

  std::shared_ptr<ProcessGroup> split_member(const std::vector<int>& ranks, int index,
                                             const std::string& name) override {
    // The subgroup rendezvouses on its own key space of this group's store.
    const int size = static_cast<int>(ranks.size());
    return make_gloo_process_group(
        join_subgroup(store_, name, index, size, "gloo", options_.timeout), index, size, options_);
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
    if (peer < 0 && size() == 2) {
      peer = 1 - rank();
    }
    const std::string whom = peer >= 0 ? "rank " + std::to_string(peer) : "another rank";
    if (mentions_timeout(detail)) {
      TORCH_CHECK(false, prefix(), op.name, " timed out after ", timeout().count(),
                  " ms waiting for ", whom, " (", detail, ")");
    }
    TORCH_CHECK(false, prefix(), op.name, " failed waiting for ", whom, ": ", detail);
  }

  int next_tag() {
    const int tag = p2p_tag_;
    p2p_tag_ = (p2p_tag_ + 1) % kTagWrap;
    return tag;
  }

  // [Note: gloo's receive before its send]
  // gloo's TCP transport moves a send's bytes only after the receiver has said it posted the
  // matching receive (a small "ready to receive" message), and a pair sends its messages in the
  // order they were queued. At W = 2 both ring neighbours are the same peer over one connection:
  // posting the send first, each rank's "ready" for the peer's bytes could queue behind its own
  // payload, so the two directions took turns. Over the 1 Gbit/s link of bench/cluster an 8 MB
  // exchange took 136 ms that way (62 MB/s each way) and 75 ms with the receive posted first
  // (112 MB/s; one direction alone, 70 ms). gloo's own all-gather posts as the first did (16 MB:
  // 108 ms against our ring's 73 ms), so from kRingAllGatherMinBytes the all-gather is a ring
  // over exchange too. On one host both orders run at memory speed.
  //
  // One ring step: sends `send` to rank r+1 while receiving `recv` from rank r-1 (each skipped
  // when empty: both ends derive the same sizes). The receive is posted first: [Note: gloo's
  // receive before its send].
  void exchange(const OpContext& op, const at::Tensor& send, const at::Tensor& recv) {
    const int right = (rank() + 1) % size();
    const int left = (rank() + size() - 1) % size();
    const int tag = next_tag();
    std::vector<at::Tensor> send_tensors{send};
    std::vector<at::Tensor> recv_tensors{recv};
    c10::intrusive_ptr<c10d::Work> send_work, recv_work;
    if (recv.numel() > 0)
      recv_work = issue_c10d([&] { return pg_->recv(recv_tensors, left, tag); });
    if (send.numel() > 0)
      send_work = issue_c10d([&] { return pg_->send(send_tensors, right, tag); });
    if (send_work) wait_c10d(send_work, op, right);
    if (recv_work) wait_c10d(recv_work, op, left);
  }

  // [Note: gloo's all-reduce as a ring of our own]
  // c10d's gloo all-reduce of 1 MiB over two ranks of this 2-core machine takes either about
  // 0.9 ms or 3-4 ms per call, varying from run to run (fsdp-comm-bench, bench/RESULTS.md),
  // while a ring over c10d's send and recv moves the same bytes in a steady 0.8 ms. Tensor
  // parallelism waits for an all-reduce inside every layer, and HSDP and no_shard reduce
  // gradients with one, so from kRingAllReduceMinBytes up the all-reduce is a ring: a
  // reduce-scatter of W chunks (chunk c: elements [c N / W, (c + 1) N / W)) in the schedule of
  // ring_reduce_scatter below, each chunk summed from rank c + 1 around to its owner c and kept
  // in place, then a ring all-gather of the owners' chunks straight into the tensor. Every rank
  // ends with the owner's bits of every chunk. Each rank sends 2 (W-1)/W of the tensor, as
  // gloo's ring does. BFloat16 and Half add each hop in float32 and round once.
  void ring_all_reduce(const OpContext& op, const at::Tensor& flat, ReduceOp reduce_op) {
    const int w = size();
    const int64_t n = flat.numel();
    auto chunk = [&](int c) { return ring_chunk(flat, c); };
    const bool widen = flat.scalar_type() == at::kBFloat16 || flat.scalar_type() == at::kHalf;
    at::Tensor landing = at::empty({(n + w - 1) / w}, flat.options());
    for (int s = 0; s < w - 1; ++s) {
      const at::Tensor mine = chunk(rank() - s - 2);
      const at::Tensor got = landing.narrow(0, 0, mine.numel());
      exchange(op, chunk(rank() - s - 1), got);
      const bool last = s == w - 2;
      if (widen) {
        at::Tensor sum = got.to(at::kFloat).add_(mine.to(at::kFloat));
        if (last && reduce_op == ReduceOp::kAvg) sum.div_(w);
        mine.copy_(sum);
      } else {
        mine.add_(got);
        if (last && reduce_op == ReduceOp::kAvg) mine.div_(w);
      }
    }
    gather_chunks(op, flat);
  }

  // Chunk c (mod W) of flat split into W: elements [c N / W, (c + 1) N / W).
  at::Tensor ring_chunk(const at::Tensor& flat, int c) const {
    const int w = size();
    const int64_t n = flat.numel();
    c = (c % w + w) % w;
    return flat.narrow(0, c * n / w, (c + 1) * n / w - c * n / w);
  }

  // The all-gather half of a ring, in W-1 steps: rank r starts with chunk r of flat complete; at
  // step s it sends chunk (r-s) mod W to rank r+1 and receives chunk (r-s-1) mod W from rank r-1.
  // Each rank sends W-1 chunks, as gloo's own ring does.
  void gather_chunks(const OpContext& op, const at::Tensor& flat) {
    for (int s = 0; s < size() - 1; ++s) {
      exchange(op, ring_chunk(flat, rank() - s), ring_chunk(flat, rank() - s - 1));
    }
  }

  // Ring all-gather straight into output, whose W chunks of input's size are ring_chunk's
  // ([Note: gloo's receive before its send]).
  void ring_all_gather(const OpContext& op, const at::Tensor& output, const at::Tensor& input) {
    const at::Tensor own = ring_chunk(output, rank());
    if (own.data_ptr() != input.data_ptr()) own.copy_(input);
    gather_chunks(op, output);
  }

  // Ring reduce-scatter over W ranks, in W-1 steps. At step s rank r sends chunk (r-s-1) mod W,
  // its running partial sum of that chunk (its own input chunk at s = 0), to rank r+1, receives
  // chunk (r-s-2) mod W from rank r-1 and adds its own contribution. After step W-2 the chunk
  // received is chunk r with all W contributions. Each rank sends W-1 chunks: (W-1)/W of input.
  //
  // Bytes on the wire are in the tensor's dtype. For BFloat16 and Half each hop adds in float32
  // and rounds once, so the result carries W-1 roundings, like NCCL's ring; sending float32
  // partials would double the traffic. kAvg divides by W before the final rounding.
  void ring_reduce_scatter(const OpContext& op, const at::Tensor& output, const at::Tensor& input,
                           ReduceOp reduce_op) {
    const int64_t n = output.numel();
    auto chunk = [&](int64_t c) { return input.narrow(0, c * n, n); };
    const bool widen = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
    at::Tensor send_buf = chunk((rank() + size() - 1) % size());  // read only, never written
    at::Tensor partial = at::empty({n}, input.options());
    at::Tensor recv_buf = at::empty({n}, input.options());
    for (int step = 0; step < size() - 1; ++step) {
      exchange(op, send_buf, recv_buf);

      const int64_t received = ((rank() - step - 2) % size() + size()) % size();
      const bool last = step == size() - 2;
      TORCH_INTERNAL_ASSERT(!last || received == rank(), "ring ended on chunk ", received,
                            " at rank ", rank());
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
          sum.div_(size());
        }
        output.copy_(sum);
      } else {
        at::Tensor out = output;
        at::add_out(out, recv_buf, mine);
        if (reduce_op == ReduceOp::kAvg) {
          output.div_(size());
        }
      }
    }
  }

  c10::intrusive_ptr<c10d::Store> store_;  // Kept: a TCPStore server must outlive the group.
  ProcessGroupOptions options_;            // for the groups split from this one
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  int p2p_tag_ = 0;  // Only touched by the progress thread.
};

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                      int rank, int world_size,
                                                      const ProcessGroupOptions& options) {
  TORCH_CHECK(store, "fsdp: make_gloo_process_group needs a store, got null");
  return std::make_shared<GlooProcessGroup>(store, rank, world_size, options);
}

}  // namespace fsdp::detail
