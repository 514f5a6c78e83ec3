// fsdp-plan's command line (tools/common/program.h): predicts an fsdp-train run's step time,
// tokens/s, MFU and memory from a hardware file, or measures this machine (--calibrate).
#pragma once

#include <common/program.h>

#include <memory>

namespace fsdp::tools {

std::unique_ptr<ProgramCli> make_plan_cli();

}  // namespace fsdp::tools
