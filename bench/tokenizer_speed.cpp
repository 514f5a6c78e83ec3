// Single-threaded encode throughput of fsdp::data::Tokenizer; bench/tokenizer_speed.sh runs it
// next to Python's tokenizers on the same text.
//
//   cmake --build build --target tokenizer-speed
//   build/bench/tokenizer-speed TOKENIZER_JSON TEXT_FILE [REPEATS] [IDS_OUT]
//
// Each repeat loads a fresh Tokenizer (so its pre-token cache starts empty; loading is not
// timed) and encodes the file twice: as one string, then as documents split on "\n%\n" (the
// fortunes' separator). Prints one JSON line with the best MB/s of each (MB = 10^6 bytes of
// input). IDS_OUT, if given, receives the one-string ids as little-endian uint32, so the
// script can check they equal tokenizers' before it compares speeds.
#include <fsdp/data/tokenizer.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s TOKENIZER_JSON TEXT_FILE [REPEATS] [IDS_OUT]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::stoi(argv[3]) : 3;
  std::ifstream in(argv[2], std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string_view> docs;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find("\n%\n", pos);
    if (end == std::string::npos) end = text.size();
    docs.emplace_back(text.data() + pos, end - pos);
    pos = end + 3;
  }
  double best_one = 0, best_docs = 0;
  size_t tokens = 0;
  std::vector<uint32_t> ids;
  for (int r = 0; r < repeats; ++r) {
    for (int mode = 0; mode < 2; ++mode) {
      fsdp::data::Tokenizer tok = fsdp::data::Tokenizer::from_file(argv[1]);
      ids.clear();
      ids.reserve(text.size());
      const auto t0 = std::chrono::steady_clock::now();
      if (mode == 0) {
        tok.encode(text, ids);
      } else {
        for (const auto& d : docs) tok.encode(d, ids);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double mbs = text.size() / 1e6 / s;
      if (mode == 0) {
        best_one = std::max(best_one, mbs);
        tokens = ids.size();
        if (argc > 4 && r == 0) {
          std::ofstream out(argv[4], std::ios::binary);
          out.write(reinterpret_cast<const char*>(ids.data()),
                    static_cast<std::streamsize>(ids.size() * 4));
        }
      } else {
        best_docs = std::max(best_docs, mbs);
      }
    }
  }
  std::printf(
      "{\"bytes\": %zu, \"documents\": %zu, \"tokens\": %zu, \"one_string_mb_s\": %.2f, "
      "\"documents_mb_s\": %.2f}\n",
      text.size(), docs.size(), tokens, best_one, best_docs);
  return 0;
}
