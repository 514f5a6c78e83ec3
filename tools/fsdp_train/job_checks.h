// The checks of a job's settings against each other, the world size, the model and the data
// (job_checks.cpp), and the model the settings name.
#pragma once

#include <train/job_config.h>

#include <memory>

namespace fsdp::models {
class ModelSpec;
}  // namespace fsdp::models

namespace fsdp::train {

class JobTokenizer;

// The model --model names, with the size overrides (and a tokenizer's vocabulary) applied.
// tokenizer: job's --tokenizer, read here when its vocabulary sizes the model.
std::shared_ptr<const models::ModelSpec> model_spec_of(const JobConfig& job,
                                                       JobTokenizer& tokenizer);

// Validates the settings against each other and world (positive sizes, the global batch
// divisible by world, ...), resolves the model (model_spec_of) and checks it against the
// settings; reads no data but the tokenizer. Throws naming the flag and its value. Returns the
// model.
std::shared_ptr<const models::ModelSpec> check_job(const JobConfig& job, int world,
                                                   JobTokenizer& tokenizer);

// check_job, then loads --data and --val-data when given, so that a missing or short file fails
// before any rank starts. Returns the model.
std::shared_ptr<const models::ModelSpec> validate(const JobConfig& job, int world);

}  // namespace fsdp::train
