// The mpi tests' groups and inputs (test_mpi_backend's binary, one rank of an mpirun job): the
// world on the mpi and gloo backends, its first W ranks split on both, and inputs every rank can
// make for every other rank. Every rank runs every test in the same order, so the splits and the
// collectives match.
#pragma once

#include <support/test_support.h>

#include <fsdp/comm/process_group.h>
#include <fsdp/comm/rendezvous.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fsdp::test_mpi {

struct Groups {
  std::shared_ptr<ProcessGroup> mpi;
  std::shared_ptr<ProcessGroup> gloo;
};

// The world on both backends, made once per process.
inline const Groups& world() {
  static const Groups groups = [] {
    const LaunchEnv env = launch_env_from_environment();
    EXPECT_TRUE(env.launched_by_mpirun) << "run this binary under mpirun";
    ProcessGroupOptions options = test::test_options(std::chrono::seconds(60));
    Groups g;
    options.backend.clear();  // the launch's backend: mpi under mpirun
    g.mpi = init_process_group(env, options);
    options.backend = "gloo";
    g.gloo = init_process_group(env, options);
    return g;
  }();
  return groups;
}

// The first w ranks of the world on both backends (null on the other ranks), split once.
inline Groups first_ranks(int w) {
  static std::map<int, Groups> made;
  auto it = made.find(w);
  if (it != made.end()) return it->second;
  std::vector<int> ranks;
  for (int r = 0; r < w; ++r) ranks.push_back(r);
  const std::string name = "first" + std::to_string(w);
  Groups g{world().mpi->split(ranks, name), world().gloo->split(ranks, name)};
  made[w] = g;
  return g;
}

// Rank r's input for a test: normal values, from a generator seeded by (seed, r) alone, so that
// every rank can make every other rank's input too.
inline at::Tensor input_of(int r, int64_t n, at::ScalarType dtype, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed * 1000 + r);
  return at::randn({n}, generator, at::TensorOptions().dtype(at::kDouble)).to(dtype);
}

inline at::Tensor sum_in_double(int w, int64_t n, at::ScalarType dtype, uint64_t seed) {
  at::Tensor sum = at::zeros({n}, at::kDouble);
  for (int r = 0; r < w; ++r) sum += input_of(r, n, dtype, seed).to(at::kDouble);
  return sum;
}

// How far a sum of w values rounded in dtype may be from the exact sum, relative to the
// largest magnitude: one rounding per addition.
inline double tolerance(at::ScalarType dtype, int w) {
  const double eps = dtype == at::kBFloat16 ? 7.8e-3
                     : dtype == at::kHalf   ? 9.8e-4
                     : dtype == at::kFloat  ? 1.2e-7
                                            : 2.3e-16;
  return eps * w;
}

inline void expect_close_to(const at::Tensor& got, const at::Tensor& want, double tol,
                            const std::string& what) {
  const double scale = want.abs().max().item<double>() + 1.0;
  const double error = (got.to(at::kDouble) - want).abs().max().item<double>();
  EXPECT_LE(error, tol * scale) << what << ": max error " << error << " over scale " << scale;
}

}  // namespace fsdp::test_mpi
