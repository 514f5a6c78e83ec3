// Tokenizer tests: refusals of unsupported tokenizer.json components, the UTF-8 replacement
// rule, and the differential test against Python's `tokenizers` on ~4.8 MB of varied text
// (tests/data/tokenizer_reference.py trains the tokenizers and writes the reference ids).
#include <fsdp/data/error.h>
#include <fsdp/data/tokenizer.h>

#include "data/normalize.h"
#include "support/data_util.h"
#include "support/reference_cache.h"

#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>

#ifndef FSDP_DATA_PYTHON
#define FSDP_DATA_PYTHON "python3"
#endif

namespace fsdp::data {
namespace {

using nlohmann::json;
using test::tiny_tokenizer;

Tokenizer load(const json& j, const std::string& config = "") {
  return Tokenizer::from_json(j.dump(), config, "test tokenizer.json");
}

// Expects loading j to throw a DataError whose message contains each of needles.
void expect_refused(const json& j, std::initializer_list<const char*> needles) {
  try {
    load(j);
    ADD_FAILURE() << "loaded, but should refuse: " << j.dump().substr(0, 200);
  } catch (const DataError& e) {
    for (const char* n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message '" << e.what() << "' lacks '" << n << "'";
    }
  }
}

TEST(Tokenizer, TinyEncodesDecodesAndSplitsSpecialTokens) {
  Tokenizer t = load(tiny_tokenizer(), R"({"eos_token": "<|endoftext|>"})");
  EXPECT_EQ(t.vocab_size(), 260u);
  EXPECT_EQ(t.encode(" the"), (std::vector<uint32_t>{258}));
  EXPECT_EQ(t.encode("the"), (std::vector<uint32_t>{'t', 257}));
  EXPECT_EQ(t.encode("a<|endoftext|> the"), (std::vector<uint32_t>{'a', 259, 258}));
  EXPECT_EQ(t.eos_id(), std::optional<uint32_t>(259));
  EXPECT_FALSE(t.bos_id().has_value());
  EXPECT_EQ(t.decode({'a', 259, 258}), "a<|endoftext|> the");
  EXPECT_EQ(t.decode({'a', 259, 258}, /*skip_special_tokens=*/true), "a the");
  EXPECT_THROW(t.decode({260}), DataError);
}

TEST(Tokenizer, MergesAsStringsAndPairsAgree) {
  json pairs = tiny_tokenizer();
  json list = json::array();
  for (const auto& m : pairs["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    list.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  pairs["model"]["merges"] = list;
  Tokenizer a = load(tiny_tokenizer()), b = load(pairs);
  const std::string text = "the other theme, then the end";
  EXPECT_EQ(a.encode(text), b.encode(text));
}

TEST(Tokenizer, RefusesUnsupportedComponentsNamingThem) {
  json j = tiny_tokenizer();
  j["model"]["type"] = "WordPiece";
  expect_refused(j, {"model", "WordPiece"});
  j = tiny_tokenizer();
  j["model"] = {{"type", "Unigram"}, {"vocab", json::array()}};
  expect_refused(j, {"Unigram"});
  j = tiny_tokenizer();
  j["normalizer"] = {{"type", "NFKC"}};
  expect_refused(j, {"normalizer", "NFKC"});
  j = tiny_tokenizer();
  j["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", json::array({{{"type", "NFC"}}, {{"type", "Lowercase"}}})}};
  expect_refused(j, {"normalizers[1]", "Lowercase"});
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  expect_refused(j, {"pre_tokenizer", "Whitespace"});
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers", json::array({{{"type", "Digits"}, {"individual_digits", true}}})}};
  expect_refused(j, {"pretokenizers[0]", "Digits"});
  j = tiny_tokenizer();
  j["decoder"] = {{"type", "Metaspace"}};
  expect_refused(j, {"decoder", "Metaspace"});
  j = tiny_tokenizer();
  j["model"]["dropout"] = 0.1;
  expect_refused(j, {"dropout"});
  j = tiny_tokenizer();
  j["model"]["continuing_subword_prefix"] = "##";
  expect_refused(j, {"continuing_subword_prefix"});
  j = tiny_tokenizer();
  j["model"]["byte_fallback"] = true;
  expect_refused(j, {"byte_fallback"});
  j = tiny_tokenizer();
  j["model"]["some_future_option"] = 1;
  expect_refused(j, {"some_future_option"});
  j = tiny_tokenizer();
  j["added_tokens"][0]["lstrip"] = true;
  expect_refused(j, {"added_tokens[0]", "lstrip"});
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "\\s+"}}},
                        {"behavior", "Removed"},
                        {"invert", false}};
  expect_refused(j, {"behavior", "Removed"});
  j["pre_tokenizer"]["behavior"] = "Isolated";
  expect_refused(j, {"must end with ByteLevel"});
  j = tiny_tokenizer();
  j["pre_tokenizer"] = {{"type", "Split"},
                        {"pattern", {{"Regex", "(unclosed"}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
  expect_refused(j, {"(unclosed", "does not compile"});
  j = tiny_tokenizer();
  j["model"]["merges"].push_back("x y");
  expect_refused(j, {"merges[3]", "'xy'"});
  j = tiny_tokenizer();
  j["added_tokens"][0]["id"] = 300;  // tokenizers would renumber it 259
  expect_refused(j, {"'<|endoftext|>' has id 300", "would give it id 259"});
  j = tiny_tokenizer();
  j["truncation"] = {{"max_length", 8}};
  expect_refused(j, {"truncation"});
  EXPECT_THROW(Tokenizer::from_json("{not json", "", "x.json"), DataError);
  EXPECT_THROW(Tokenizer::from_file("/nonexistent/tokenizer.json"), DataError);
  EXPECT_THROW(load(tiny_tokenizer(), R"({"eos_token": "<|nope|>"})"), DataError);
}

TEST(Tokenizer, ReplacesInvalidUtf8ByMaximalSubparts) {
  const std::string fffd = "\xEF\xBF\xBD";
  struct Case {
    std::string in, out;
  };
  const Case cases[] = {
      {"ok", ""},
      {"a\xff"
       "b",
       "a" + fffd + "b"},
      {"\xe0\x80\xaf", fffd + fffd + fffd},  // overlong: E0 needs A0..BF next
      {"\xed\xa0\x80", fffd + fffd + fffd},  // surrogate
      {"\xf0\x9f\x98", fffd},                // truncated 4-byte: one maximal subpart
      {"\xf0\x9f\x98"
       "a",
       fffd + "a"},
      {"\xf4\x90\x80\x80", fffd + fffd + fffd + fffd},  // above U+10FFFF
      {"\xc3", fffd},
      {"\xe2\x28\xa1", fffd + "(" + fffd},
      {"\xc3\xa9\xff", "\xc3\xa9" + fffd},
  };
  for (const auto& c : cases) {
    std::string out;
    EXPECT_EQ(replace_invalid_utf8(c.in, out), !c.out.empty()) << c.in;
    if (!c.out.empty()) EXPECT_EQ(out, c.out);
  }
}

// ---- differential test against Python's tokenizers ----

// The reference python, as test::reference_python finds it (this binary does not link
// LibTorch, so not that helper): $FSDP_PYTHON, else CMake's absolute path.
std::string python() {
  const char* p = std::getenv("FSDP_PYTHON");
  const std::string python = p != nullptr && *p != '\0' ? p : FSDP_PYTHON;
  EXPECT_EQ(python.front(), '/') << "FSDP_PYTHON '" << python << "' must be an absolute path";
  return python;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

template <typename T>
T take(const std::string& b, size_t& pos) {
  T v{};
  EXPECT_LE(pos + sizeof(T), b.size());
  if (pos + sizeof(T) <= b.size()) std::memcpy(&v, b.data() + pos, sizeof(T));
  pos += sizeof(T);
  return v;
}

// utf8proc's NFC on the cases that matter to a tokenizer: composition, canonical reordering of
// marks, singletons, Hangul, NUL bytes kept, and text below U+0300 passed through untouched.
TEST(Tokenizer, NfcComposesReordersAndKeepsNulBytes) {
  const auto nfc = [](std::string_view text) {
    std::string out;
    return detail::to_nfc(text, out) ? out : std::string(text);
  };
  EXPECT_EQ(nfc("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(nfc("a\u0323\u0302"), "\u1ead");  // dot below then circumflex
  EXPECT_EQ(nfc("a\u0302\u0323"), "\u1ead");  // the other order: reordered, then composed
  EXPECT_EQ(nfc("\u212b"), "\u00c5");         // ANGSTROM SIGN -> A WITH RING ABOVE
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");
  EXPECT_EQ(nfc(std::string("e\0\u0301x", 5)), std::string("e\0\u0301x", 5));
  EXPECT_EQ(nfc(std::string("\0e\u0301", 4)), std::string("\0\u00e9", 3));
  std::string untouched;
  EXPECT_FALSE(detail::to_nfc("plain ASCII and Latin-1: caf\u00e9", untouched));
  EXPECT_TRUE(untouched.empty());
}

TEST(TokenizerDifferential, SameIdsAsHuggingFaceTokenizers) {
  const std::string out_dir = std::string(FSDP_DATA_TEST_DIR) + "/tokenizer_reference";
  // tokenizers' side, cached by the fortunes' and the code's bytes (support/reference_cache.h).
  test::ReferenceRun run{
      FSDP_SOURCE_DIR "/tests/data/tokenizer_reference.py", out_dir, {}, {out_dir}};
  run.lists_inputs = true;
  run.limit_s = 600;
  const test::ReferenceResult r = test::run_reference(python(), run);
  ASSERT_EQ(r.exit_code, 0) << "the reference script failed:\n"
                            << r.output << "\nIt needs Python's tokenizers in " << python()
                            << ": install it with `" << python()
                            << " -m pip install tokenizers==0.23.3` (or set FSDP_PYTHON to a "
                               "python that has it), and Debian's fortunes (`apt-get install "
                               "fortunes`).";

  const std::array<const char*, 13> categories = {
      "fortunes",    "code",         "digits",  "whitespace",   "emoji",          "cjk",
      "scripts",     "contractions", "special", "invalid_utf8", "random_unicode", "mixed",
      "unnormalized"};
  const std::string docs = read_bytes(out_dir + "/docs.bin");
  std::vector<std::pair<int, std::string_view>> documents;
  for (size_t pos = 0; pos < docs.size();) {
    const auto cat = take<uint8_t>(docs, pos);
    const auto len = take<uint32_t>(docs, pos);
    ASSERT_LE(pos + len, docs.size());
    documents.emplace_back(cat, std::string_view(docs).substr(pos, len));
    pos += len;
  }
  size_t total_bytes = 0;
  for (const auto& d : documents) total_bytes += d.second.size();
  ASSERT_GT(total_bytes, size_t{1} << 20) << "the differential test needs at least 1 MB of text";

  for (const char* name : {"gpt2", "gpt2_prefix", "gpt2_unk", "gpt2_shuffled", "llama3", "qwen2"}) {
    SCOPED_TRACE(name);
    const std::string dir = out_dir + "/" + name;
    Tokenizer t = Tokenizer::from_file(dir + "/tokenizer.json", dir + "/tokenizer_config.json");
    const std::string ref = read_bytes(dir + "/ids.bin");
    size_t pos = 0, mismatches = 0, tokens = 0, roundtrip_failures = 0;
    std::map<std::string, size_t> by_category;
    std::vector<uint32_t> ids;
    for (size_t i = 0; i < documents.size(); ++i) {
      const auto n = take<uint32_t>(ref, pos);
      std::vector<uint32_t> expected(n);
      ASSERT_LE(pos + 4 * size_t{n}, ref.size());
      std::memcpy(expected.data(), ref.data() + pos, 4 * size_t{n});
      pos += 4 * size_t{n};
      ids.clear();
      t.encode(documents[i].second, ids);
      tokens += ids.size();
      if (ids != expected) {
        ++mismatches;
        ++by_category[categories.at(documents[i].first)];
        if (mismatches <= 3) {
          size_t k = 0;
          while (k < ids.size() && k < expected.size() && ids[k] == expected[k]) ++k;
          ADD_FAILURE() << name << ": document " << i << " (" << categories.at(documents[i].first)
                        << ", " << documents[i].second.size() << " bytes) differs at token " << k
                        << ": ours " << (k < ids.size() ? std::to_string(ids[k]) : "end") << " '"
                        << (k < ids.size() ? t.decode({ids[k]}) : "") << "', tokenizers "
                        << (k < expected.size() ? std::to_string(expected[k]) : "end") << " '"
                        << (k < expected.size() ? t.decode({expected[k]}) : "") << "'";
        }
      }
      // Byte-level BPE is lossless on valid UTF-8 (after replacement on the rest), unless it
      // adds a prefix space or lacks byte tokens. With NFC, decode gives text canonically
      // equivalent to the input, not always NFC itself: an added token matched by its NFC form
      // ("café") decodes to its content as written ("cafe\u0301"); so both sides are compared
      // in NFC.
      if (std::string(name) == "gpt2_prefix" || std::string(name) == "gpt2_unk") continue;
      std::string fixed;
      std::string_view text =
          replace_invalid_utf8(documents[i].second, fixed) ? fixed : documents[i].second;
      std::string decoded = t.decode(ids), text_nfc, decoded_nfc;
      if (std::string(name) == "qwen2") {
        if (detail::to_nfc(text, text_nfc)) text = text_nfc;
        if (detail::to_nfc(decoded, decoded_nfc)) decoded = decoded_nfc;
      }
      if (decoded != text) ++roundtrip_failures;
    }
    EXPECT_EQ(pos, ref.size());
    std::ostringstream cats;
    for (const auto& [c, n] : by_category) cats << " " << c << "=" << n;
    std::printf(
        "[differential] %s: %zu documents, %.2f MB, %zu tokens, %zu mismatches%s, "
        "%zu decode round-trip failures\n",
        name, documents.size(), total_bytes / 1e6, tokens, mismatches, cats.str().c_str(),
        roundtrip_failures);
    EXPECT_EQ(mismatches, 0u) << cats.str();
    EXPECT_EQ(roundtrip_failures, 0u);
  }
}

}  // namespace
}  // namespace fsdp::data
