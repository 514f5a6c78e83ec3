// fsdp-train's command line (tools/common/program.h): every flag, the checks before any rank
// starts, and how the process runs (one process, one rank of a launcher's job, or N local
// ranks).
#pragma once

#include <common/program.h>

#include <memory>

namespace fsdp::tools {

std::unique_ptr<ProgramCli> make_train_cli();

}  // namespace fsdp::tools
