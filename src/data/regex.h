// PCRE2 behind a small interface, for the tokenizer's pre-tokenizer patterns.
//
// Patterns are compiled with UTF and UCP (so \s, \p{L}, \p{N} and (?i) follow Unicode, as
// Oniguruma does in `tokenizers`) and JIT-compiled when the platform allows. Subjects must be
// valid UTF-8 (the tokenizer guarantees it), so matching skips PCRE2's own UTF check.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace fsdp::data::detail {

class Regex {
 public:
  // pattern: Oniguruma/PCRE syntax, or a literal string when literal is true. Throws DataError
  // naming the pattern, the offset and PCRE2's message when it does not compile.
  Regex(const std::string& pattern, bool literal);
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;
  ~Regex();

  // Calls emit(begin, end) for each piece of text when split around the matches, with the
  // matches kept as pieces of their own ("Isolated"), in order, empty pieces left out. Matches
  // are found as the onig crate's find_iter finds them: an empty match right at the end of the
  // previous match is skipped by moving one character on.
  template <typename Emit>
  void split_isolated(std::string_view text, Emit&& emit);

 private:
  // Finds the first match at or after start; false when none. Throws on a matching error.
  bool find(std::string_view text, size_t start, size_t& match_begin, size_t& match_end);

  struct State;
  std::unique_ptr<State> state_;
};

template <typename Emit>
void Regex::split_isolated(std::string_view text, Emit&& emit) {
  size_t prev = 0;    // end of the last piece emitted
  size_t search = 0;  // where the next search starts
  bool have_last = false;
  size_t last_match_end = 0;
  while (search <= text.size()) {
    size_t b = 0, e = 0;
    if (!find(text, search, b, e)) break;
    if (b == e && have_last && last_match_end == e) {
      // Skip one UTF-8 character.
      size_t step = 1;
      while (search + step < text.size() &&
             (static_cast<unsigned char>(text[search + step]) & 0xC0) == 0x80) {
        ++step;
      }
      search += step;
      continue;
    }
    search = e;
    have_last = true;
    last_match_end = e;
    if (prev < b) emit(prev, b);
    if (b < e) emit(b, e);
    prev = e;
    if (b == e && e == text.size()) break;
  }
  if (prev < text.size()) emit(prev, text.size());
}

}  // namespace fsdp::data::detail
