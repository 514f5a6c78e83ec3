// Byte-level dataset and the deterministic global batch.
//
// Invariants: a global batch depends only on (text, step, global_batch, seq_len, seed). Sample
// offsets come from our own SplitMix64 stream with unbiased rejection sampling, not from torch's
// global generator (shared by rank threads, and advanced by unrelated code) nor from <random>'s
// distributions (whose outputs differ between standard libraries). World size never enters:
// micro-batches are slices of the global batch.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <fsdp/data/labeled.h>
#include <fsdp/train/token_dataset.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <system_error>
#include <vector>

namespace fsdp::train {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Uniform integers in [0, n) from a SplitMix64 stream.
class OffsetSampler {
 public:
  explicit OffsetSampler(uint64_t seed) : state_(seed) {}
  uint64_t below(uint64_t n) {
    // Reject the top sliver of the 64-bit range that would favour small values.
    const uint64_t limit =
        std::numeric_limits<uint64_t>::max() - std::numeric_limits<uint64_t>::max() % n;
    uint64_t x;
    do {
      x = splitmix64(state_);
      state_ += 0x9E3779B97F4A7C15ULL;
    } while (x >= limit);
    return x % n;
  }

 private:
  uint64_t state_;
};

std::string system_error_text(int error) {
  return std::error_code(error, std::generic_category()).message();
}

}  // namespace

TokenDataset::TokenDataset(const std::string& text, std::string source)
    : source_(std::move(source)) {
  tokens_ = at::empty({static_cast<int64_t>(text.size())}, at::TensorOptions().dtype(at::kByte));
  if (!text.empty()) std::memcpy(tokens_.data_ptr<uint8_t>(), text.data(), text.size());
}

TokenDataset TokenDataset::from_file(const std::string& path) {
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> file(std::fopen(path.c_str(), "rb"),
                                                       &std::fclose);
  TORCH_CHECK(file != nullptr, "cannot open training text '", path,
              "': ", system_error_text(errno));
  std::string text;
  char buffer[1 << 16];
  size_t n;
  while ((n = std::fread(buffer, 1, sizeof(buffer), file.get())) > 0) text.append(buffer, n);
  // A directory opens fine on Linux and fails here, with EISDIR.
  TORCH_CHECK(!std::ferror(file.get()), "cannot read training text '", path,
              "': ", system_error_text(errno));
  return TokenDataset(text, "training text '" + path + "'");
}

TokenDataset::TokenDataset(at::Tensor tokens, std::string source)
    : tokens_(std::move(tokens)), source_(std::move(source)) {
  TORCH_CHECK(tokens_.dim() == 1 && tokens_.device().is_cpu() &&
                  (tokens_.scalar_type() == at::kByte || tokens_.scalar_type() == at::kInt),
              source_, ": token ids must be a 1-D uint8 or int32 CPU tensor, got ",
              tokens_.scalar_type(), " of ", tokens_.dim(), " dimensions");
}

TokenDataset::TokenDataset(at::Tensor tokens, at::Tensor labels, std::string source)
    : TokenDataset(std::move(tokens), std::move(source)) {
  labels_ = std::move(labels);
  TORCH_CHECK(tokens_.scalar_type() == at::kInt && labels_.scalar_type() == at::kInt &&
                  labels_.dim() == 1 && labels_.device().is_cpu() &&
                  labels_.size(0) == tokens_.size(0),
              source_, ": labels must be a 1-D int32 CPU tensor as long as the int32 token ids (",
              tokens_.size(0), "), got ", labels_.scalar_type(), " of shape ", labels_.sizes());
}

void TokenDataset::check_seq_len(int64_t seq_len) const {
  const char* unit = tokens_.scalar_type() == at::kByte ? "bytes" : "tokens";
  TORCH_CHECK(seq_len > 0, "seq_len must be positive, got ", seq_len);
  TORCH_CHECK(size() >= seq_len + 1, source_, " has ", size(), " ", unit, ", but seq_len ", seq_len,
              " needs at least ", seq_len + 1, " (one window of seq_len + 1 ", unit, ")");
}

std::pair<at::Tensor, at::Tensor> TokenDataset::global_batch(int64_t step, int64_t global_batch,
                                                             int64_t seq_len, uint64_t seed) const {
  TORCH_CHECK(global_batch > 0, "global batch size must be positive, got ", global_batch);
  TORCH_CHECK(step >= 0, "step must be non-negative, got ", step);
  check_seq_len(seq_len);
  const uint64_t windows = static_cast<uint64_t>(size() - seq_len);  // valid start offsets
  OffsetSampler sampler(splitmix64(splitmix64(seed) + static_cast<uint64_t>(step)));
  std::vector<int64_t> offsets(global_batch);
  for (auto& offset : offsets) offset = static_cast<int64_t>(sampler.below(windows));

  const auto long_options = at::TensorOptions().dtype(at::kLong);
  at::Tensor starts = at::from_blob(offsets.data(), {global_batch, 1}, long_options);
  at::Tensor index = starts + at::arange(seq_len + 1, long_options);  // [B, T + 1]
  at::Tensor windows_tensor =
      tokens_.index_select(0, index.view({-1})).view({global_batch, seq_len + 1}).to(at::kLong);
  if (labeled()) {
    // A window's first label belongs to no prediction: the targets start at its second.
    const at::Tensor targets =
        labels_.index_select(0, index.slice(1, 1, seq_len + 1).reshape({-1})).to(at::kLong);
    return {windows_tensor.slice(1, 0, seq_len).contiguous(),
            targets.view({global_batch, seq_len})};
  }
  return {windows_tensor.slice(1, 0, seq_len).contiguous(),
          windows_tensor.slice(1, 1, seq_len + 1).contiguous()};
}

int64_t trained_targets(const at::Tensor& targets) {
  return (targets != data::kIgnoreIndex).sum().item<int64_t>();
}

at::Tensor micro_batch(const at::Tensor& global, int64_t rank, int64_t world) {
  TORCH_CHECK(world > 0, "world size must be positive, got ", world);
  TORCH_CHECK(rank >= 0 && rank < world, "rank ", rank, " is outside world size ", world);
  TORCH_CHECK(global.dim() >= 1, "a global batch needs a batch dimension, got a 0-D tensor");
  const int64_t batch = global.size(0);
  TORCH_CHECK(batch % world == 0, "global batch size ", batch, " is not divisible by world size ",
              world);
  const int64_t rows = batch / world;
  return global.slice(0, rank * rows, (rank + 1) * rows);
}

std::pair<at::Tensor, at::Tensor> micro_batch(const std::pair<at::Tensor, at::Tensor>& global,
                                              int64_t rank, int64_t world) {
  return {micro_batch(global.first, rank, world), micro_batch(global.second, rank, world)};
}

}  // namespace fsdp::train
