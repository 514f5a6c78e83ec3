// What rank 0 prints (nothing under --quiet): the banner before training, a line per logged
// step, and the final loss.
#pragma once

#include <fsdp/train/token_dataset.h>
#include <fsdp_train/run.h>
#include <fsdp_train/trainer.h>

namespace fsdp::train {

// The model, the ranks, the steps and the data; the FSDP units and their sizes; the int8
// all-gather and whole_tensor placement when used.
void print_banner(const Run& run, const TokenDataset& data, double unigram_entropy);

// The step's line, every --log-every steps, at the first and the last, and with a held-out loss.
void print_progress(const Run& run, const StepRecord& record);

// The final loss against the data's unigram entropy, when a step ran.
void print_final(const Run& run, const TrainSummary& summary);

}  // namespace fsdp::train
