// fsdp-comm-bench's command line (tools/common/program.h): collective latency and bandwidth.
#pragma once

#include <common/program.h>

#include <memory>

namespace fsdp::tools {

std::unique_ptr<ProgramCli> make_comm_bench_cli();

}  // namespace fsdp::tools
