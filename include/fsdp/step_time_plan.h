// Step-time planner: predicts, before training, how long one FSDP training step takes, how much
// of its communication the compute thread waits for, tokens/s, MFU and the rank's peak memory,
// from the model, the training mode and a description of the hardware.
//
// Method. The step is the memory estimator's replay of the runtime's schedule
// (src/estimate/step_replay.h: the same walk, so the same gathers, prefetches, reshards and
// reductions in the same order). Two kinds of timeline run through it:
//   compute  the rank's compute thread: each unit's forward and backward, from its matmuls
//            (2 m k n FLOPs each at an achieved rate that may depend on the matmul's size),
//            its attention (4 B H T^2 d_head FLOPs forward, counted over the full T x T as
//            torchtitan's MFU does) and its other work (bytes over the memory bandwidth);
//            backward does twice the forward's FLOPs and bytes, plus one forward again under
//            activation checkpointing; copies into and out of communication buffers and AdamW
//            are memory-bound too.
//   comm     one per process group, serial: gloo's progress thread (and NCCL's stream) runs one
//            collective at a time in issue order. A collective starts when it is issued and its
//            group is free, and lasts alpha + beta * size (fsdp-comm-bench's fit for that
//            collective and group size, or a ring over the hardware's links).
// Waiting for an all-gather or a reduction moves the compute thread to the collective's end;
// that wait is the exposed communication (fsdp-train's exposed_comm_s). The gradient-norm
// all-reduce of clipping, the trainer's all-reduce of the loss and AdamW end the step (those
// two scalar all-reduces block, but are not FSDP's, so they are not counted as exposed).
// On a CPU host a collective's transfers within the host are copies on the same cores that
// compute: the part of those collectives that ran hidden under compute (their time less their
// share of the exposed time) is added to the compute thread's, times comm_cpu_fraction; a
// collective between hosts is the network's and takes none ([Note: hidden collectives take CPU
// within a node]). What the planner does not model: kernel launch
// and framework overhead, and stragglers. Under tensor parallelism each rank computes its slices
// and waits for its tp group's collectives inside its units' compute (StepTimeOptions::
// tensor_parallel). bench/RESULTS.md compares predictions with measurements.
#pragma once

#include <fsdp/memory_estimate.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace fsdp {

// alpha-beta cost of moving bytes: time = alpha_s + beta_s_per_byte * bytes.
struct AlphaBeta {
  double alpha_s = 0;
  double beta_s_per_byte = 0;
};

// One collective's measured time by size, from fsdp-comm-bench --output's "fit": its alpha-beta
// line and, where the file has them, the points it was fitted to. With points the time is read
// off them ([Note: a collective's measured points], src/estimate/step_time_plan.cpp).
struct CollectiveFit {
  AlphaBeta line;
  std::vector<std::pair<double, double>> measured;  // (bytes, seconds), by increasing bytes
  double seconds(double bytes) const;
};

// A machine, as a hardware file (JSON, see bench/hardware/ and docs/planning.md) describes it.
// Rates are per device; on a CPU host (cpu_cores > 0) the device is the host, and the ranks
// launched on it share its cores as fsdp-train does (each max(1, cores / ranks) intra-op
// threads).
struct HardwareSpec {
  std::string name;
  // Memory per device (a CPU host's: shared by its ranks), in bytes.
  int64_t memory_bytes = 0;
  // Ranks per node: a collective over more ranks crosses the inter-node link.
  int devices_per_node = 1;
  // > 0: a CPU host with this many cores, shared by every rank (all ranks on one host).
  int cpu_cores = 0;
  // Fraction of one core's rate a rank gets per extra intra-op thread (W = 1 on a CPU host).
  double parallel_efficiency = 1;
  // Dense peak FLOP/s per dtype ("fp32", "bf16", "fp16"), per device.
  std::map<std::string, double> peak_flops;
  // Fraction of peak_flops a training matmul achieves (documented in the file: measured, or a
  // published GEMM efficiency). A size curve, when given, replaces it per matmul.
  double matmul_fraction = 0;
  // (FLOPs of one matmul, fraction of peak) in increasing FLOPs; interpolated in log FLOPs.
  std::vector<std::pair<double, double>> matmul_curve;
  // Fraction of peak_flops attention achieves (counted FLOPs, full T x T), and optionally a curve
  // over the head dimension.
  double attention_fraction = 0;
  std::vector<std::pair<double, double>> attention_curve;
  // Bytes per second of memory-bound work (copies, elementwise ops, AdamW).
  double memory_bandwidth = 0;
  // Seconds per parameter element of one AdamW step, when measured (0: 28 bytes per element
  // over memory_bandwidth: read parameter, gradient and two moments, write three).
  double adamw_s_per_param = 0;
  // Fraction of a collective's time its transfers keep one of the rank's cores busy (CPU hosts:
  // loopback sends and receives are copies by the CPU, so a collective that runs under compute
  // slows that compute down by about its own duration; 0 on a GPU, whose copies do not use the
  // cores that compute). (optional) defaults to 0.
  double comm_cpu_fraction = 0;
  // Fraction of compute's speed lost while a collective between nodes runs beside it (CPU
  // hosts: the kernel's TCP sends and receives run on the cores that compute;
  // bench/cluster/network_cpu.sh measures it). (optional) defaults to 0.
  double network_cpu_fraction = 0;
  // Per link, per direction: NVLink within a node, the network between nodes.
  AlphaBeta intra_node, inter_node;
  // Measured fits (fsdp-comm-bench --output's "fit"), by group size, then collective name
  // ("all_gather", "reduce_scatter", "all_reduce"); sizes are nccl-tests' (see bench.h).
  std::map<int, std::map<std::string, CollectiveFit>> collectives;
  // The same, measured over a group whose ranks are on different nodes (fsdp-comm-bench across
  // hosts): what a collective of a group that spans nodes takes ([Note: which groups cross
  // nodes], src/estimate/step_time_plan.cpp). Without one such a group is a ring over inter_node
  // on a GPU node, and takes collectives' fit on a CPU host, as a group within it.
  std::map<int, std::map<std::string, CollectiveFit>> inter_node_collectives;

