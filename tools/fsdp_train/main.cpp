// fsdp-train: see tools/fsdp_train/cli.cpp.
#include "fsdp_train/cli.h"

int main(int argc, char** argv) {
  return fsdp::tools::run_program(*fsdp::tools::make_train_cli(), argc, argv);
}
