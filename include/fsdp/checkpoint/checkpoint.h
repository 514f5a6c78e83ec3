// Checkpoints of (sharded) models and their AdamW state.
//
// Sharded checkpoints: every rank writes the rows it owns of each parameter and of its AdamW
// state (exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad) to its own safetensors file, in
// parallel; rank 0 adds metadata.json (format.h's CheckpointIndex: global shapes, dtypes, which
// rank holds which rows, checksums, the step, each rank's RNG state and the caller's JSON). A
// checkpoint loads on any world size and with or without FSDP: each rank reads just the rows
// it now owns, from whichever files hold them (4 ranks -> 2, 2 -> 3, FSDP -> plain and back).
// A parameter sharded along a dim d > 0 (FullyShardOptions::shard_placement_fn) owns no rows:
// its tensors are gathered whole to be written by one rank, and each rank reads them whole and
// keeps its slices along d, so it too moves between placements and world sizes.
//
//   root/step_00000100/rank_00000-of-00004.safetensors ... metadata.json
//   root/latest                                   "step_00000100": the newest complete one
//
// Crash safety: files are written under root/.tmp-step_<n>/, fsync'd, and the directory is
// renamed into place (atomically exchanged with an existing one) before `latest` is replaced by
// rename; a process killed at any point leaves the previous checkpoint and `latest` intact.
//
// Full checkpoints: one safetensors file of full tensors, gathered to rank 0 one parameter at a
// time (rank 0 never holds more than one full parameter beyond its shards), named and laid out
// by a FullLayout, e.g. Hugging Face's for GPT-2 (models/gpt2/hf.h), so that other tools read
// it directly. load_full initializes a (sharded) model from such a file, each rank reading only
// its rows.
//
// Every function here is collective over group (null for a single, unsharded process): every
// rank calls it with the same arguments. Failures are agreed on: when any rank fails, every
// rank throws, with each failing rank's message, instead of leaving the others waiting.
// Parameters must be sharded (between steps, not inside forward/backward) and on the CPU.
#pragma once

#include <fsdp/comm/process_group.h>
#include <fsdp/grad_scaler.h>

#include <c10/core/ScalarType.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace fsdp::checkpoint {

// --- sharded checkpoints ---

struct SaveOptions {
  // The training step the checkpoint holds; names its directory step_<step, 8 digits>.
  // (optional) defaults to 0.
  TORCH_ARG(int64_t, step) = 0;
  // A JSON object stored in metadata.json as "user" (e.g. the run's configuration
  // and data position). (optional) defaults to "{}".
  TORCH_ARG(std::string, user_json) = "{}";
  // After a save, checkpoints under root other than the newest keep_last (the one just written
  // among them) are deleted; 0 keeps all. (optional) defaults to 2.
  TORCH_ARG(int, keep_last) = 2;
  // fp16's gradient scaler state (ShardedGradScaler::state(), the same on every rank), stored
  // once in metadata.json. (optional) defaults to none.
  TORCH_ARG(std::optional<GradScalerState>, grad_scaler) = std::nullopt;
};

struct SaveResult {
  std::string path;    // the checkpoint directory, root/step_<step>
  int64_t bytes = 0;   // of every rank's file (metadata.json not counted)
  double seconds = 0;  // wall time of the whole collective save, as seen by this rank
};

// Saves model's parameters and, when optimizer is given (a torch::optim::AdamW over them), its
// state under root (created if missing). Blocks until the checkpoint is complete and durable
// on every rank. Throws naming the rank, the file and the system's reason on failure; the
// previous checkpoint then stays the latest. Test hook: with FSDP_CHECKPOINT_KILL_AT=
// "<step>:<rank>:<bytes>" in the environment, that rank SIGKILLs its own process after writing
// that many bytes of its file in the save of that step.
SaveResult save_sharded(const std::string& root, const torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer, ProcessGroup* group,
                        const SaveOptions& options = {});

struct LoadResult {
  std::string path;  // the checkpoint directory read
  int64_t step = 0;
  std::string user_json;  // SaveOptions::user_json of the save
  // SaveOptions::grad_scaler of the save, for ShardedGradScaler::load_state (any world size).
  std::optional<GradScalerState> grad_scaler;
  int saved_world_size = 1;
  int64_t bytes_read = 0;        // by this rank
  int64_t checkpoint_bytes = 0;  // of all the checkpoint's rank files
  double seconds = 0;
};

// The checkpoint directory that path names: path itself if it holds metadata.json, else the
// one that path/latest names. Throws when there is neither.
std::string resolve_checkpoint(const std::string& path);

