// fsdp-tokenize's command line (tools/common/program.h): tokenizes text and JSON-lines files
// into an llm.c token shard. No LibTorch.
#pragma once

#include <common/program.h>

#include <memory>

namespace fsdp::tools {

std::unique_ptr<ProgramCli> make_tokenize_cli();

}  // namespace fsdp::tools
