// The ProcessGroup interface (include/fsdp/comm/process_group.h) is header-only but for the
// collective label: the counters and their lock live in the base class so that every backend
// counts the same way. Backends are in src/comm/<backend>/ and are reached through the factory
// of src/comm/bootstrap.cpp.
//
// The current label is a thread_local pointer to the innermost CollectiveLabel's own copy: the
// object lives on its thread's stack, scopes end in reverse order, so the pointer is valid
// whenever current() can read it.
#include <fsdp/comm/process_group.h>

#include <utility>

namespace fsdp {
namespace {

const std::string kNoLabel;
thread_local const std::string* current_label = &kNoLabel;

}  // namespace

CollectiveLabel::CollectiveLabel(std::string label)
    : label_(std::move(label)), previous_(current_label) {
  current_label = &label_;
}

CollectiveLabel::~CollectiveLabel() { current_label = previous_; }

const std::string& CollectiveLabel::current() { return *current_label; }

}  // namespace fsdp
