// fsdp-tokenize: see tools/fsdp_tokenize/cli.cpp.
#include "fsdp_tokenize/cli.h"

int main(int argc, char** argv) {
  return fsdp::tools::run_program(*fsdp::tools::make_tokenize_cli(), argc, argv);
}
