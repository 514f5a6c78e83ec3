// The MPI backend: fsdp::ProcessGroup over MPI's collectives, for CPU tensors.
//
// Invariants:
// - MPI is initialized once per process with MPI_THREAD_MULTIPLE, because every group (the
//   world, and the subgroups of HSDP and hpZ) calls MPI from its own progress thread. It is
//   finalized at exit, or the job is aborted at exit when any request was abandoned: a
//   collective that timed out can be neither cancelled nor completed, and MPI_Finalize would
//   wait for it.
// - Each op is a non-blocking collective (MPI_Iallgather, MPI_Ireduce_scatter_block, ...), or for
//   the sizes where it is faster our ring of non-blocking sends and receives (mpi_ring.h; the
//   choice is mpi_algorithm.h's), that the progress thread drives with MPI_Test until it
//   completes or its deadline passes. MPI has no timeout of its own; this is how a missing peer
//   becomes an error that names the rank and the operation. Blocking collectives are faster by a
//   few microseconds but cannot be bounded.
// - Ops run one at a time per group in call order (the base's queue), which is also the order
//   MPI matches collectives on a communicator.
// - bf16 and fp16 have no MPI type: they travel as 2-byte types of our own, summed by a user
//   op that adds in float32 and rounds once, as the gloo backend's ring does per hop.
// - Every MPI call's return code is checked; communicators return errors instead of aborting.
#include "mpi_process_group.h"

#include "../bootstrap.h"
#include "../queued_process_group.h"
#include "mpi_algorithm.h"
#include "mpi_check.h"
#include "mpi_environment.h"
#include "mpi_ring.h"

#include <fsdp/util/error.h>

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <netinet/in.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fsdp::detail {
namespace {

// ---- The process-wide MPI state ----

std::atomic<bool> abandoned_requests{false};
bool finalize_at_exit = false;  // We initialized MPI, so we finalize it.

void finalize_or_abort() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (abandoned_requests.load()) {
    // A timed-out collective is still posted; MPI_Finalize would wait for it forever.
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
}

void ensure_mpi_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    int initialized = 0;
    FSDP_MPI_CHECK(MPI_Initialized(&initialized), "fsdp: ");
    int provided = MPI_THREAD_SINGLE;
    if (initialized) {
      FSDP_MPI_CHECK(MPI_Query_thread(&provided), "fsdp: ");
    } else {
      FSDP_MPI_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "fsdp: ");
      finalize_at_exit = true;
      std::atexit(finalize_or_abort);
    }
    TORCH_CHECK(provided == MPI_THREAD_MULTIPLE,
                "fsdp: the mpi backend calls MPI from one progress thread per group, so it needs "
                "MPI_THREAD_MULTIPLE (",
                MPI_THREAD_MULTIPLE, "), but this MPI library provides thread level ", provided,
                (initialized ? " (the program initialized MPI itself: use MPI_Init_thread with "
                               "MPI_THREAD_MULTIPLE)"
                             : ""));
  });
}

// ---- Types and reduction ops ----

template <typename T>
void sum_in_float(void* in, void* inout, int* length, MPI_Datatype* /*type*/) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) {
    b[i] = T(static_cast<float>(a[i]) + static_cast<float>(b[i]));
  }
}

struct HalfTypes {
  MPI_Datatype bf16 = MPI_DATATYPE_NULL;
  MPI_Datatype fp16 = MPI_DATATYPE_NULL;
  MPI_Op bf16_sum = MPI_OP_NULL;
  MPI_Op fp16_sum = MPI_OP_NULL;
};

// Made once, after MPI_Init; never freed (MPI_Finalize releases them).
const HalfTypes& half_types() {
  static const HalfTypes types = [] {
    HalfTypes t;
    FSDP_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.bf16), "fsdp: ");
    FSDP_MPI_CHECK(MPI_Type_commit(&t.bf16), "fsdp: ");
    FSDP_MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &t.fp16), "fsdp: ");
    FSDP_MPI_CHECK(MPI_Type_commit(&t.fp16), "fsdp: ");
    FSDP_MPI_CHECK(MPI_Op_create(&sum_in_float<c10::BFloat16>, /*commute=*/1, &t.bf16_sum),
                   "fsdp: ");
    FSDP_MPI_CHECK(MPI_Op_create(&sum_in_float<c10::Half>, /*commute=*/1, &t.fp16_sum), "fsdp: ");
    return t;
  }();
  return types;
}

struct Reduction {
  MPI_Datatype type;
  MPI_Op op;
};

