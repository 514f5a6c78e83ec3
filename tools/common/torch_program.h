// The base of the programs on LibTorch (all but fsdp-tokenize): an error line carries LibTorch's
// message without its C++ backtrace, which is for the library's developers, not a user who gave
// a bad flag.
#pragma once

#include <common/program.h>

#include <c10/util/Exception.h>

#include <string>

namespace fsdp::tools {

class TorchProgramCli : public ProgramCli {
 public:
  std::string error_line(const std::exception& e) const override {
    const auto* torch_error = dynamic_cast<const c10::Error*>(&e);
    return std::string(name()) + ": error: " +
           (torch_error != nullptr ? torch_error->what_without_backtrace() : e.what());
  }
};

}  // namespace fsdp::tools
