// fsdp-estimate's command line (tools/common/program.h): predicts one rank's memory for an
// fsdp-train run, without running it.
#pragma once

#include <common/program.h>

#include <memory>

namespace fsdp::tools {

std::unique_ptr<ProgramCli> make_estimate_cli();

}  // namespace fsdp::tools
