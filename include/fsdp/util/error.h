// Error text helpers shared by the library, the trainer and the tests.
#pragma once

#include <exception>
#include <string>

namespace fsdp {

// The message of an exception, without the C++ backtrace LibTorch appends to c10::Error.
std::string error_message(const std::exception& e);
// Same for a captured exception; "unknown exception" for one that is not a std::exception.
std::string error_message(const std::exception_ptr& error);

}  // namespace fsdp