// Loads a sharded checkpoint (a directory, or a root with `latest`) into model, resharding to
// this run's world size and layout, and into optimizer's state when both the checkpoint and
// the call have one; restores this rank's CPU RNG state (the saved state of the same rank, or
// rank 0's when the checkpoint had fewer ranks). Validates everything first: the index, that
// every rank's file exists with the recorded size and a valid header, and that the model
// matches (the error lists missing, unexpected and mis-shaped tensors with their shapes). Every
// slice read is checked against its checksum; a mismatch throws naming the file and tensor,
// after which the model's values and existing optimizer states are unspecified (states the
// load had to create are removed again).
LoadResult load_sharded(const std::string& path, torch::nn::Module& model,
                        torch::optim::Optimizer* optimizer, ProcessGroup* group);

// --- either sharded format ---

// The layouts a sharded checkpoint can take: ours (above: one file per rank and metadata.json)
// or PyTorch DCP's Hugging Face layout (dcp_hf.h), which PyTorch FSDP2 reads and writes.
enum class CheckpointFormat { kSharded, kDcpHf };

// "sharded" and "dcp-hf", and back (nullopt for any other name); every name, in enum order.
const char* checkpoint_format_name(CheckpointFormat format);
std::optional<CheckpointFormat> parse_checkpoint_format(const std::string& name);
std::vector<std::string> checkpoint_format_names();

// The format of the checkpoint at path (a checkpoint directory, or a root whose `latest` names
// one). Throws when path holds no checkpoint of either format.
CheckpointFormat checkpoint_format_of(const std::string& path);

// save_sharded or save_dcp_hf.
SaveResult save_checkpoint(CheckpointFormat format, const std::string& root,
                           const torch::nn::Module& model, torch::optim::Optimizer* optimizer,
                           ProcessGroup* group, const SaveOptions& options = {});
// load_sharded or load_dcp_hf, whichever checkpoint_format_of(path) says.
LoadResult load_checkpoint(const std::string& path, torch::nn::Module& model,
                           torch::optim::Optimizer* optimizer, ProcessGroup* group);

// --- full checkpoints ---

// How a model's parameters are named and laid out in a full checkpoint file. The defaults
// keep the model's own names and layout.
struct FullLayout {
  // The file's name for a parameter. (optional) defaults to the parameter's own name.
  TORCH_ARG(std::function<std::string(const std::string&)>, to_file) = nullptr;
  // Whether a 2-D parameter is stored transposed. (optional) defaults to never.
  TORCH_ARG(std::function<bool(const std::string&)>, transposed) = nullptr;
  // The parameter a file key holds, or nullopt for keys a loader skips (e.g. buffers another
  // tool stores). (optional) defaults to the key itself.
  TORCH_ARG(std::function<std::optional<std::string>(const std::string&)>, from_file) = nullptr;
};

using StringMap = std::map<std::string, std::string>;

struct ExportOptions {
  // Element type written. (optional) defaults to each parameter's own (e.g. float32); kBFloat16
  // halves the file.
  TORCH_ARG(std::optional<at::ScalarType>, dtype) = std::nullopt;
  TORCH_ARG(FullLayout, layout) = {};
  // Extra __metadata__ entries ("format": "pt" is always written).
  TORCH_ARG(StringMap, metadata) = {};
  // Split the file as transformers' save_pretrained(max_shard_size) does: parameters, in order,
  // into files of at most this many bytes of tensor data (a larger tensor alone in its file),
  // model-<k>-of-<n>.safetensors in path's directory, with model.safetensors.index.json; path
  // itself is then removed if it exists. 0, or a model that fits in one file, writes path alone
  // (and removes the directory's model.safetensors.index.json if path is its model.safetensors,
  // so that a directory load finds the new file).
  // (optional) defaults to 0.
  TORCH_ARG(int64_t, max_shard_bytes) = 0;
};

struct ExportResult {
  int64_t bytes = 0;
  double seconds = 0;
};

// Writes every distinct parameter of model, unsharded, to the safetensors file path (via a
// temporary file, fsync and rename), on rank 0, with per-tensor checksums in its metadata; or,
// with max_shard_bytes, to Hugging Face's sharded files and index beside path.
ExportResult save_full(const std::string& path, const torch::nn::Module& model, ProcessGroup* group,
                       const ExportOptions& options = {});

// Sets every parameter of model (sharded or not) from the safetensors file path, converting
// dtypes and undoing the layout's transposes; each rank reads only its own rows, plus, when the
// file stores checksums, whole tensors i with i % world == rank, whose checksums it verifies.
// path may also be a Hugging Face sharded checkpoint: its index file (*.index.json, whose
// weight_map names the file of every tensor, beside the index) or a directory holding
// model.safetensors (or else model.safetensors.index.json, transformers' order); each rank then
// opens every shard
// file but reads only its rows of each tensor. Throws listing missing, unexpected and
// mis-shaped keys with their shapes when the files do not match the model, and naming the
// file when an index disagrees with the files' contents.
void load_full(const std::string& path, torch::nn::Module& model, ProcessGroup* group,
               const FullLayout& layout = {});

}  // namespace fsdp::checkpoint
