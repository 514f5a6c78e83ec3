// Sharded checkpoints in PyTorch DCP's Hugging Face layout, so that a job moves between
// PyTorch FSDP2 and fsdp in either direction, weights and AdamW state both.
//
// On disk (under root, with checkpoint.h's step directories, `latest` and crash safety):
//
//   root/step_00000100/model/shard-00001-model-00001-of-00001.safetensors   rank 0's chunks
//                           shard-00002-model-00001-of-00001.safetensors   rank 1's ...
//                      optim/shard-00001-model-00001-of-00001.safetensors   AdamW state
//                      fsdp.json                                            our manifest
//
// model/ is exactly what torch.distributed.checkpoint.HuggingFaceStorageWriter(path,
// save_distributed=True) writes for an FSDP2 model's get_model_state_dict(): each rank's rows
// of every parameter under the parameter's name, with DCP_SHARDING_INFO giving their offsets
// (format.h). A tied parameter is stored once, under its first name: the writer refuses tensors
// that share memory. optim/ is the same writer's output for the tensors of
// get_optimizer_state_dict(..., StateDictOptions(flatten_optimizer_state_dict=True)):
// "state.<parameter>.exp_avg", "...exp_avg_sq" (and "...max_exp_avg_sq" with amsgrad) chunked
// like their parameter, and "state.<parameter>.step", a 0-D float32 tensor held by one rank.
// [Note: DCP-HF and the optimizer] says why the hyper-parameters are not in it. fsdp.json
// holds what DCP's layout has no room for: the step, each rank's RNG state, fp16's loss scale,
// the caller's JSON and every file's size. DCP's reader ignores it; a checkpoint without it
// (one FSDP2 wrote) loads all the same.
//
// From PyTorch (dcp = torch.distributed.checkpoint, HF = its HuggingFace* classes):
//   sd = {k: v for k, v in get_model_state_dict(model).items() if k in
//   dict(model.named_parameters())} dcp.load(sd,
//   storage_reader=HuggingFaceStorageReader(f"{step_dir}/model")) (optimizer likewise,
//   docs/checkpoints.md: "PyTorch DCP's Hugging Face layout")
#pragma once

#include <fsdp/checkpoint/checkpoint.h>

#include <string>

namespace fsdp::checkpoint {

// Whether dir is a checkpoint directory of this layout (it holds model/).
bool is_dcp_hf_checkpoint(const std::string& dir);

// Saves model's parameters and, when optimizer is given (a torch::optim::AdamW over them), its
// state under root/step_<step>/ in this layout. Each rank writes its own files, in parallel;
// rows held by several ranks (HSDP replicas, unsharded parameters) are written once, by the
// first rank holding them. A Shard(d > 0) parameter is stored as each rank's slab along d (its
// offsets say where), as FSDP2 stores it. Blocks until the checkpoint is complete and durable
// on every rank; collective, failures agreed on, as save_sharded.
SaveResult save_dcp_hf(const std::string& root, const torch::nn::Module& model,
                       torch::optim::Optimizer* optimizer, ProcessGroup* group,
                       const SaveOptions& options = {});

// Loads a checkpoint of this layout: a step directory, or a root whose `latest` names one; ours
// or one that FSDP2 wrote with HuggingFaceStorageWriter into DIR/model (and DIR/optim). Each rank
// reads only the chunks that overlap the rows it now holds, at any world size and placement,
// converting element types. Validates first: every file's header and DCP_SHARDING_INFO, that
// each tensor's chunks tile it, the manifest (when there is one) against the files, and that the
// model matches (missing, unexpected and mis-shaped tensors listed; a tied parameter's other
// names are accepted and skipped). The optimizer's state is loaded when both the call and the
// checkpoint have one (optim/): every state tensor and step the optimizer's parameters need must
// be there. Chunks written by us carry checksums, verified as they are read. step is the
// manifest's, else the largest "state.*.step" (0 without either); saved_world_size the
// manifest's, else the number of model files. Collective, failures agreed on, as load_sharded.
LoadResult load_dcp_hf(const std::string& path, torch::nn::Module& model,
                       torch::optim::Optimizer* optimizer, ProcessGroup* group);

}  // namespace fsdp::checkpoint