// The element type and sum op MPI reduces dtype with; throws naming the dtype when there is
// none.
Reduction sum_of(at::ScalarType dtype, const std::string& context) {
  switch (dtype) {
    case at::kFloat:
      return {MPI_FLOAT, MPI_SUM};
    case at::kDouble:
      return {MPI_DOUBLE, MPI_SUM};
    case at::kBFloat16:
      return {half_types().bf16, half_types().bf16_sum};
    case at::kHalf:
      return {half_types().fp16, half_types().fp16_sum};
    case at::kLong:
      return {MPI_INT64_T, MPI_SUM};
    case at::kInt:
      return {MPI_INT32_T, MPI_SUM};
    case at::kShort:
      return {MPI_INT16_T, MPI_SUM};
    case at::kChar:
      return {MPI_INT8_T, MPI_SUM};
    case at::kByte:
      return {MPI_UINT8_T, MPI_SUM};
    default:
      break;
  }
  TORCH_CHECK(false, context, "the mpi backend cannot sum ", dtype,
              " (it sums Float, Double, BFloat16, Half and the integer types)");
}

// ---- Waiting: how the progress thread drives a request ----

enum class PollPolicy { kSpin, kYield, kBackoff };

// FSDP_MPI_POLL: spin (MPI_Test back to back), yield (the default: sched_yield between tests)
// or backoff (spin for a few microseconds, then sleep between tests, doubling the sleep up to a
// ceiling). Open MPI advances a non-blocking collective only inside MPI_Test, one round of its
// schedule per call, so sleeping between tests stretches every round: backoff made a 4 MiB
// reduce 40 times slower than yield. bench/RESULTS.md ("MPI against gloo") measures the three.
PollPolicy poll_policy() {
  static const PollPolicy policy =
      choice_from_environment<PollPolicy>("FSDP_MPI_POLL", "a poll policy",
                                          {{"yield", PollPolicy::kYield},
                                           {"spin", PollPolicy::kSpin},
                                           {"backoff", PollPolicy::kBackoff}});
  return policy;
}

// Where a reducing ring step lands what its left neighbour sends, from FSDP_MPI_RING_LANDING:
// auto (the default: the whole chunk at once where the left is on another host, else the
// slots), slots or whole ([Note: a whole chunk posted across hosts]). Each rank may choose its
// own: the messages are the same either way.
enum class RingLanding { kAuto, kSlots, kWhole };
RingLanding ring_landing() {
  static const RingLanding landing =
      choice_from_environment<RingLanding>("FSDP_MPI_RING_LANDING", "a ring landing",
                                           {{"auto", RingLanding::kAuto},
                                            {"slots", RingLanding::kSlots},
                                            {"whole", RingLanding::kWhole}});
  return landing;
}

constexpr auto kSpinFor = std::chrono::microseconds(50);
constexpr auto kFirstSleep = std::chrono::microseconds(2);
constexpr auto kLongestSleep = std::chrono::microseconds(200);

