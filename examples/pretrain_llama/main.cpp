// Pretrains a registered Llama with FSDP on llm.c token shards, from the installed fsdp package
// alone: every transformer block one FSDP unit, a cosine learning-rate schedule after warm-up,
// the held-out loss every 10 steps, metrics as JSON lines, and a checkpoint every 10 steps (the
// newest 2 kept) that the same command, started again, resumes from. Launch with torchrun:
//   torchrun --nproc-per-node 2 --no-python ./pretrain_llama TRAIN VAL CKPT_DIR METRICS STEPS
//            [STOP_AFTER] [MODEL]
// TRAIN and VAL: token shards (a path, a glob or a comma-separated list); METRICS: this run's
// steps as JSON lines (a resumed run writes its own); STOP_AFTER: leave after that many steps
// (saving them), to be resumed; MODEL: a registered model, llama-tiny unless given.
#include <fsdp/clip_grad.h>
#include <fsdp/comm/rendezvous.h>
#include <fsdp/fully_shard.h>
#include <fsdp/models/model.h>
#include <fsdp/train/checkpoint_manager.h>
#include <fsdp/train/data_loader.h>
#include <fsdp/train/lr_schedule.h>
#include <fsdp/train/metrics_sink.h>

#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>

namespace ft = fsdp::train;

constexpr char kUsage[] = "usage: %s TRAIN VAL CKPT_DIR METRICS STEPS [STOP_AFTER] [MODEL]\n";
constexpr int64_t kEvery = 10;      // steps between held-out losses and between checkpoints
constexpr int64_t kValBatches = 2;  // global batches of held-out data per evaluation

// The mean over ranks of each rank's loss: the loss of the global batch.
double mean_over_ranks(const at::Tensor& loss, fsdp::ProcessGroup& group) {
  at::Tensor sum = loss.detach().to(at::kDouble).reshape({1});
  group.all_reduce(sum, fsdp::ReduceOp::kSum)->wait();
  return sum.item<double>() / group.size();
}

// Forward only over the same held-out batches every time (its loader never moves).
double held_out_loss(fsdp::models::Model& model, const ft::DataLoader& val,
                     fsdp::ProcessGroup& group) {
  torch::NoGradGuard no_grad;
  double sum = 0;
  for (int64_t b = 0; b < kValBatches; ++b) {
    const ft::Batch batch = val.batch_at(b);
    sum += mean_over_ranks(model.loss(model.forward(batch.inputs), batch.targets), group);
  }
  return sum / kValBatches;
}

// Every parameter starts as a function of (seed, name), so every rank builds the same model;
// each block is sharded as soon as it is built, the root (embeddings, norm, head) last.
std::unique_ptr<fsdp::models::Model> build_sharded(const fsdp::models::ModelSpec& spec,
                                                   const fsdp::DeviceMesh& mesh) {
  auto model = spec.build(fsdp::models::BuildOptions().seed(1).on_unit_built(
      [&](const std::string&, const std::shared_ptr<torch::nn::Module>& unit) {
        fsdp::fully_shard(unit, mesh);
      }));
  fsdp::fully_shard(model->root(), mesh);
  return model;
}

ft::TokenDataset load(const std::string& spec, const fsdp::models::ModelSpec& model) {
  ft::TokenSourceOptions options;
  options.vocab_size = model.vocab_size();  // every token id must be one the model embeds
  return ft::load_token_dataset(spec, options);
}

// Rank 0: the step's line (the loss to 17 digits, so that runs compare exactly) and metrics.
void report(const ft::StepRecord& record, ft::MetricsSink& metrics) {
  metrics.write(record);
  const std::string val = record.val_loss ? " val " + std::to_string(*record.val_loss) : "";
  std::printf("step %lld loss %.17g lr %.4e%s\n", static_cast<long long>(record.step), record.loss,
              record.lr, val.c_str());
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, kUsage, argv[0]);
    return 2;
  }
  const int64_t steps = std::stoll(argv[5]);
  const int64_t stop_after = argc > 6 ? std::stoll(argv[6]) : steps;
  auto group = fsdp::init_process_group(fsdp::launch_env_from_environment());
  const bool rank0 = group->rank() == 0;
  fsdp::DeviceMesh mesh(group);

  const auto spec = fsdp::models::model_spec(argc > 7 ? argv[7] : "llama-tiny");
  const auto model = build_sharded(*spec, mesh);
  const auto params = fsdp::unique_parameters(*model->root());
  torch::optim::AdamW optimizer(params, torch::optim::AdamWOptions(3e-3).weight_decay(0.1));

  // Batches are a function of (seed, step): a rank keeps its rows of each global batch.
  const ft::TokenDataset train = load(argv[1], *spec), val = load(argv[2], *spec);
  const auto rows = ft::DataLoaderOptions().global_batch(8).seq_len(64).rank(group->rank());
  ft::DataLoader loader(train, ft::DataLoaderOptions(rows).world_size(group->size()).seed(7));
  const ft::DataLoader val_loader(val, ft::DataLoaderOptions(rows).world_size(group->size()));
  const ft::LrSchedule schedule{ft::LrScheduleKind::kCosine, 3e-3, 3e-4, 5, 0.2, steps};

  // Resume "auto": from the newest checkpoint in CKPT_DIR, if there is one. The loader's
  // position travels as the checkpoint's user JSON.
  ft::CheckpointManager checkpoints(
      ft::CheckpointManagerOptions().dir(argv[3]).save_every(kEvery).keep_last(2), *model->root(),
      &optimizer, group.get());
  if (const auto resumed = checkpoints.load("auto")) {
    loader.load_state_json(resumed->user_json);
    if (rank0)
      std::printf("resumed from %s at step %lld\n", resumed->path.c_str(),
                  static_cast<long long>(loader.step()));
  }
  const int64_t first_step = loader.step();
  std::unique_ptr<ft::MetricsSink> metrics;
  if (rank0) metrics = std::make_unique<ft::JsonLinesSink>(argv[4]);

  while (loader.step() < std::min(steps, stop_after)) {
    const ft::Batch batch = loader.next();
    ft::StepRecord record;
    record.step = batch.step + 1;
    record.lr = ft::apply_lr(optimizer, schedule, batch.step);
    optimizer.zero_grad();
    const at::Tensor loss = model->loss(model->forward(batch.inputs), batch.targets);
    loss.backward();  // reduce-scatters each unit's gradients as it goes
    record.grad_norm = fsdp::clip_grad_norm_(params, 1.0, mesh);
    optimizer.step();
    record.loss = mean_over_ranks(loss, *group);
    if (record.step % kEvery == 0 || record.step == steps) {
      record.val_loss = held_out_loss(*model, val_loader, *group);
    }
    if (rank0) report(record, *metrics);
    if (checkpoints.due(record.step)) checkpoints.save(record.step, loader.state_json());
  }
  if (checkpoints.final_save_due(loader.step(), first_step)) {
    checkpoints.save(loader.step(), loader.state_json());
  }
  return 0;
}
