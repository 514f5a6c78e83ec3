// Ring collectives over MPI_Isend / MPI_Irecv (see mpi_ring.h).
//
// Invariants:
// - A ring step sends one chunk to the right neighbour and receives one from the left, in
//   segments of at most kRingSegmentBytes: see [Note: ring segments]. Every message's count
//   therefore fits MPI's int, whatever the tensor's size.
// - Both ends of a message derive its chunk and segment bounds from the same numbers (the
//   element count, the group's size, the chunk's index), so they agree without an exchange; an
//   empty chunk is neither sent nor received.
// - A step returns only when all its messages have completed, and it never writes what it sends:
//   the reduce-scatter's partial sums alternate between the output and one scratch buffer, the
//   all-reduce's stay in the chunks of the caller's tensor, and a step sends one chunk while it
//   writes another.
#include "mpi_ring.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace fsdp::detail {
namespace {

// [Note: ring segments]
// A step posts every send of its chunk at once, in segments of kRingSegmentBytes, and receives
// into kRingSlots landing slots of one segment each, adding each segment as soon as it arrives
// and then posting the receive that reuses its slot. Posting every send at once matters more
// than any size here: on two cores shared by more runnable threads than cores, each rank runs in
// scheduler slices, and a peer that finds every segment already posted moves all of them in its
// slice instead of one round trip per slice. Under Open MPI's shared-memory transport (vader
// with CMA) the receiver copies a segment straight out of the sender's memory into a slot that
// stays in this core's cache until the add reads it; a landing buffer of the whole chunk would
// be written to memory and read back, and a new one per call would fault in its pages. Over TCP
// the wire carries the next segments while this one is added. 256 KiB: the four slots and the
// segments they are added to stay within the 2 MiB of L2 per core of this machine; 1 MiB
// segments measured the same within the noise (bench/RESULTS.md, "MPI at every size").
constexpr int64_t kRingSegmentBytes = int64_t{256} << 10;
constexpr int64_t kRingSlots = 4;

// [Note: a whole chunk posted across hosts]
// Open MPI's TCP transport moves a message larger than its eager limit (64 KiB) only after the
// receiver has matched it to a posted receive and answered, and that answer leaves on the same
// connection as the receiver's own sends, behind every segment it has already posted. With four
// landing slots, each receive past the fourth is posted only after a segment arrived, so its
// answer waits behind this rank's outgoing chunk: at W = 2 over the 1 Gbit/s link of bench/cluster
// the reduce-scatter ring moved 68-74 MB/s each way (16-64 MiB), against 119 MB/s with an eager
// limit above the segment size and 116 for gloo's ring. So when the left neighbour is on another
// host, a reducing step lands the whole chunk in a buffer of its own, every receive posted at
// once as the all-gather's already are, and adds each segment as it arrives; the cache argument
// of [Note: ring segments] is for shared memory, where the slots stay (on one host, a landing
// buffer of the whole chunk took 1.2x the slots' time at 16 MiB and 2x at 64 MiB). The process
// group decides from its ranks' host names; FSDP_MPI_RING_LANDING=slots or whole forces either.

// The point-to-point tag of every ring message. Collectives match separately from
// point-to-point operations in MPI, and the ops of a group run one at a time, so one tag does.
constexpr int kRingTag = 31004;

int mod(int a, int w) { return ((a % w) + w) % w; }

// Chunk c of flat split into w: elements [c N / w, (c + 1) N / w).
at::Tensor chunk(const at::Tensor& flat, int c, int w) {
  const int64_t n = flat.numel();
  const int64_t begin = c * n / w;
  return flat.narrow(0, begin, (c + 1) * n / w - begin);
}

char* bytes_of(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

bool is_reduced_float(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf;
}

// dst = received + mine, one hop of the gloo backend's ring: in the dtype's arithmetic (at::add
// of BFloat16 and Half adds in float32 and rounds once). divide_by > 1, the last hop of kAvg,
// divides the sum before it is rounded, in float32 for BFloat16 and Half.
void add_hop(const at::Tensor& dst, const at::Tensor& received, const at::Tensor& mine,
             int divide_by) {
  if (divide_by > 1 && is_reduced_float(dst)) {
    dst.copy_(received.to(at::kFloat).add_(mine.to(at::kFloat)).div_(divide_by));
    return;
  }
  at::Tensor out = dst;
  at::add_out(out, received, mine);
  if (divide_by > 1) out.div_(divide_by);
}

// A flat tensor moved whole between two ranks, in the ring's segments, every message posted at
// once ([Note: ring segments]); both ends cut it the same way from its element count and dtype.
class Segments {
 public:
  explicit Segments(const at::Tensor& flat)
      : flat_(flat),
        item_(static_cast<int64_t>(flat.element_size())),
        segment_(std::max<int64_t>(1, kRingSegmentBytes / item_)),
        count_((flat.numel() + segment_ - 1) / segment_) {}

  int64_t count() const { return count_; }

  // Posts segment k's message to (from) peer into *request.
  void post_send(const RingLink& link, int64_t k, int peer, MPI_Request* request) const {
    FSDP_MPI_CHECK(MPI_Isend(at(k), bytes(k), MPI_BYTE, peer, kRingTag, link.comm, request),
                   link.context);
  }
  void post_receive(const RingLink& link, int64_t k, int peer, MPI_Request* request) const {
    FSDP_MPI_CHECK(MPI_Irecv(at(k), bytes(k), MPI_BYTE, peer, kRingTag, link.comm, request),
                   link.context);
  }

  // Posts every segment's message to (from) peer, appending the requests and their peer.
  void post_all(const RingLink& link, bool send, int peer, std::vector<MPI_Request>& requests,
                std::vector<int>& peers) const {
    for (int64_t k = 0; k < count_; ++k) {
      requests.push_back(MPI_REQUEST_NULL);
      peers.push_back(peer);
      if (send) {
        post_send(link, k, peer, &requests.back());
      } else {
        post_receive(link, k, peer, &requests.back());
      }
    }
  }

 private:
  char* at(int64_t k) const { return bytes_of(flat_) + k * segment_ * item_; }
  int bytes(int64_t k) const {
    return static_cast<int>(std::min(segment_, flat_.numel() - k * segment_) * item_);
  }

  const at::Tensor flat_;
  const int64_t item_;
  const int64_t segment_;  // elements
  const int64_t count_;
};

void wait_for(const RingLink& link, std::vector<MPI_Request>& requests,
              const std::vector<int>& peers) {
  link.wait_all(requests.data(), peers.data(), static_cast<int>(requests.size()));
}

// The steps of a ring: each sends a chunk right while another arrives from the left.
class RingSteps {
 public:
  // What happens to a received segment: elements [offset, offset + length) of the chunk.
  using Arrived = std::function<void(int64_t offset, int64_t length, const at::Tensor& landed)>;

  RingSteps(const RingLink& link, at::ScalarType dtype)
      : link_(link),
        left_(mod(link.rank - 1, link.size)),
        right_(mod(link.rank + 1, link.size)),
        dtype_(dtype),
        item_(static_cast<int64_t>(c10::elementSize(dtype))),
        segment_(std::max<int64_t>(1, kRingSegmentBytes / item_)) {
    TORCH_INTERNAL_ASSERT(link.size >= 2, "a ring needs two ranks, got ", link.size);
  }

  int rank() const { return link_.rank; }
  int size() const { return link_.size; }

  // send goes right; the left's chunk lands in into (its own element count).
  void copy(const at::Tensor& send, const at::Tensor& into) {
    const int64_t count = into.numel();
    run(
        send, count, segments(count),
        [&](int64_t k) { return into.narrow(0, k * segment_, length(count, k)); }, nullptr);
  }

  // send goes right; received (count elements) is handed to arrived segment by segment, in order,
  // from one of kRingSlots landing slots, which is reused once arrived returns, or from a landing
  // buffer of the whole chunk if the link asks for it ([Note: a whole chunk posted across
  // hosts]).
  void reduce(const at::Tensor& send, int64_t count, const Arrived& arrived) {
    if (link_.land_whole_chunks) {
      if (whole_.numel() < count) whole_ = at::empty({count}, at::TensorOptions().dtype(dtype_));
      run(
          send, count, segments(count),
          [&](int64_t k) { return whole_.narrow(0, k * segment_, length(count, k)); }, arrived);
      return;
    }
    if (!slots_[0].defined()) {
      for (auto& slot : slots_) slot = at::empty({segment_}, at::TensorOptions().dtype(dtype_));
    }
    run(
        send, count, kRingSlots,
        [&](int64_t k) { return slots_[k % kRingSlots].narrow(0, 0, length(count, k)); }, arrived);
  }

 private:
  using Landing = std::function<at::Tensor(int64_t k)>;  // where segment k lands (its length)

  int64_t segments(int64_t count) const { return (count + segment_ - 1) / segment_; }
  int64_t length(int64_t count, int64_t k) const {
    return std::min(segment_, count - k * segment_);
  }

  void post_receive(int64_t count, int64_t k, const Landing& landing, MPI_Request* request) {
    FSDP_MPI_CHECK(MPI_Irecv(bytes_of(landing(k)), static_cast<int>(length(count, k) * item_),
                             MPI_BYTE, left_, kRingTag, link_.comm, request),
                   link_.context);
  }

  // One step: every segment of send posted at once; at most `depth` receives posted at a time,
  // receive k + depth once segment k has arrived. Returns when every message has completed, so
  // the next step may overwrite what this one sent.
  void run(const at::Tensor& send, int64_t count, int64_t depth, const Landing& landing,
           const Arrived& arrived) {
    const int64_t in = segments(count);
    std::vector<MPI_Request> sends;
    std::vector<int> rights;
    Segments(send).post_all(link_, /*send=*/true, right_, sends, rights);
    std::vector<MPI_Request> receives(in, MPI_REQUEST_NULL);
    for (int64_t k = 0; k < std::min(in, depth); ++k) post_receive(count, k, landing, &receives[k]);
    for (int64_t k = 0; k < in; ++k) {
      link_.wait_all(&receives[k], &left_, 1);
      if (arrived) arrived(k * segment_, length(count, k), landing(k));
      if (k + depth < in) post_receive(count, k + depth, landing, &receives[k + depth]);
    }
    wait_for(link_, sends, rights);
  }

  const RingLink& link_;
  const int left_;
  const int right_;
  const at::ScalarType dtype_;
  const int64_t item_;
  const int64_t segment_;  // elements
  std::array<at::Tensor, kRingSlots>
      slots_;         // where reduced segments land; made by the first reduce
  at::Tensor whole_;  // where they land instead with land_whole_chunks
};

// The all-gather half of a ring: rank r starts with chunk r of flat complete and ends with every
// chunk, chunk r - s - 1 arriving at step s.
void gather_chunks(RingSteps& ring, const at::Tensor& flat, int rank, int w) {
  for (int s = 0; s < w - 1; ++s) {
    ring.copy(chunk(flat, mod(rank - s, w), w), chunk(flat, mod(rank - s - 1, w), w));
  }
}

// The reduce-scatter half of ring_all_reduce, over flat's uneven chunks: at step s rank r adds
// its own chunk r - s - 2 of flat ("mine") to the left's partial sum of that chunk, keeps the sum
// in partial_for(s, mine) and sends it at step s + 1. Returns the last partial: chunk r of flat
// reduced over every rank. flat itself is written only where partial_for returns its chunks.
using PartialFor = std::function<at::Tensor(int step, const at::Tensor& mine)>;
at::Tensor reduce_chunks(RingSteps& ring, const at::Tensor& flat, ReduceOp reduce_op,
                         const PartialFor& partial_for) {
  const int w = ring.size();
  const int rank = ring.rank();
  at::Tensor send = chunk(flat, mod(rank - 1, w), w);
  for (int s = 0; s < w - 1; ++s) {
    const at::Tensor mine = chunk(flat, mod(rank - s - 2, w), w);
    const at::Tensor partial = partial_for(s, mine);
    const int divide_by = s == w - 2 && reduce_op == ReduceOp::kAvg ? w : 1;
    ring.reduce(send, partial.numel(), [&](int64_t offset, int64_t length, const at::Tensor& got) {
      add_hop(partial.narrow(0, offset, length), got, mine.narrow(0, offset, length), divide_by);
    });
    send = partial;
  }
  return send;
}

}  // namespace

// At step s rank r sends its partial sum of chunk r - s - 1 (at s = 0 its own input chunk) and
// receives the left's partial of chunk r - s - 2, to which it adds its own contribution; after
// step W - 2 the chunk received is chunk r, complete. A step sends the partial the step before
// wrote, so the partials alternate between output and one scratch buffer (for W > 2), the last
// in output.
void ring_reduce_scatter(const RingLink& link, const at::Tensor& output, const at::Tensor& input,
                         ReduceOp reduce_op) {
  const int w = link.size;
  RingSteps ring(link, input.scalar_type());
  const at::Tensor scratch = w > 2 ? at::empty_like(output) : output;
  at::Tensor send = chunk(input, mod(link.rank - 1, w), w);
  for (int s = 0; s < w - 1; ++s) {
    const at::Tensor mine = chunk(input, mod(link.rank - s - 2, w), w);
    const at::Tensor partial = (w - 2 - s) % 2 == 0 ? output : scratch;
    const int divide_by = s == w - 2 && reduce_op == ReduceOp::kAvg ? w : 1;
    ring.reduce(send, output.numel(), [&](int64_t offset, int64_t length, const at::Tensor& got) {
      add_hop(partial.narrow(0, offset, length), got, mine.narrow(0, offset, length), divide_by);
    });
    send = partial;
  }
}

// The same schedule as ring_reduce_scatter, with every chunk's partial sum kept in the chunk
// itself: rank r's own contribution to chunk c is needed only at the step that adds it.
void ring_all_reduce(const RingLink& link, const at::Tensor& tensor, ReduceOp reduce_op) {
  RingSteps ring(link, tensor.scalar_type());
  reduce_chunks(ring, tensor, reduce_op, [](int, const at::Tensor& mine) { return mine; });
  gather_chunks(ring, tensor, link.rank, link.size);
}

void ring_all_gather(const RingLink& link, const at::Tensor& output, const at::Tensor& input) {
  chunk(output, link.rank, link.size).copy_(input);
  RingSteps ring(link, input.scalar_type());
  gather_chunks(ring, output, link.rank, link.size);
}

// A rank's place in the chain is its distance from root; segment k leaves a rank as soon as it
// has arrived, so the chain's ranks forward at once instead of after the whole tensor.
void ring_broadcast(const RingLink& link, const at::Tensor& tensor, int root) {
  const int w = link.size;
  const int place = mod(link.rank - root, w);
  const int left = mod(link.rank - 1, w);
  const int right = mod(link.rank + 1, w);
  const Segments segments(tensor);
  const int64_t n = segments.count();
  std::vector<MPI_Request> sends;
  std::vector<int> rights;
  if (place == 0) {
    segments.post_all(link, /*send=*/true, right, sends, rights);
  } else {
    const bool forwards = place < w - 1;
    if (forwards) {
      sends.assign(n, MPI_REQUEST_NULL);
      rights.assign(n, right);
    }
    std::vector<MPI_Request> receives;
    std::vector<int> lefts;
    segments.post_all(link, /*send=*/false, left, receives, lefts);
    for (int64_t k = 0; k < n; ++k) {
      link.wait_all(&receives[k], &left, 1);
      if (forwards) segments.post_send(link, k, right, &sends[k]);
    }
  }
  wait_for(link, sends, rights);
}

void ring_reduce(const RingLink& link, const at::Tensor& tensor, int root, ReduceOp reduce_op) {
  const int w = link.size;
  const bool is_root = link.rank == root;
  RingSteps ring(link, tensor.scalar_type());
  std::array<at::Tensor, 2> scratch;
  if (!is_root) {
    for (auto& t : scratch) t = at::empty({(tensor.numel() + w - 1) / w}, tensor.options());
  }
  const at::Tensor reduced =
      reduce_chunks(ring, tensor, reduce_op, [&](int s, const at::Tensor& mine) {
        return is_root ? mine : scratch[s % 2].narrow(0, 0, mine.numel());
      });
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  if (!is_root) {
    Segments(reduced).post_all(link, /*send=*/true, root, requests, peers);
  } else {
    for (int q = 0; q < w; ++q) {
      if (q != root)
        Segments(chunk(tensor, q, w)).post_all(link, /*send=*/false, q, requests, peers);
    }
  }
  wait_for(link, requests, peers);
}

}  // namespace fsdp::detail
