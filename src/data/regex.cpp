// PCRE2 wrapper (see regex.h). One compiled pattern, one match-data block and one JIT stack
// per Regex, reused for every match: a match allocates nothing. A matching error (JIT stack or
// match limit) throws instead of ending the split early, so a pre-tokenization is never cut
// short silently.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/regex.h"

#include <fsdp/data/error.h>

#include <pcre2.h>

namespace fsdp::data::detail {

struct Regex::State {
  pcre2_code* code = nullptr;
  pcre2_match_data* match = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* jit_stack = nullptr;
  bool jit = false;
  std::string pattern;

  ~State() {
    if (match != nullptr) pcre2_match_data_free(match);
    if (context != nullptr) pcre2_match_context_free(context);
    if (jit_stack != nullptr) pcre2_jit_stack_free(jit_stack);
    if (code != nullptr) pcre2_code_free(code);
  }
};

namespace {

// Unicode's White_Space property, which is Oniguruma's \s. PCRE2's \s under UCP also matches
// U+180E (MONGOLIAN VOWEL SEPARATOR, a space before Unicode 6.3), so \s and \S are spelled
// out as classes.
constexpr char kWhiteSpace[] =
    "\\t-\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}"
    "\\x{205f}\\x{3000}";

// Appends the translation of the escape \e (see translate_oniguruma).
void append_escape(const std::string& pattern, char e, bool in_class, std::string& out) {
  if (e == 's') {
    out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
  } else if (e == 'S') {
    FSDP_DATA_CHECK(!in_class, "regex pattern '", pattern,
                    "' uses \\S inside a character class; unsupported");
    out += "[^" + std::string(kWhiteSpace) + "]";
  } else {
    FSDP_DATA_CHECK(e != 'Q', "regex pattern '", pattern, "' uses \\Q...\\E; unsupported");
    out += '\\';
    out += e;
  }
}

// Appends the '[' at pattern[i] that opens a class, with the '^' and the literal ']' that may
// follow it (a ']' right after '[' or '[^' is a member). Returns the index of the last
// character appended.
size_t append_class_opening(const std::string& pattern, size_t i, std::string& out) {
  out += pattern[i];
  if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
  if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
  return i;
}

// Within a class, at the '[' at pattern[i]: when it opens a POSIX [:name:], appends that
// whole and returns the index of its last character; returns npos otherwise.
size_t append_posix_class(const std::string& pattern, size_t i, std::string& out) {
  if (i + 1 >= pattern.size() || pattern[i + 1] != ':') return std::string::npos;
  const size_t end = pattern.find(":]", i + 2);
  if (end == std::string::npos) return std::string::npos;
  out.append(pattern, i, end + 2 - i);
  return end + 1;
}

// Rewrites \s and \S of an Oniguruma pattern for PCRE2 (see kWhiteSpace); everything else is
// passed through, with escapes and classes (including POSIX [:name:] inside them) skipped
// intact so that no "\\s" or "[\s]" is misread.
std::string translate_oniguruma(const std::string& pattern) {
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      append_escape(pattern, pattern[++i], in_class, out);
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      i = append_class_opening(pattern, i, out);
      continue;
    }
    if (in_class && c == '[') {
      const size_t end = append_posix_class(pattern, i, out);
      if (end != std::string::npos) {
        i = end;
        continue;
      }
    }
    FSDP_DATA_CHECK(!(in_class && c == '['), "regex pattern '", pattern,
                    "' nests character classes; unsupported");
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}
}  // namespace

Regex::Regex(const std::string& pattern, bool literal) : state_(std::make_unique<State>()) {
  state_->pattern = pattern;
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  uint32_t options = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
  const std::string translated = literal ? pattern : translate_oniguruma(pattern);
  state_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                               options, &err, &err_offset, nullptr);
  FSDP_DATA_CHECK(state_->code != nullptr, "regex pattern '", pattern, "' does not compile (as '",
                  translated, "') at offset ", err_offset, ": ", pcre2_message(err));
  state_->jit = pcre2_jit_compile(state_->code, PCRE2_JIT_COMPLETE) == 0;
  state_->match = pcre2_match_data_create_from_pattern(state_->code, nullptr);
  state_->context = pcre2_match_context_create(nullptr);
  FSDP_DATA_CHECK(state_->match != nullptr && state_->context != nullptr,
                  "out of memory compiling regex '", pattern, "'");
  if (state_->jit) {
    // Long runs of one class ("\s+(?!\S)" over a megabyte of spaces) need more than PCRE2's
    // default 32 KiB of JIT stack.
    state_->jit_stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
    FSDP_DATA_CHECK(state_->jit_stack != nullptr, "out of memory for a JIT stack");
    pcre2_jit_stack_assign(state_->context, nullptr, state_->jit_stack);
  }
}

Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;
Regex::~Regex() = default;

bool Regex::find(std::string_view text, size_t start, size_t& match_begin, size_t& match_end) {
  auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = state_->jit ? pcre2_jit_match(state_->code, subject, text.size(), start, 0,
                                         state_->match, state_->context)
                       : pcre2_match(state_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                     state_->match, state_->context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  FSDP_DATA_CHECK(rc >= 0, "regex '", state_->pattern, "' failed on a text of ", text.size(),
                  " bytes at offset ", start, ": ", pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state_->match);
  match_begin = ov[0];
  match_end = ov[1];
  // \K can put the start after the end; no pre-tokenizer pattern has a use for it.
  FSDP_DATA_CHECK(match_begin <= match_end, "regex '", state_->pattern,
                  "' uses \\K to end a match before its start; unsupported");
  return true;
}

}  // namespace fsdp::data::detail
