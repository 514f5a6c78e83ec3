// How the programs end on an error: one line on stderr, "<program>: error: <message>" (for
// LibTorch's errors, the message without its C++ backtrace), and exit status 1.
#pragma once

#include <c10/util/Exception.h>

#include <cstdio>
#include <exception>

namespace fsdp::tools {

// Returns body(), or 1 after printing the error line when body throws.
template <typename Body>
int run_reporting_errors(const char* program, Body&& body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
  }
  return 1;
}

}  // namespace fsdp::tools
