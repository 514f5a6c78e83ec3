// libFuzzer target: the tokenizer.json loader on arbitrary bytes (see run_fuzz.sh). Any input
// must either load, and then encode and decode text without crashing, or throw DataError;
// anything else (another exception, a sanitizer report, a trap) is a bug.
#include <fsdp/data/error.h>
#include <fsdp/data/tokenizer.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace fsdp::data;
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  try {
    Tokenizer t = Tokenizer::from_json(input, "", "fuzz");
    const std::vector<uint32_t> ids =
        t.encode("Hello, world! It's 2024 \xff <|endoftext|> \xe4\xb8\xad");
    for (uint32_t id : ids) {
      if (id >= t.vocab_size()) __builtin_trap();
    }
    try {
      (void)t.decode(ids);
    } catch (const DataError&) {  // no decoder, or an id with no token (dropped bytes -> unk)
    }
  } catch (const DataError&) {
  }
  return 0;
}
