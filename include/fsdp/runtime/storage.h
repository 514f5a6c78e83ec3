// Freeing and re-filling a tensor's storage in place, on any device.
//
// The unsharded parameters keep one StorageImpl for their whole life (autograd saves views of
// them in forward that must see the values gathered again for backward), so their bytes are
// freed by resizing that storage to 0 and brought back by resizing it to its full size, FSDP2's
// untyped_storage().resize_(). The runtime only ever makes those two moves, so no bytes are
// copied.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace fsdp {

// Resizes t's storage to nbytes in place: 0 frees it, and a storage of 0 bytes is re-filled
// with nbytes of uninitialized memory. Any other resize is refused. On CPU this is
// at::native::resize_bytes_cpu; on any other device resize_storage_via_allocator.
void resize_storage(const at::Tensor& t, size_t nbytes);

// The device-generic path: the storage's own allocator (the caching allocator on CUDA, so the
// block belongs to the calling thread's current stream) under a guard for its device. For these
// two moves it is what at::native::resize_bytes_cuda does, with no device's headers. Works on
// CPU too, where the tests compare it with resize_bytes_cpu.
void resize_storage_via_allocator(const at::Tensor& t, size_t nbytes);

}  // namespace fsdp
