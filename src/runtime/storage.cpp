// In-place storage resizing; see include/fsdp/runtime/storage.h. The CPU path is LibTorch's
// resize_bytes_cpu, unchanged, so CPU runs are what they were.
#include <fsdp/runtime/storage.h>

#include <ATen/native/Resize.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>
#include <c10/util/Exception.h>

namespace fsdp {
namespace {

c10::StorageImpl* checked_storage(const at::Tensor& t, size_t nbytes) {
  TORCH_CHECK(t.defined() && t.has_storage(), "fsdp: resize_storage needs a tensor with storage");
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  TORCH_CHECK(storage->resizable(), "fsdp: the storage of a ", t.device(),
              " tensor is not resizable");
  TORCH_CHECK(nbytes == 0 || storage->nbytes() == 0, "fsdp: resize_storage from ",
              storage->nbytes(), " to ", nbytes,
              " bytes; only freeing a storage (to 0) or re-filling an empty one is supported");
  return storage;
}

}  // namespace

void resize_storage(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* storage = checked_storage(t, nbytes);
  if (t.device().is_cpu()) {
    at::native::resize_bytes_cpu(storage, nbytes);
  } else {
    resize_storage_via_allocator(t, nbytes);
  }
}

void resize_storage_via_allocator(const at::Tensor& t, size_t nbytes) {
  c10::StorageImpl* storage = checked_storage(t, nbytes);
  const c10::Device device = storage->device();
  if (nbytes == 0) {
    storage->set_data_ptr_noswap(at::DataPtr(nullptr, device));
    storage->set_nbytes(0);
    return;
  }
  c10::Allocator* allocator = storage->allocator();
  TORCH_CHECK(allocator != nullptr, "fsdp: the storage of a ", device,
              " tensor has no allocator to re-fill it with");
  c10::OptionalDeviceGuard guard;
  if (!device.is_cpu()) guard.reset_device(device);
  storage->set_data_ptr_noswap(allocator->allocate(nbytes));
  storage->set_nbytes(nbytes);
}

}  // namespace fsdp
