// --backend and the checks of a backend against the machine and the launch, shared by the
// programs that start ranks (fsdp-train, fsdp-comm-bench).
#pragma once

#include <fsdp/comm/rendezvous.h>

#include <c10/util/Exception.h>
#include <torch/cuda.h>
#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace fsdp::tools {

// --backend: auto (what fsdp::default_backend picks for the launch: mpi under mpirun when the
// build has it, else gloo) or one of this build's backends, checked at parse time.
// --backend's values: auto, then this build's backends.
inline std::vector<std::string> backend_choices() {
  std::vector<std::string> choices = fsdp::available_backends();
  choices.insert(choices.begin(), "auto");
  return choices;
}

inline constexpr const char* kBackendHelp =
    "Communication backend: auto (mpi under mpirun when built with MPI, else gloo), or one of "
    "this build's: gloo and mpi move CPU tensors, nccl CUDA tensors";

inline void add_backend_flag(CLI::App& app, std::string& backend) {
  app.add_option("--backend", backend, kBackendHelp)
      ->check(CLI::IsMember(backend_choices()))
      ->capture_default_str();
}

// Refuses --backend nccl when this process sees no CUDA device, naming the count, before any
// rank starts (each rank would refuse it too, but later and once per rank).
inline void check_backend_has_device(const std::string& backend) {
  if (backend != "nccl") return;
  const int devices = static_cast<int>(torch::cuda::device_count());  // an int8_t: print a number
  TORCH_CHECK(devices > 0,
              "--backend nccl moves CUDA tensors, but this machine has no CUDA device "
              "(torch::cuda::device_count() is ",
              devices, "); use --backend gloo on the CPU");
}

// A program about to launch its own local ranks refuses --backend mpi (MPI's ranks are the
// processes mpirun starts) and --backend nccl without a CUDA device.
inline void check_backend_launches_locally(const std::string& backend, const char* program) {
  TORCH_CHECK(backend != "mpi", "--backend mpi needs its ranks started by MPI: run mpirun -np N ",
              program, " ... (or srun --mpi=pmix), not --nproc");
  check_backend_has_device(backend);
}

}  // namespace fsdp::tools
