// fsdp-estimate: see tools/fsdp_estimate/cli.cpp.
#include "fsdp_estimate/cli.h"

int main(int argc, char** argv) {
  return fsdp::tools::run_program(*fsdp::tools::make_estimate_cli(), argc, argv);
}
