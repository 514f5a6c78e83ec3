// The table is built once, at first use, from the polynomial: entry b is the CRC register after
// shifting the byte b through eight reflected steps, so each input byte then costs one lookup.
#include <train/crc32c.h>

#include <array>

namespace fsdp::train {
namespace {

constexpr uint32_t kReflectedPolynomial = 0x82F63B78u;

std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t r = b;
    for (int bit = 0; bit < 8; ++bit) r = (r & 1u) ? (r >> 1) ^ kReflectedPolynomial : r >> 1;
    table[b] = r;
  }
  return table;
}

}  // namespace

uint32_t crc32c(std::string_view bytes, uint32_t crc) {
  static const std::array<uint32_t, 256> table = make_table();
  uint32_t r = ~crc;
  for (const char c : bytes) r = table[(r ^ static_cast<uint8_t>(c)) & 0xFFu] ^ (r >> 8);
  return ~r;
}

}  // namespace fsdp::train
