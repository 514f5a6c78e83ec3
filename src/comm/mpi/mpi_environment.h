// Private to src/comm/mpi: the backend's tuning variables (FSDP_MPI_ALGO, FSDP_MPI_POLL,
// FSDP_MPI_RING_LANDING), each of which names one of a few choices.
#pragma once

#include <c10/util/Exception.h>

#include <cstdlib>
#include <initializer_list>
#include <string>

namespace fsdp::detail {

template <typename Choice>
struct NamedChoice {
  const char* name;
  Choice value;
};

// The choice that the environment variable `variable` names, or the first of choices when it is
// unset. Throws for any other value, naming the variable, the value, what it chooses (e.g. "a
// poll policy") and the names it takes.
template <typename Choice>
Choice choice_from_environment(const char* variable, const char* what,
                               std::initializer_list<NamedChoice<Choice>> choices) {
  const char* value = std::getenv(variable);
  const std::string name = value ? value : choices.begin()->name;
  std::string names;
  for (const auto& choice : choices) {
    if (name == choice.name) return choice.value;
    names += (names.empty() ? "" : ", ") + std::string(choice.name);
  }
  TORCH_CHECK(false, "fsdp: ", variable, "='", name, "' is not ", what, "; use one of ", names,
              " (the first is the default)");
}

}  // namespace fsdp::detail
