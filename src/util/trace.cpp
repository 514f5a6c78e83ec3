// Chrome trace-event output; see include/fsdp/util/trace.h.
#include <fsdp/util/trace.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <fstream>

namespace fsdp {
namespace {

double micros(Tracer::Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(t.time_since_epoch()).count();
}

}  // namespace

void Tracer::complete(const char* category, std::string name, Clock::time_point begin,
                      Clock::time_point end, std::string unit, int64_t bytes, const char* track) {
  if (!enabled_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    events_.push_back({category, std::move(name), begin, end, std::move(unit), bytes, track});
  }
  sample_counters();
}

void Tracer::sample_counters() {
  if (!enabled_ || !sampler_) return;
  // Sampled outside the lock: the sampler takes locks of its own.
  Sample sample = sampler_();
  const Clock::time_point at = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  samples_.push_back({at, std::move(sample)});
}

void Tracer::set_counter_sampler(std::string name, std::function<Sample()> sampler) {
  std::lock_guard<std::mutex> lock(mutex_);
  counter_name_ = std::move(name);
  sampler_ = std::move(sampler);
}

size_t Tracer::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

void Tracer::write_chrome_trace(const std::string& path, int rank) const {
  nlohmann::json events = nlohmann::json::array();
  // Name the process and give compute and communication their own rows.
  events.push_back({{"name", "process_name"},
                    {"ph", "M"},
                    {"pid", rank},
                    {"args", {{"name", "rank " + std::to_string(rank)}}}});
  const char* tracks[] = {"compute", "comm"};
  for (int tid = 0; tid < 2; ++tid) {
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", rank},
                      {"tid", tid},
                      {"args", {{"name", tracks[tid]}}}});
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Event& e : events_) {
      nlohmann::json args = nlohmann::json::object();
      if (!e.unit.empty()) args["unit"] = e.unit;
      if (e.bytes >= 0) args["bytes"] = e.bytes;
      events.push_back({{"name", e.name},
                        {"cat", e.category},
                        {"ph", "X"},
                        {"ts", micros(e.begin)},
                        {"dur", std::max(0.0, micros(e.end) - micros(e.begin))},
                        {"pid", rank},
                        {"tid", std::string(e.track) == "comm" ? 1 : 0},
                        {"args", args}});
    }
    for (const CounterSample& c : samples_) {
      nlohmann::json args = nlohmann::json::object();
      for (const auto& [series, value] : c.values) args[series] = value;
      events.push_back({{"name", counter_name_},
                        {"ph", "C"},
                        {"ts", micros(c.at)},
                        {"pid", rank},
                        {"args", args}});
    }
  }
  std::ofstream out(path, std::ios::out | std::ios::trunc);
  TORCH_CHECK(out.good(), "cannot open trace file '", path, "' for writing");
  out << nlohmann::json{{"traceEvents", events}, {"displayTimeUnit", "ms"}}.dump();
  TORCH_CHECK(out.good(), "writing trace file '", path, "' failed");
}

}  // namespace fsdp
