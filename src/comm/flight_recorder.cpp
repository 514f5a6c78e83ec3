// The flight recorder's ring and the divergence report (see flight_recorder.h).
//
// The ring is a vector used circularly: record #n sits at index (n - 1) % capacity, so finding a
// record by sequence number costs nothing and the ring never reallocates after it filled.
#include "flight_recorder.h"

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <sstream>

namespace fsdp::detail {
namespace {

const char* state_name(CollectiveState state) {
  switch (state) {
    case CollectiveState::kIssued:
      return "in flight";
    case CollectiveState::kCompleted:
      return "completed";
    case CollectiveState::kFailed:
      return "failed";
  }
  return "?";
}

CollectiveState state_from_name(const std::string& name) {
  if (name == "completed") return CollectiveState::kCompleted;
  if (name == "failed") return CollectiveState::kFailed;
  return CollectiveState::kIssued;
}

std::string one_line(std::string text) {
  std::replace_if(
      text.begin(), text.end(), [](char c) { return c == '\t' || c == '\n'; }, ' ');
  return text;
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}

using RecordsByRank = std::map<int, std::vector<CollectiveRecord>>;

const CollectiveRecord* find_seq(const std::vector<CollectiveRecord>& records, int64_t seq) {
  if (records.empty() || seq < records.front().seq || seq > records.back().seq) return nullptr;
  const CollectiveRecord& r = records[static_cast<size_t>(seq - records.front().seq)];
  return r.seq == seq ? &r : nullptr;
}

int64_t last_seq(const std::vector<CollectiveRecord>& records) {
  return records.empty() ? 0 : records.back().seq;
}

// "ranks 0, 2 are at all-gather #57 (unit h.3, ...), rank 1 at reduce-scatter #57 (...)":
// the ranks that recorded seq, grouped by the operation they recorded.
std::string who_is_where(const RecordsByRank& by_rank, int64_t seq) {
  std::vector<std::pair<const CollectiveRecord*, std::vector<int>>> groups;
  for (const auto& [rank, records] : by_rank) {
    const CollectiveRecord* r = find_seq(records, seq);
    if (r == nullptr) continue;
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first->same_operation(*r); });
    if (it == groups.end()) {
      groups.push_back({r, {rank}});
    } else {
      it->second.push_back(rank);
    }
  }
  std::ostringstream out;
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& [record, ranks] = groups[i];
    out << (i ? ", " : "") << join_ranks(ranks)
        << (i ? " at " : (ranks.size() == 1 ? " is at " : " are at ")) << record->describe();
  }
  return out.str();
}

// The ranks that reported but have no record numbered seq because they never issued it.
std::vector<int> ranks_short_of(const RecordsByRank& by_rank, int64_t seq) {
  std::vector<int> behind;
  for (const auto& [rank, records] : by_rank) {
    if (last_seq(records) < seq) behind.push_back(rank);
  }
  return behind;
}

bool operations_differ(const RecordsByRank& by_rank, int64_t seq) {
  const CollectiveRecord* first = nullptr;
  for (const auto& entry : by_rank) {
    const CollectiveRecord* r = find_seq(entry.second, seq);
    if (r == nullptr) continue;
    if (first != nullptr && !first->same_operation(*r)) return true;
    if (first == nullptr) first = r;
  }
  return false;
}

std::string describe_last(const std::vector<CollectiveRecord>& records) {
  if (records.empty()) return "it issued none";
  const CollectiveRecord& last = records.back();
  return "its last is " + last.describe() + ", " + state_name(last.state);
}

// Where the records first disagree, or "" if they agree on every collective they all hold.
std::string first_divergence(const RecordsByRank& by_rank) {
  int64_t from = 1;
  int64_t to = 0;
  for (const auto& entry : by_rank) {
    if (!entry.second.empty()) from = std::max(from, entry.second.front().seq);
    to = std::max(to, last_seq(entry.second));
  }
  for (int64_t seq = from; seq <= to; ++seq) {
    const std::vector<int> behind = ranks_short_of(by_rank, seq);
    if (operations_differ(by_rank, seq)) {
      return "the ranks diverge at collective #" + std::to_string(seq) + ": " +
             who_is_where(by_rank, seq);
    }
    if (!behind.empty()) {
      std::string text = "the ranks diverge at collective #" + std::to_string(seq) + ": " +
                         who_is_where(by_rank, seq) + "; ";
      for (size_t i = 0; i < behind.size(); ++i) {
        text += (i ? "; " : "") + join_ranks({behind[i]}) + " never issued #" +
                std::to_string(seq) + " (" + describe_last(by_rank.at(behind[i])) + ")";
      }
      return text;
    }
  }
  return "";
}

}  // namespace

std::string CollectiveRecord::describe() const {
  std::ostringstream out;
  out << op << " #" << seq;
  if (op == "barrier") {
    if (!label.empty()) out << " (unit " << label << ")";
    return out.str();
  }
  out << " (";
  if (!label.empty()) out << "unit " << label << ", ";
  out << numel << " x " << dtype << ")";
  return out.str();
}

