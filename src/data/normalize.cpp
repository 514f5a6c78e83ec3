// NFC by utf8proc (see normalize.h).
#include "data/normalize.h"

#include <fsdp/data/error.h>

#include <utf8proc.h>

#include <cstdlib>

namespace fsdp::data::detail {

bool to_nfc(std::string_view text, std::string& out) {
  bool may_change = false;
  for (const char c : text) may_change |= static_cast<unsigned char>(c) >= 0xCC;
  if (!may_change) return false;
  utf8proc_uint8_t* composed = nullptr;
  // With an explicit length (no UTF8PROC_NULLTERM), NUL bytes are characters like any other.
  const utf8proc_ssize_t n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &composed,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    std::free(composed);
    // encode() replaces invalid UTF-8 before it normalizes, so this is a bug, not bad input.
    throw_data_error("NFC normalization failed on ", text.size(), " bytes: ", utf8proc_errmsg(n));
  }
  out.assign(reinterpret_cast<const char*>(composed), static_cast<size_t>(n));
  std::free(composed);
  return true;
}

}  // namespace fsdp::data::detail
