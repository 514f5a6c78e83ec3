// Errors of the data library (tokenizers, token shards, text sources).
//
// fsdp_data does not link LibTorch, so it cannot use TORCH_CHECK; it throws DataError, a
// std::runtime_error whose message names the file, the offset or line, and the offending
// values, in the same spirit. Callers that run inside the trainer may let it propagate.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace fsdp::data {

// Bad input (a file, a flag, a tokenizer.json) or an unsupported feature.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <typename... Args>
[[noreturn]] void throw_data_error(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  throw DataError(os.str());
}
}  // namespace detail

}  // namespace fsdp::data

// Throws DataError with the streamed arguments as its message unless cond holds.
#define FSDP_DATA_CHECK(cond, ...)                                    \
  do {                                                                \
    if (!(cond)) ::fsdp::data::detail::throw_data_error(__VA_ARGS__); \
  } while (0)
