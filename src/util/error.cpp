// See include/fsdp/util/error.h.
#include <fsdp/util/error.h>

#include <c10/util/Exception.h>

namespace fsdp {

std::string error_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    return c10_error->what_without_backtrace();
  }
  return e.what();
}

std::string error_message(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return error_message(e);
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace fsdp
