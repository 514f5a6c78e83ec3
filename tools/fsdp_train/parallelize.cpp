// Set-up of the mesh, the model and the optimizer (parallelize.h).
//
// Under FSDP the model is built with deferred initialization: each unit is sharded as soon as
// it is built, so a rank never holds more than the root's parameters plus one unit in full.
// Two layouts need the whole model first and give that up: --wrap-policy min-params:N (units
// are chosen by size across the built model) and --strategy whole_tensor (the partition needs
// every tensor's size).
#include <fsdp_train/parallelize.h>

#include <fsdp/comm/comm_hooks.h>
#include <fsdp/named_mesh.h>
#include <fsdp/runtime/whole_tensor.h>
#include <fsdp/tensor_parallel.h>
#include <fsdp/wrap_policy.h>
#include <fsdp_train/timeline.h>

#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <unordered_set>

namespace fsdp::train {
namespace {

// --device: the process group's device under FSDP (with its index), which must be the kind asked
// for; the current one of that kind for the --no-fsdp reference.
c10::Device device_of(const Run& run) {
  const c10::Device asked(run.o.parallelism.device == DeviceKind::kCuda ? c10::kCUDA : c10::kCPU);
  if (!run.group) return asked;
  const c10::Device group_device = run.group->device();
  TORCH_CHECK(group_device.type() == asked.type(), "--device ", run.o.parallelism.device, ": the ",
              run.group->backend_name(), " backend communicates on ", group_device,
              "; use a backend that communicates on ", run.o.parallelism.device);
  return group_device;
}

// --tp N: a dp x tp mesh (tp innermost), FSDP over dp. See [Note: the norm over tensor-parallel
// slices] for how clipping still takes FSDP's mesh alone.
void build_tensor_parallel_mesh(Run& run) {
  const int tp = run.o.parallelism.tp;
  const NamedMesh named(run.group, {{"dp", run.world / tp}, {"tp", tp}});
  run.mesh.emplace(named["dp"]);
  run.tp_mesh.emplace(named["tp"]);
  run.data_rank = named.coordinate("dp");
  run.data_world = named.size("dp");
}

void build_mesh(Run& run) {
  run.device = device_of(run);
  run.data_rank = run.rank;
  run.data_world = run.world;
  if (!run.group) return;
  if (run.o.parallelism.tp > 1) return build_tensor_parallel_mesh(run);
  const int replicate = run.o.parallelism.strategy == ShardingStrategy::kNoShard ? run.world
                        : run.o.parallelism.strategy == ShardingStrategy::kHybridShard
                            ? run.o.parallelism.replicate
                            : 1;
  run.mesh.emplace(DeviceMesh::hybrid(run.group, replicate));
}

MixedPrecisionPolicy mixed_precision_of(const JobConfig& o) {
  MixedPrecisionPolicy mp_policy;
  if (o.parallelism.param_dtype != at::kFloat) mp_policy.param_dtype(o.parallelism.param_dtype);
  mp_policy.reduce_dtype(o.parallelism.reduce_dtype);
  return mp_policy;
}

// Every unit's: mixed precision, and --offload (pinned only where there is a device to copy to).
FullyShardOptions shard_options(const Run& run, const MixedPrecisionPolicy& mp_policy) {
  FullyShardOptions options;
  options.mp_policy(mp_policy);
  options.observer(run.monitor);
  if (run.o.parallelism.shard_dim > 0) {
    const int64_t d = run.o.parallelism.shard_dim;
    options.shard_placement_fn(
        [d](const std::string&, const at::Tensor& p) -> std::optional<int64_t> {
          if (p.dim() > d) return d;
          return std::nullopt;
        });
  }
  if (run.o.parallelism.offload) {
    options.offload_policy(CPUOffloadPolicy().pin_memory(!run.device.is_cpu()));
  }
  return options;
}

// The blocks' FullyShardOptions: ZeRO-2 keeps every block's parameters from its forward to its
// backward; otherwise --reshard-after-forward decides (N >= 2: hpZ).
FullyShardOptions unit_shard_options(const Run& run, const MixedPrecisionPolicy& mp_policy) {
  FullyShardOptions unit_options = shard_options(run, mp_policy);
  const int reshard = run.o.parallelism.reshard_after_forward;
  if (run.o.parallelism.strategy == ShardingStrategy::kShardGradOp) {
    unit_options.reshard_after_forward(false);
  } else if (reshard >= 2) {
    unit_options.reshard_after_forward(reshard);
  } else {
    unit_options.reshard_after_forward(reshard == 1);
  }
  return unit_options;
}

// Moves the parameters no unit manages yet to device (a unit's are on the mesh's device, or on
// the host when offloaded, and stay there). Nothing moves on CPU.
void move_unsharded_parameters(torch::nn::Module& model, c10::Device device) {
  if (device.is_cpu()) return;
  std::unordered_set<const c10::TensorImpl*> sharded;
  for (const FSDPModule& unit : fsdp_modules_under(model)) {
    for (const ShardedParameter& p : unit.sharded_parameters()) {
      sharded.insert(p.local.unsafeGetTensorImpl());
    }
  }
  at::NoGradGuard no_grad;
  for (auto& p : unique_parameters(model)) {
    if (sharded.count(p.unsafeGetTensorImpl()) == 0) p.set_data(p.data().to(device));
  }
  for (auto& b : model.buffers()) b.set_data(b.data().to(device));
}

bool shards_whole_tensors(const Run& run) {
  return run.o.parallelism.strategy == ShardingStrategy::kWholeTensor;
}

// Builds the model on run.device; under FSDP with the model's own units and Shard(0) placement,
// each block is sharded as soon as it is built (deferred initialization).
void build_model(Run& run, const FullyShardOptions& unit_options) {
  models::BuildOptions model_options;
  model_options.seed(run.o.training.seed);
  model_options.activation_checkpoint(run.o.model.activation_checkpoint);
  if (run.mesh && !run.o.parallelism.wrap_policy.min_params && !shards_whole_tensors(run)) {
    const bool sequence_parallel = run.o.parallelism.sequence_parallel;
    const TensorParallelPlan plan =
        run.tp_mesh ? run.spec->unit_tp_plan(run.tp_mesh->shard_size(), sequence_parallel)
                    : TensorParallelPlan{};
    model_options.on_unit_built(
        [&run, unit_options, plan](const std::string&,
                                   const std::shared_ptr<torch::nn::Module>& block) {
          if (run.tp_mesh) parallelize_module(*block, *run.tp_mesh, plan);
          move_unsharded_parameters(*block, run.device);
          fully_shard(block, *run.mesh, unit_options);
        });
  }
  run.built = run.spec->build(model_options);
  run.model = run.built->root();
  if (run.tp_mesh) {  // the root's plan: where sequence parallelism splits and gathers
    parallelize_module(
        *run.model, *run.tp_mesh,
        run.spec->root_tp_plan(run.tp_mesh->shard_size(), run.o.parallelism.sequence_parallel));
  }
  move_unsharded_parameters(*run.model, run.device);
}

// --strategy whole_tensor: the model is built whole (the partition needs every tensor's size
// first), then each block and the root are sharded with one owner rank per tensor.
FSDPModule shard_whole_tensors(Run& run, const FullyShardOptions& unit_options,
                               const MixedPrecisionPolicy& mp_policy) {
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  for (const auto& unit : run.built->units()) units.push_back(unit.second);
  const auto options = WholeTensorShardOptions()
                           .partition(WholeTensorPartitionOptions().evenness_priority(
                               run.o.parallelism.evenness_priority))
                           .unit_options(unit_options)
                           .root_mp_policy(mp_policy);
  WholeTensorSharding sharding = whole_tensor_shard(run.model, units, *run.mesh, options);
  run.placement = sharding.partition.describe();
  return sharding.root;
}

// [Note: the head as a unit]
// GPT-2's root holds its tied embedding table, a third of the model: the root's all-gather is
// then the step's first wait (the lookup is the first op) and its reduction the last collective
// of backward (the lookup's gradient is the last to arrive), and neither has compute to hide
// behind. --head-unit makes the output head a unit (torchtitan's last unit, with
// reshard_after_forward false: its forward is the last and its backward the first, so a second
// gather would buy nothing). A tied table then belongs to the head's unit, whose gather is
// prefetched beside the blocks' forward and whose reduce-scatter runs right after the head's
// backward, beside the blocks'; the lookup in the root's forward reads the rows it needs from
// the table's shards and reduces their gradient itself (fsdp::embedding, [Note: a lookup from
// shards]), moving bytes in proportion to the batch's tokens instead of the table.
void shard_head(Run& run, const FullyShardOptions& unit_options) {
  FullyShardOptions head_options = unit_options;
  head_options.reshard_after_forward(false);
  fully_shard(run.built->head(), *run.mesh, head_options);
}

// The root unit, over the blocks build_model sharded or, under --wrap-policy min-params:N,
// over the units the policy chooses in the whole built model.
FSDPModule shard_root(Run& run, const FullyShardOptions& unit_options,
                      const MixedPrecisionPolicy& mp_policy) {
  const FullyShardOptions root_options = shard_options(run, mp_policy);
  if (shards_whole_tensors(run)) return shard_whole_tensors(run, unit_options, mp_policy);
  if (const std::optional<int64_t> min_params = run.o.parallelism.wrap_policy.min_params) {
    return fully_shard_tree(
        run.model, *run.mesh, size_based_wrap_policy(*min_params),
        FullyShardTreeOptions().unit_options(unit_options).root_options(root_options));
  }
  return fully_shard(run.model, *run.mesh, root_options);
}

// The settings every unit takes once the tree is sharded: prefetching, int8 all-gathers and how
// gradients are reduced.
void configure_units(Run& run) {
  const ParallelismConfig& p = run.o.parallelism;
  run.root->set_implicit_prefetch(p.prefetch);
  if (const auto block = p.all_gather.int8_block) {
    const auto int8 = std::make_shared<Int8AllGather>(*block);
    for (FSDPModule& unit : fsdp_modules_under(*run.model)) unit.set_custom_all_gather(int8);
  }
  for (FSDPModule unit : fsdp_modules_under(*run.model)) {
    if (p.gradient_divide_factor > 0) unit.set_gradient_divide_factor(p.gradient_divide_factor);
    unit.set_force_sum_reduction_for_comms(p.force_sum_reduction);
  }
  run.units = static_cast<int64_t>(fsdp_modules_under(*run.model).size());
}

// AdamW in two groups, as nanoGPT and torchtitan: --weight-decay on matrices and embeddings (2-D
// and up), none on biases and norm weights; with --decay-all one group, everything decays.
std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<at::Tensor>& params,
                                                    const JobConfig& o) {
  const auto options = torch::optim::AdamWOptions(o.training.lr).betas({0.9, 0.95});
  std::vector<at::Tensor> decayed, undecayed;
  for (const auto& p : params)
    (o.training.decay_all || p.dim() >= 2 ? decayed : undecayed).push_back(p);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty()) {
    groups.emplace_back(
        decayed, std::make_unique<torch::optim::AdamWOptions>(
                     torch::optim::AdamWOptions(options).weight_decay(o.training.weight_decay)));
  }
  if (!undecayed.empty()) {
    groups.emplace_back(undecayed, std::make_unique<torch::optim::AdamWOptions>(
                                       torch::optim::AdamWOptions(options).weight_decay(0)));
  }
  return std::make_unique<torch::optim::AdamW>(std::move(groups), options);
}

