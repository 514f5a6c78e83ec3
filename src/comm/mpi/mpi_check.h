// Private to src/comm/mpi: checking an MPI call's return code. Every MPI call of the backend goes
// through FSDP_MPI_CHECK, whose message names the call, where it was made and MPI's own words.
#pragma once

#include <c10/util/Exception.h>

#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <array>
#include <string>

namespace fsdp::detail {

inline std::string mpi_error_string(int code) {
  std::array<char, MPI_MAX_ERROR_STRING> text{};
  int length = 0;
  if (MPI_Error_string(code, text.data(), &length) != MPI_SUCCESS) {
    return "MPI error code " + std::to_string(code);
  }
  return std::string(text.data(), static_cast<size_t>(length));
}

}  // namespace fsdp::detail

// Throws naming the call, where it was made and MPI's own message when call failed; context
// starts the message ("fsdp: rank 0 of 2: all_reduce: ").
#define FSDP_MPI_CHECK(call, context)                                                     \
  do {                                                                                    \
    const int fsdp_mpi_rc = (call);                                                       \
    TORCH_CHECK(fsdp_mpi_rc == MPI_SUCCESS, context, #call, " failed at ", __FILE__, ":", \
                __LINE__, ": ", ::fsdp::detail::mpi_error_string(fsdp_mpi_rc));           \
  } while (0)
