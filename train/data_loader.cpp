// The loader (fsdp/train/data_loader.h). It holds no state but the step: the batches are
// TokenDataset::global_batch's, a pure function of (seed, step), so seeking is free and a
// resumed loader is the uninterrupted one.
#include <fsdp/train/data_loader.h>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

namespace fsdp::train {
namespace {

// What the saved state must share with this loader for its next_step to mean the same batches.
constexpr const char* kStateKeys[] = {"tokens", "seed", "global_batch", "seq_len"};

}  // namespace

DataLoader::DataLoader(const TokenDataset& data, const DataLoaderOptions& options)
    : data_(data), options_(options), step_(options.first_step()) {
  TORCH_CHECK(
      options_.world_size() > 0 && options_.rank() >= 0 && options_.rank() < options_.world_size(),
      "DataLoader: rank ", options_.rank(), " is outside world size ", options_.world_size());
  TORCH_CHECK(options_.global_batch() > 0 && options_.global_batch() % options_.world_size() == 0,
              "DataLoader: global batch size ", options_.global_batch(),
              " is not a positive multiple of world size ", options_.world_size());
  data_.check_seq_len(options_.seq_len());
  seek(options_.first_step());
}

Batch DataLoader::next() { return batch_at(step_++); }

Batch DataLoader::batch_at(int64_t step) const {
  const auto global =
      data_.global_batch(step, options_.global_batch(), options_.seq_len(), options_.seed());
  auto [inputs, targets] = micro_batch(global, options_.rank(), options_.world_size());
  return Batch{step, inputs, targets, global.first, global.second};
}

void DataLoader::seek(int64_t step) {
  TORCH_CHECK(step >= 0, "DataLoader: step must be non-negative, got ", step);
  step_ = step;
}

std::string DataLoader::state_json() const {
  const nlohmann::json state = {{"source", data_.source()},
                                {"tokens", data_.size()},
                                {"next_step", step_},
                                {"seed", options_.seed()},
                                {"global_batch", options_.global_batch()},
                                {"seq_len", options_.seq_len()}};
  return state.dump();
}

void DataLoader::load_state_json(const std::string& state) {
  const auto saved = nlohmann::json::parse(state, nullptr, false);
  TORCH_CHECK(
      saved.is_object() && saved.contains("next_step") && saved["next_step"].is_number_integer(),
      "DataLoader: a loader state is a JSON object with an integer next_step, got ",
      state.substr(0, 200));
  const auto now = nlohmann::json::parse(state_json());
  for (const char* key : kStateKeys) {
    TORCH_CHECK(!saved.contains(key) || saved[key] == now[key],
                "DataLoader: the state was saved with ", key, " ", saved[key].dump(),
                ", this loader has ", now[key].dump(), "; its next_step would name other batches");
  }
  seek(saved["next_step"].get<int64_t>());
}

}  // namespace fsdp::train
