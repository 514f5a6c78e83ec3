// CRC-32C (Castagnoli), the checksum TensorBoard's event files put on every record, and the
// masked form they store. No Debian package gives C++ a CRC-32C, so it is computed here: one
// 256-entry table of the reflected polynomial 0x82F63B78, a byte at a time (an event file takes
// a few hundred bytes per step, so speed does not matter). Checked against the published check
// values in tests/train/test_tensorboard_format.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace fsdp::train {

// CRC-32C of bytes; crc continues an earlier call's result over further bytes (0 to start).
uint32_t crc32c(std::string_view bytes, uint32_t crc = 0);

// The stored form: rotated right by 15 bits plus a constant, so that a CRC of bytes that
// themselves hold a CRC does not come out trivially (the TFRecord convention).
inline uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

}  // namespace fsdp::train
