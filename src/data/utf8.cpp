// Replacement of invalid UTF-8, the rule Python's bytes.decode("utf-8", errors="replace")
// follows (Unicode's "maximal subpart" practice, section 3.9 of the standard): at a byte that
// does not start a well-formed sequence, the longest prefix of a well-formed sequence found
// there (at least one byte) becomes one U+FFFD. The well-formed ranges exclude overlong forms,
// surrogates and code points above U+10FFFF, which is why the second byte's range depends on
// the first byte.
#include <fsdp/data/tokenizer.h>

namespace fsdp::data {
namespace {

// What a lead byte allows: the sequence's length (0 when the byte cannot start one) and the
// range of the second byte, which excludes overlong forms, surrogates and code points above
// U+10FFFF.
struct LeadByte {
  size_t len = 0;
  unsigned char lo = 0x80, hi = 0xBF;
};

LeadByte lead_byte(unsigned char c) {
  if (c >= 0xC2 && c <= 0xDF) return {2};
  if (c >= 0xE0 && c <= 0xEF) {
    return {3, static_cast<unsigned char>(c == 0xE0 ? 0xA0 : 0x80),
            static_cast<unsigned char>(c == 0xED ? 0x9F : 0xBF)};
  }
  if (c >= 0xF0 && c <= 0xF4) {
    return {4, static_cast<unsigned char>(c == 0xF0 ? 0x90 : 0x80),
            static_cast<unsigned char>(c == 0xF4 ? 0x8F : 0xBF)};
  }
  return {};
}

// Length of the well-formed sequence at p (1..4), or 0 when there is none; in that case
// *bad is the length of the maximal subpart to replace (>= 1).
size_t sequence_length(const unsigned char* p, size_t n, size_t* bad) {
  if (p[0] < 0x80) return 1;
  const LeadByte lead = lead_byte(p[0]);
  if (lead.len == 0) {
    *bad = 1;
    return 0;
  }
  size_t i = 1;
  for (; i < lead.len && i < n; ++i) {
    const unsigned char lo = i == 1 ? lead.lo : 0x80, hi = i == 1 ? lead.hi : 0xBF;
    if (p[i] < lo || p[i] > hi) break;
  }
  if (i == lead.len) return lead.len;
  *bad = i;
  return 0;
}

}  // namespace

bool replace_invalid_utf8(std::string_view text, std::string& out) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0, bad = 0;
  // Fast scan: most text is valid; copy only once a bad byte is found.
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t len = sequence_length(p + i, n - i, &bad);
    if (len == 0) break;
    i += len;
  }
  if (i == n) return false;
  out.assign(text.data(), i);
  static constexpr char kReplacement[] = "\xEF\xBF\xBD";
  while (i < n) {
    const size_t len = sequence_length(p + i, n - i, &bad);
    if (len == 0) {
      out.append(kReplacement, 3);
      i += bad;
    } else {
      out.append(text.data() + i, len);
      i += len;
    }
  }
  return true;
}

}  // namespace fsdp::data
