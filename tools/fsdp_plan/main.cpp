// fsdp-plan: see tools/fsdp_plan/cli.cpp.
#include "fsdp_plan/cli.h"

int main(int argc, char** argv) {
  return fsdp::tools::run_program(*fsdp::tools::make_plan_cli(), argc, argv);
}