class MpiProcessGroup final : public QueuedProcessGroup {
 public:
  MpiProcessGroup(MPI_Comm comm, int rank, int world_size, c10::intrusive_ptr<c10d::Store> store,
                  const ProcessGroupOptions& options)
      : QueuedProcessGroup(rank, world_size, options.timeout),
        comm_(comm),
        store_(std::move(store)),
        options_(options) {
    FSDP_MPI_CHECK(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), prefix());
    int mpi_rank = -1;
    FSDP_MPI_CHECK(MPI_Comm_rank(comm_, &mpi_rank), prefix());
    TORCH_INTERNAL_ASSERT(mpi_rank == rank, "MPI numbers this rank ", mpi_rank, ", not ", rank);
    start_progress();
    land_whole_chunks_ = ring_landing() == RingLanding::kWhole;
    if (world_size > 1 && ring_landing() == RingLanding::kAuto) {
      enqueue("host_names", {}, [this](const OpContext& op) { find_left_host(op); })->wait();
    }
  }

  ~MpiProcessGroup() override {
    stop_progress();
    // A communicator with an abandoned request cannot be freed safely; exit aborts the job.
    if (!abandoned_requests.load()) MPI_Comm_free(&comm_);
  }

  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::string backend_name() const override { return "mpi"; }

 private:
  void run_all_gather(const OpContext& op, const at::Tensor& output,
                      const at::Tensor& input) override {
    if (ring_for(MpiRingCollective::kAllGather, output)) {
      ring_all_gather(ring_link(op), output, input);
      return;
    }
    // Bytes are bytes: no type is needed to move them, whatever the dtype.
    const int count = byte_count(op, input);
    MPI_Request request = MPI_REQUEST_NULL;
    FSDP_MPI_CHECK(MPI_Iallgather(input.data_ptr(), count, MPI_BYTE, output.data_ptr(), count,
                                  MPI_BYTE, comm_, &request),
                   context(op));
    wait(op, request, -1);
  }

  void run_reduce_scatter(const OpContext& op, const at::Tensor& output, const at::Tensor& input,
                          ReduceOp reduce_op) override {
    if (ring_for(MpiRingCollective::kReduceScatter, input)) {
      ring_reduce_scatter(ring_link(op), output, input, reduce_op);
      return;
    }
    const Reduction sum = sum_of(input.scalar_type(), context(op));
    MPI_Request request = MPI_REQUEST_NULL;
    FSDP_MPI_CHECK(
        MPI_Ireduce_scatter_block(input.data_ptr(), output.data_ptr(), element_count(op, output),
                                  sum.type, sum.op, comm_, &request),
        context(op));
    wait(op, request, -1);
    // MPI has no average. Dividing the rounded sum equals dividing before rounding whenever W is
    // a power of two (the division is then exact), which is where the gloo ring agrees bit for
    // bit; at other W a bf16 or fp16 average may differ from gloo's in the last place.
    if (reduce_op == ReduceOp::kAvg) output.div_(size());
  }

  void run_all_reduce(const OpContext& op, const at::Tensor& tensor, ReduceOp reduce_op) override {
    if (ring_for(MpiRingCollective::kAllReduce, tensor)) {
      ring_all_reduce(ring_link(op), tensor, reduce_op);
      return;
    }
    const Reduction sum = sum_of(tensor.scalar_type(), context(op));
    MPI_Request request = MPI_REQUEST_NULL;
    FSDP_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, tensor.data_ptr(), element_count(op, tensor),
                                  sum.type, sum.op, comm_, &request),
                   context(op));
    wait(op, request, -1);
    if (reduce_op == ReduceOp::kAvg) tensor.div_(size());
  }

  void run_broadcast(const OpContext& op, const at::Tensor& tensor, int root) override {
    if (ring_for(MpiRingCollective::kBroadcast, tensor)) {
      ring_broadcast(ring_link(op), tensor, root);
      return;
    }
    MPI_Request request = MPI_REQUEST_NULL;
    FSDP_MPI_CHECK(
        MPI_Ibcast(tensor.data_ptr(), byte_count(op, tensor), MPI_BYTE, root, comm_, &request),
        context(op));
    wait(op, request, root == rank() ? -1 : root);
  }

  void run_reduce(const OpContext& op, const at::Tensor& tensor, int root,
                  ReduceOp reduce_op) override {
    if (ring_for(MpiRingCollective::kReduce, tensor)) {
      ring_reduce(ring_link(op), tensor, root, reduce_op);
      return;
    }
    const Reduction sum = sum_of(tensor.scalar_type(), context(op));
    const bool is_root = root == rank();
    MPI_Request request = MPI_REQUEST_NULL;
    FSDP_MPI_CHECK(MPI_Ireduce(is_root ? MPI_IN_PLACE : tensor.data_ptr(),
                               is_root ? tensor.data_ptr() : nullptr, element_count(op, tensor),
                               sum.type, sum.op, root, comm_, &request),
                   context(op));
    wait(op, request, is_root ? -1 : root);
    if (is_root && reduce_op == ReduceOp::kAvg) tensor.div_(size());
  }

  void run_barrier(const OpContext& op) override {
    MPI_Request request = MPI_REQUEST_NULL;
    FSDP_MPI_CHECK(MPI_Ibarrier(comm_, &request), context(op));
    wait(op, request, -1);
  }

  // The members first meet on the store, which names the missing ones after the timeout; then
  // MPI forms their communicator on this group's progress thread, so that it cannot interleave
  // with this group's collectives. MPI_Comm_create_group involves only the members.
  std::shared_ptr<ProcessGroup> split_member(const std::vector<int>& ranks, int index,
                                             const std::string& name) override {
    const int size = static_cast<int>(ranks.size());
    auto store = join_subgroup(store_, name, index, size, "mpi", options_.timeout);
    MPI_Comm sub = MPI_COMM_NULL;
    enqueue("split", {}, [&](const OpContext& op) {
      MPI_Group whole = MPI_GROUP_NULL;
      MPI_Group members = MPI_GROUP_NULL;
      FSDP_MPI_CHECK(MPI_Comm_group(comm_, &whole), context(op));
      FSDP_MPI_CHECK(MPI_Group_incl(whole, size, ranks.data(), &members), context(op));
      const int tag = static_cast<int>(std::hash<std::string>{}(name) % 32768);
      const int rc = MPI_Comm_create_group(comm_, members, tag, &sub);
      MPI_Group_free(&members);
      MPI_Group_free(&whole);
      FSDP_MPI_CHECK(rc, context(op));
    })->wait();
    return std::make_shared<MpiProcessGroup>(sub, index, size, std::move(store), options_);
  }

  std::string context(const OpContext& op) const { return prefix() + op.name + ": "; }

  bool ring_for(MpiRingCollective collective, const at::Tensor& larger) const {
    return mpi_algorithm_for(collective, static_cast<int64_t>(larger.nbytes()), size()) ==
           MpiAlgorithm::kRing;
  }

  // What a ring run as op needs: it waits as every op of this group does.
  RingLink ring_link(const OpContext& op) {
    return {comm_,
            rank(),
            size(),
            context(op),
            land_whole_chunks_,
            [this, &op](MPI_Request* requests, const int* peers, int count) {
              wait_all(op, requests, peers, count);
            }};
  }

  // Lands whole chunks if the left neighbour's processor name (MPI's name of its host) is not
  // this rank's, from every rank's, gathered once when the group is made ([Note: a whole chunk
  // posted across hosts]).
  void find_left_host(const OpContext& op) {
    std::vector<char> names(static_cast<size_t>(size()) * MPI_MAX_PROCESSOR_NAME, '\0');
    int length = 0;
    FSDP_MPI_CHECK(MPI_Get_processor_name(names.data() + rank() * MPI_MAX_PROCESSOR_NAME, &length),
                   context(op));
    MPI_Request request = MPI_REQUEST_NULL;
    FSDP_MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, names.data(),
                                  MPI_MAX_PROCESSOR_NAME, MPI_CHAR, comm_, &request),
                   context(op));
    wait(op, request, -1);
    auto name_of = [&](int r) {
      return std::string(names.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME);
    };
    land_whole_chunks_ = name_of((rank() + size() - 1) % size()) != name_of(rank());
  }

  // MPI counts in int; a larger message is refused rather than truncated.
  int checked_count(const OpContext& op, int64_t count) const {
    TORCH_CHECK(count <= std::numeric_limits<int>::max(), context(op), count,
                " elements exceed what one MPI call can move (2^31 - 1)");
    return static_cast<int>(count);
  }
  int byte_count(const OpContext& op, const at::Tensor& t) const {
    return checked_count(op, static_cast<int64_t>(t.nbytes()));
  }
  int element_count(const OpContext& op, const at::Tensor& t) const {
    return checked_count(op, t.numel());
  }

  // Drives request to completion, or throws when op's deadline passes, naming the rank waited
  // for (peer < 0: unknown, unless W = 2).
  void wait(const OpContext& op, MPI_Request& request, int peer) {
    wait_all(op, &request, &peer, 1);
  }

  // Drives requests[0..count) to completion (each becomes MPI_REQUEST_NULL), or throws when op's
  // deadline passes, naming peers[i] of the first request still pending.
  void wait_all(const OpContext& op, MPI_Request* requests, const int* peers, int count) {
    const PollPolicy policy = poll_policy();
    // Linux stretches a thread's short sleeps by its timer slack, 50 us by default, which would
    // make the backoff's first sleeps 25 times longer than asked. This thread's is 1 us.
    static thread_local const bool precise_sleeps = ::prctl(PR_SET_TIMERSLACK, 1000UL) == 0;
    (void)precise_sleeps;
    const auto spin_until = Clock::now() + kSpinFor;
    auto sleep = kFirstSleep;
    while (true) {
      if (test_all(op, requests, count)) return;
      const auto now = Clock::now();
      if (now >= op.deadline) break;
      if (policy == PollPolicy::kYield) {
        sched_yield();
      } else if (policy == PollPolicy::kBackoff && now >= spin_until) {
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2,
                         std::chrono::duration_cast<std::chrono::microseconds>(kLongestSleep));
      }
    }
    int peer = -1;
    for (int i = 0; i < count && peer < 0; ++i) {
      if (requests[i] != MPI_REQUEST_NULL) peer = peers[i];
    }
    timed_out(op, peer);
  }

  // Tests each pending request once; true when none is left.
  bool test_all(const OpContext& op, MPI_Request* requests, int count) {
    bool all_done = true;
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      int done = 0;
      FSDP_MPI_CHECK(MPI_Test(&requests[i], &done, MPI_STATUS_IGNORE), context(op));
      all_done = all_done && done;
    }
    return all_done;
  }

  [[noreturn]] void timed_out(const OpContext& op, int peer) {
    abandoned_requests.store(true);
    if (peer < 0 && size() == 2) peer = 1 - rank();
    const std::string whom = peer >= 0 ? "rank " + std::to_string(peer) : "another rank";
    TORCH_CHECK(false, prefix(), op.name, " timed out after ", timeout().count(),
                " ms waiting for ", whom,
                " (MPI has no timeout of its own: the request is abandoned, and this process "
                "aborts the MPI job when it exits)");
  }

  MPI_Comm comm_;
  bool land_whole_chunks_ = false;         // set by the constructor, before any ring runs
  c10::intrusive_ptr<c10d::Store> store_;  // Where subgroups meet before MPI forms them.
  ProcessGroupOptions options_;            // For the groups split from this one.
};

