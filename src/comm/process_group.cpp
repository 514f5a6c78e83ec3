// The ProcessGroup interface (include/fsdp/comm/process_group.h) is header-only: the counters
// and their lock live in the base class so that every backend counts the same way. Backends are
// in src/comm/<backend>/ and are reached through the factories of src/comm/rendezvous.cpp.
//
// This file anchors the interface in the library and is where code shared by all backends
// belongs once there is more than one.
#include <fsdp/comm/process_group.h>
