// fsdp-comm-bench: see tools/fsdp_comm_bench/cli.cpp.
#include "fsdp_comm_bench/cli.h"

int main(int argc, char** argv) {
  return fsdp::tools::run_program(*fsdp::tools::make_comm_bench_cli(), argc, argv);
}