int local_world_rank_and_size(int& size) {
  int rank = -1;
  FSDP_MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "fsdp: ");
  FSDP_MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &size), "fsdp: ");
  return rank;
}

// A TCP socket listening on every interface at a port the kernel chose.
int listen_on_any_port(int& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  TORCH_CHECK(fd >= 0, "fsdp: socket() failed: ", std::strerror(errno));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof(addr);
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &length) == 0 &&
                  ::listen(fd, SOMAXCONN) == 0;
  const int error = errno;
  if (!ok) {
    ::close(fd);
    TORCH_CHECK(false,
                "fsdp: could not bind the rendezvous store's socket: ", std::strerror(error));
  }
  port = ntohs(addr.sin_port);
  return fd;
}

}  // namespace

std::shared_ptr<ProcessGroup> make_mpi_process_group(const c10::intrusive_ptr<c10d::Store>& store,
                                                     int rank, int world_size,
                                                     const ProcessGroupOptions& options) {
  TORCH_CHECK(store, "fsdp: make_mpi_process_group needs a store, got null");
  ensure_mpi_initialized();
  int mpi_size = 0;
  const int mpi_rank = local_world_rank_and_size(mpi_size);
  TORCH_CHECK(mpi_size == world_size && mpi_rank == rank, "fsdp: rank ", rank, " of ", world_size,
              ": the mpi backend needs its ranks started by mpirun (or srun --mpi=pmix), one "
              "process each, but MPI's world has ",
              mpi_size, " process(es) and numbers this one ", mpi_rank,
              " (under torchrun, or for ranks as threads, use the gloo backend)");
  MPI_Comm comm = MPI_COMM_NULL;
  FSDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm), "fsdp: ");
  return std::make_shared<MpiProcessGroup>(comm, rank, world_size, store, options);
}