  // Parses a hardware file's text; origin names it in errors. Throws naming a missing or bad
  // field and the file.
  static HardwareSpec from_json(const std::string& text, const std::string& origin);
};

// One forward matmul: [m, k] x [k, n].
struct Matmul {
  int64_t m = 0, k = 0, n = 0;
};

// What one unit computes in forward; backward does twice as much (plus the forward again under
// activation checkpointing).
struct UnitComputeSpec {
  std::vector<Matmul> matmuls;
  // Attention: batch x heads independent problems of seq x seq over head_dim (0: none).
  int64_t attention_batch_heads = 0, attention_seq = 0, attention_head_dim = 0;
  // Bytes read and written by the forward's work outside matmuls and attention.
  int64_t other_bytes = 0;
};

// A model's compute for one rank's micro-batch: the root's part before the units (embeddings),
// the units in forward order, and the root's part after them (final norm, output, loss).
struct ModelComputeSpec {
  UnitComputeSpec root_stem, root_head;
  std::vector<UnitComputeSpec> units;
  // Tokens of the micro-batch.
  int64_t tokens = 0;
  // Under tensor parallelism the specs above are one rank's part (its slices of the layers; the
  // modules it holds whole in full), and this is the whole model's forward FLOPs of the
  // micro-batch, for MFU. 0: the specs' own FLOPs (no tensor parallelism).
  double model_forward_flops = 0;
};

struct StepTimeOptions {
  // Strategy, world size, dtypes, hpZ, prefetch, accumulation: as for the memory estimator.
  TORCH_ARG(MemoryEstimateOptions, memory) = {};
  // Units recompute their forward in backward. (optional) defaults to false.
  TORCH_ARG(bool, activation_checkpoint) = false;
  // The step clips the gradient norm (fsdp-train does by default): one more pass over the
  // gradients and an all-reduce of a scalar. (optional) defaults to true.
  TORCH_ARG(bool, clip_grad_norm) = true;
  // The trainer all-reduces the step's loss for its report (fsdp-train does): one more scalar
  // all-reduce before the optimizer step. (optional) defaults to true.
  TORCH_ARG(bool, all_reduce_loss) = true;
  // Tensor-parallel ranks T: memory().world_size() is then the data-parallel size, the model's
  // specs are one rank's slices (ModelSpec::memory_spec's tp), and each unit's and the root's
  // TensorParallelBytes are collectives over T ranks that block the compute thread ([Note:
  // tensor-parallel collectives block the compute thread], src/estimate/step_time_plan.cpp).
  // The host's cores are shared by all W x T ranks. (optional) defaults to 1.
  TORCH_ARG(int, tensor_parallel) = 1;
};

struct StepTimePlan {
  double step_s = 0;
  double compute_s = 0;       // the compute thread's busy time
  double exposed_comm_s = 0;  // its time waiting for collectives
  double comm_s = 0;          // the collectives' own time, hidden or not
  double optimizer_s = 0;     // clipping and AdamW
  double tp_comm_s = 0;       // the compute thread's time in tensor-parallel collectives
  double tokens_per_s = 0;    // of the whole job
  // Model FLOPs (forward 2 m k n + attention, times 3; no recompute; the whole model's under
  // tensor parallelism) per step over step_s times the peak of the devices the job uses.
  double mfu = 0;
  double model_flops_per_step = 0;
  int64_t tokens_per_step = 0;
  // The memory estimator's answer for the same configuration.
  MemoryEstimate memory;
};

// The FLOPs of one forward of the specs: 2 m k n per matmul, 4 B H T^2 d_head per attention.
double forward_flops(const ModelComputeSpec& compute);

// One forward pass of a model's compute on one of world_size ranks sharing the hardware, by
// kind of work (the seconds plan_step_time charges; backward is twice each).
struct ForwardTimes {
  double matmul_s = 0, attention_s = 0, other_s = 0;
};
ForwardTimes forward_times(const ModelComputeSpec& compute, const HardwareSpec& hardware,
                           at::ScalarType compute_dtype, int world_size);

// Plans one steady-state step. memory and compute describe the same model and micro-batch.
// Throws naming the value on a bad configuration, or when the hardware file lacks what this
// one needs (the peak of the compute dtype).
StepTimePlan plan_step_time(const ModelMemorySpec& memory, const ModelComputeSpec& compute,
                            const StepTimeOptions& options, const HardwareSpec& hardware);

}  // namespace fsdp