FlightRecorder::FlightRecorder(size_t capacity) {
  TORCH_CHECK(capacity > 0, "fsdp: the flight recorder needs room for at least one record");
  ring_.resize(capacity);
}

int64_t FlightRecorder::record(const char* op, const std::string& label, const at::Tensor& input) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t seq = next_seq_++;
  CollectiveRecord& r = ring_[static_cast<size_t>((seq - 1) % static_cast<int64_t>(ring_.size()))];
  r.seq = seq;
  r.op = op;
  r.label = label;
  r.dtype = input.defined() ? std::string(c10::toString(input.scalar_type())) : "";
  r.numel = input.defined() ? input.numel() : 0;
  r.bytes = input.defined() ? static_cast<int64_t>(input.nbytes()) : 0;
  r.state = CollectiveState::kIssued;
  r.issued_at = CollectiveRecord::Clock::now();
  r.finished_at = {};
  return seq;
}

void FlightRecorder::finish(int64_t seq, CollectiveState state) {
  std::lock_guard<std::mutex> lock(mutex_);
  CollectiveRecord& r = ring_[static_cast<size_t>((seq - 1) % static_cast<int64_t>(ring_.size()))];
  if (r.seq != seq) return;
  r.state = state;
  r.finished_at = CollectiveRecord::Clock::now();
}

std::vector<CollectiveRecord> FlightRecorder::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<CollectiveRecord> out;
  const int64_t count = std::min<int64_t>(next_seq_ - 1, static_cast<int64_t>(ring_.size()));
  for (int64_t seq = next_seq_ - count; seq < next_seq_; ++seq) {
    out.push_back(ring_[static_cast<size_t>((seq - 1) % static_cast<int64_t>(ring_.size()))]);
  }
  return out;
}

std::string records_to_json(int rank, const std::string& group, int64_t timeout_ms,
                            const std::vector<CollectiveRecord>& records) {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  nlohmann::json doc = {{"rank", rank}, {"group", group}, {"timeout_ms", timeout_ms}};
  nlohmann::json entries = nlohmann::json::array();
  const auto origin =
      records.empty() ? CollectiveRecord::Clock::time_point{} : records.front().issued_at;
  for (const CollectiveRecord& r : records) {
    nlohmann::json e = {{"seq", r.seq},
                        {"op", r.op},
                        {"label", r.label},
                        {"dtype", r.dtype},
                        {"numel", r.numel},
                        {"bytes", r.bytes},
                        {"state", state_name(r.state)},
                        {"issued_us", duration_cast<microseconds>(r.issued_at - origin).count()}};
    if (r.state != CollectiveState::kIssued) {
      e["finished_us"] = duration_cast<microseconds>(r.finished_at - origin).count();
    }
    entries.push_back(std::move(e));
  }
  doc["collectives"] = std::move(entries);
  return doc.dump(1);
}

std::string encode_records(const std::vector<CollectiveRecord>& records) {
  std::ostringstream out;
  for (const CollectiveRecord& r : records) {
    out << r.seq << '\t' << r.op << '\t' << one_line(r.label) << '\t' << r.dtype << '\t' << r.numel
        << '\t' << state_name(r.state) << '\n';
  }
  return out.str();
}

std::vector<CollectiveRecord> decode_records(const std::string& text) {
  std::vector<CollectiveRecord> records;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    CollectiveRecord r;
    std::string seq;
    std::string numel;
    std::string state;
    if (!std::getline(fields, seq, '\t') || !std::getline(fields, r.op, '\t') ||
        !std::getline(fields, r.label, '\t') || !std::getline(fields, r.dtype, '\t') ||
        !std::getline(fields, numel, '\t') || !std::getline(fields, state)) {
      continue;  // a torn line from a peer that died while writing; the rest still counts
    }
    r.seq = std::stoll(seq);
    r.numel = std::stoll(numel);
    r.state = state_from_name(state);
    records.push_back(std::move(r));
  }
  return records;
}

std::string describe_divergence(const RecordsByRank& by_rank, int world_size) {
  std::string text = first_divergence(by_rank);
  if (text.empty()) {
    int64_t last = 0;
    for (const auto& entry : by_rank) last = std::max(last, last_seq(entry.second));
    text = last == 0 ? "no rank that reported had issued a collective"
                     : "the ranks that reported agree on every collective up to #" +
                           std::to_string(last) + ": " + who_is_where(by_rank, last) +
                           "; a peer or the transport failed";
  }
  std::vector<int> silent;
  for (int r = 0; r < world_size; ++r) {
    if (by_rank.count(r) == 0) silent.push_back(r);
  }
  if (!silent.empty()) {
    text +=
        "; " + join_ranks(silent) + " did" + " not report (exited, or stuck outside a collective)";
  }
  return text;
}

}  // namespace fsdp::detail
