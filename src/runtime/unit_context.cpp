// The helpers every part of a unit waits on and orders after its collectives with; see
// unit_context.h. A wait is the only place the host blocks on communication, so it is also where
// exposed communication time is counted.
#include "runtime/unit_context.h"

#include <fsdp/util/error.h>
#include <fsdp/util/trace.h>

#include <c10/util/Exception.h>

#include <chrono>

namespace fsdp::detail {

void UnitContext::rethrow_with_context(const char* what, const std::exception& e) const {
  TORCH_CHECK(false, "fsdp: ", what, " of unit '", label_, "' on rank ", mesh_.shard_rank(), " of ",
              mesh_.shard_size(), " failed: ", error_message(e));
}

void UnitContext::wait_for(const WorkHandle& work, const char* what) const {
  const auto start = RuntimeObserver::Clock::now();
  try {
    work->wait();
  } catch (const std::exception& e) {
    rethrow_with_context(what, e);
  }
  observer_->waited(std::chrono::duration<double>(RuntimeObserver::Clock::now() - start).count());
}

void UnitContext::order_stream_after(const WorkHandle& work) const {
  // In program order the host waits where the result is needed (wait_for). With streams the
  // current (guarded) stream waits for the collective, not the host (Work::wait_on_stream).
  if (!streams_->in_program_order()) work->wait_on_stream();
}

}  // namespace fsdp::detail