// fp16 under FSDP: dynamic loss scaling with the --init-scale and --growth-* settings.
void make_grad_scaler(Run& run) {
  const JobConfig& o = run.o;
  if (o.parallelism.param_dtype != at::kHalf || !run.mesh) return;
  run.scaler.emplace(*run.mesh, GradScalerOptions()
                                    .init_scale(o.training.grad_scaler.init_scale)
                                    .growth_factor(o.training.grad_scaler.growth_factor)
                                    .backoff_factor(o.training.grad_scaler.backoff_factor)
                                    .growth_interval(o.training.grad_scaler.growth_interval));
}

}  // namespace

void parallelize(Run& run) {
  const JobConfig& o = run.o;
  build_mesh(run);
  const MixedPrecisionPolicy mp_policy = mixed_precision_of(o);
  const FullyShardOptions unit_options = unit_shard_options(run, mp_policy);
  build_model(run, unit_options);
  if (run.mesh) {
    if (o.parallelism.head_unit) shard_head(run, unit_options);
    run.root = shard_root(run, unit_options, mp_policy);
    configure_units(run);
  }
  if (!o.metrics.trace_dir.empty() && run.mesh) trace_memory(*run.monitor);
  run.monitor->tracer().enable(!o.metrics.trace_dir.empty());
  run.params = unique_parameters(*run.model);
  run.optimizer = make_optimizer(run.params, o);
  make_grad_scaler(run);
}

}  // namespace fsdp::train