void share_master_over_mpi(LaunchEnv& env) {
  ensure_mpi_initialized();
  int size = 0;
  const int rank = local_world_rank_and_size(size);
  TORCH_CHECK(rank == env.rank && size == env.world_size, "fsdp: Open MPI's variables say rank ",
              env.rank, " of ", env.world_size, " but MPI's world numbers this process ", rank,
              " of ", size);
  // "address port", NUL-terminated, in a buffer of fixed size so one broadcast suffices.
  std::array<char, 320> text{};
  if (rank == 0) {
    int port = 0;
    env.master_listen_fd = listen_on_any_port(port);
    std::string host = "127.0.0.1";
    if (env.local_world_size != size) {
      std::array<char, 256> name{};
      TORCH_CHECK(::gethostname(name.data(), name.size() - 1) == 0,
                  "fsdp: gethostname failed: ", std::strerror(errno));
      host = name.data();
    }
    std::snprintf(text.data(), text.size(), "%s %d", host.c_str(), port);
  }
  FSDP_MPI_CHECK(MPI_Bcast(text.data(), static_cast<int>(text.size()), MPI_CHAR, 0, MPI_COMM_WORLD),
                 "fsdp: sharing the rendezvous address: ");
  const std::string shared(text.data());
  const auto space = shared.rfind(' ');
  TORCH_INTERNAL_ASSERT(space != std::string::npos, "malformed master address '", shared, "'");
  env.master_addr = shared.substr(0, space);
  env.master_port = std::stoi(shared.substr(space + 1));
}

}  // namespace fsdp::detail
