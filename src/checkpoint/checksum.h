// Checksums of checkpoint bytes: XXH3-64 from Debian's libxxhash (about 10 GB/s per core, so
// hashing costs little next to the disk). `xxhsum -H3 FILE` prints the same value for a file.
#pragma once

#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>

namespace fsdp::checkpoint::detail {

inline uint64_t xxh3(const void* data, size_t size) { return XXH3_64bits(data, size); }

// Streaming XXH3-64: update() with consecutive pieces gives xxh3() of their concatenation.
class Hasher {
 public:
  Hasher() : state_(XXH3_createState(), &XXH3_freeState) {
    if (!state_ || XXH3_64bits_reset(state_.get()) != XXH_OK) {
      throw std::runtime_error("xxhash: cannot create a hash state");
    }
  }
  void update(const void* data, size_t size) {
    if (size > 0) XXH3_64bits_update(state_.get(), data, size);
  }
  uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

 private:
  std::unique_ptr<XXH3_state_t, XXH_errorcode (*)(XXH3_state_t*)> state_;
};

}  // namespace fsdp::checkpoint::detail
