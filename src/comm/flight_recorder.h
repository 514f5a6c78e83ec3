// Private to src/comm: the flight recorder, a ring buffer of one group's last collectives, and
// the comparison of several ranks' records that names where they diverged.
//
// Every collective a group issues gets the next sequence number (1, 2, ...). Ranks issue the
// same collectives in the same order, so collective #n is the same operation on every rank of
// a healthy group; the first n at which two ranks recorded different operations, or at which
// one rank has nothing, is where the job went wrong. Records are compared on op, label, dtype
// and element count, never on times or states.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace fsdp::detail {

enum class CollectiveState { kIssued, kCompleted, kFailed };

struct CollectiveRecord {
  using Clock = std::chrono::steady_clock;

  int64_t seq = 0;  // 1-based, per group
  std::string op;  // "all-gather", "reduce-scatter", "all-reduce", "broadcast", "reduce", "barrier"
  std::string label;  // CollectiveLabel::current() when issued ("" if none)
  std::string dtype;  // of the op's input ("" for a barrier)
  int64_t numel = 0;  // elements of the op's input (all-gather: this rank's part)
  int64_t bytes = 0;
  CollectiveState state = CollectiveState::kIssued;
  Clock::time_point issued_at{};
  Clock::time_point finished_at{};  // epoch until it completed or failed

  // "all-gather #57 (unit h.3, 4096 x Float)": how messages name a collective.
  std::string describe() const;
  // Whether two ranks' record of the same seq is the same operation.
  bool same_operation(const CollectiveRecord& other) const {
    return op == other.op && label == other.label && dtype == other.dtype && numel == other.numel;
  }
};

// Thread-safe ring of the last `capacity` records of one group.
class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity);

  // Records a new collective and returns its sequence number. input may be undefined (barrier).
  int64_t record(const char* op, const std::string& label, const at::Tensor& input);
  // Marks collective seq as finished in state (a no-op if it already left the ring).
  void finish(int64_t seq, CollectiveState state);
  // The records still in the ring, oldest first.
  std::vector<CollectiveRecord> snapshot() const;

 private:
  mutable std::mutex mutex_;
  std::vector<CollectiveRecord> ring_;
  int64_t next_seq_ = 1;
};

// The records as a JSON document (for the file each rank dumps on failure), times in
// microseconds relative to the oldest record's issue.
std::string records_to_json(int rank, const std::string& group, int64_t timeout_ms,
                            const std::vector<CollectiveRecord>& records);

// A compact text form of the records' operations (one line each), exchanged over the store,
// and its inverse. Times are not carried.
std::string encode_records(const std::vector<CollectiveRecord>& records);
std::vector<CollectiveRecord> decode_records(const std::string& text);

// Names where the ranks diverged, from the records of the ranks that reported (by rank), in a
// group of world_size: the first sequence number at which ranks recorded different operations,
// or at which some ranks had issued nothing; otherwise where each rank stands. Ranks absent from
// by_rank are named as not having reported.
std::string describe_divergence(const std::map<int, std::vector<CollectiveRecord>>& by_rank,
                                int world_size);

}  // namespace fsdp::detail
