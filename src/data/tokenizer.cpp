// Byte-level BPE tokenizer loaded from a Hugging Face tokenizer.json (see tokenizer.h for what
// is supported). The encode path mirrors `tokenizers` step for step, because agreeing on ids
// is the contract:
//   added tokens (leftmost-longest; normalized=false first) -> pieces between them
//   -> pre-tokenizer steps (regex splits, "Isolated"; empty pieces dropped)
//   -> ByteLevel (optional prefix space) -> BPE of each pre-token's bytes.
// BPE works on raw bytes: vocabulary strings are mapped back through GPT-2's byte <-> char
// table once at load, so no text is ever re-encoded into the printable alphabet. The merge loop
// is `tokenizers`' own (a min-heap of (rank, position), stale entries skipped by checking the
// pair still yields the same id), which is not always the same as GPT-2's "merge all
// occurrences of the best pair" loop when merges are ranked oddly.
// A pre-token's ids are cached (bounded; cleared when full), and the scratch buffers of the
// merge loop are reused, so steady-state encoding allocates only for new pre-tokens.
#include <fsdp/data/error.h>
#include <fsdp/data/tokenizer.h>

#include "data/normalize.h"
#include "data/regex.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <deque>
#include <fstream>
#include <limits>
#include <sstream>
#include <unordered_map>

namespace fsdp::data {
namespace {

using detail::Regex;
using nlohmann::json;

constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();
// GPT-2's pre-tokenizer pattern, which ByteLevel(use_regex=true) applies.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Cached pre-tokens before the cache is dropped and started again.
constexpr size_t kCacheEntries = 1 << 18;

// GPT-2's bytes_to_unicode: printable bytes stand for themselves, the other 68 map to
// U+0100 onwards in byte order.
std::array<uint32_t, 256> byte_to_char() {
  std::array<uint32_t, 256> table{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    table[b] = printable ? b : next++;
  }
  return table;
}

// Inverse of byte_to_char over code points 0..323; -1 where no byte maps.
const std::array<int, 324>& char_to_byte() {
  static const std::array<int, 324> table = [] {
    std::array<int, 324> t{};
    t.fill(-1);
    const auto fwd = byte_to_char();
    for (int b = 0; b < 256; ++b) t[fwd[b]] = b;
    return t;
  }();
  return table;
}

// Decodes s (valid UTF-8, as JSON strings are) through char_to_byte; false when a character
// has no byte.
bool unmap_bytes(const std::string& s, std::string& out) {
  out.clear();
  const auto& table = char_to_byte();
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    uint32_t cp = 0;
    size_t len = 1;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1F) << 6) | (static_cast<unsigned char>(s[i + 1]) & 0x3F);
      len = 2;
    } else {
      return false;  // three- and four-byte characters are never in the table
    }
    if (cp >= table.size() || table[cp] < 0) return false;
    out.push_back(static_cast<char>(table[cp]));
    i += len;
  }
  return true;
}

// Open-addressing map from a pair of ids to (rank, merged id).
class MergeMap {
 public:
  struct Value {
    uint32_t rank;
    uint32_t id;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 1) cap <<= 1;
    keys_.assign(cap, kEmpty);
    values_.assign(cap, Value{0, 0});
    mask_ = cap - 1;
  }
  // Later entries replace earlier ones, as a HashMap collected from the merges list does.
  void insert(uint32_t a, uint32_t b, Value v) {
    const uint64_t key = (uint64_t{a} << 32) | b;
    size_t i = hash(key) & mask_;
    while (keys_[i] != kEmpty && keys_[i] != key) i = (i + 1) & mask_;
    keys_[i] = key;
    values_[i] = v;
  }
  const Value* find(uint32_t a, uint32_t b) const {
    const uint64_t key = (uint64_t{a} << 32) | b;
    size_t i = hash(key) & mask_;
    while (true) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // (kNone, kNone) is never a real pair
  static size_t hash(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t mask_ = 0;
};

// Added tokens of one pass, matched leftmost-longest.
class AddedMatcher {
 public:
  void add(const std::string& content, uint32_t id) {
    auto& list = by_first_[static_cast<unsigned char>(content[0])];
    list.emplace_back(content, id);
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
    any_ = true;
  }
  bool empty() const { return !any_; }
  // The leftmost, then longest, token in text at or after pos: sets begin, len, id.
  bool find(std::string_view text, size_t pos, size_t& begin, size_t& len, uint32_t& id) const {
    for (size_t i = pos; i < text.size(); ++i) {
      const auto& list = by_first_[static_cast<unsigned char>(text[i])];
      for (const auto& [s, tid] : list) {
        if (s.size() <= text.size() - i && text.compare(i, s.size(), s) == 0) {
          begin = i;
          len = s.size();
          id = tid;
          return true;
        }
      }
    }
    return false;
  }

 private:
  std::array<std::vector<std::pair<std::string, uint32_t>>, 256> by_first_;
  bool any_ = false;
};

struct PreStep {
  bool byte_level = false;
  bool add_prefix_space = false;
  std::unique_ptr<Regex> regex;  // null: no split at this step
};

struct Symbol {
  uint32_t id;
  int32_t prev;
  int32_t next;
  bool alive;
};

struct HeapItem {
  uint32_t rank;
  uint32_t pos;
  uint32_t id;
  // std::push_heap builds a max-heap; the smallest (rank, pos) must come out first.
  bool operator<(const HeapItem& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// JSON helpers that name the field in their errors.
const json* field(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() || it->is_null() ? nullptr : &*it;
}

bool opt_bool(const json& obj, const char* key, bool fallback, const std::string& where) {
  const json* v = field(obj, key);
  if (v == nullptr) return fallback;
  FSDP_DATA_CHECK(v->is_boolean(), where, ".", key, " must be true or false, not ", v->dump());
  return v->get<bool>();
}

std::string req_string(const json& obj, const char* key, const std::string& where) {
  const json* v = field(obj, key);
  FSDP_DATA_CHECK(v != nullptr && v->is_string(), where, ".", key, " must be a string, not ",
                  v == nullptr ? "missing" : v->dump());
  return v->get<std::string>();
}

void check_keys(const json& obj, std::initializer_list<const char*> known,
                const std::string& where) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    FSDP_DATA_CHECK(ok, where, " has an option '", it.key(),
                    "' this tokenizer does not implement; refusing rather than tokenizing "
                    "differently from `tokenizers`");
  }
}

std::string type_of(const json& obj, const std::string& where) {
  FSDP_DATA_CHECK(obj.is_object(), where, " must be an object, not ", obj.dump());
  return req_string(obj, "type", where);
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  FSDP_DATA_CHECK(in.good(), "cannot open ", what, " '", path, "'");
  std::ostringstream os;
  os << in.rdbuf();
  FSDP_DATA_CHECK(!in.bad(), "cannot read ", what, " '", path, "'");
  return os.str();
}

}  // namespace

struct Tokenizer::Impl {
  std::string source;
  // Vocabulary.
  std::vector<std::string> id_token;  // tokenizer.json's spelling; "" for unused ids
  std::vector<std::string> id_bytes;  // what decode() gives for each id
  std::vector<uint8_t> id_used, id_special;
  std::unordered_map<std::string, uint32_t> token_ids;  // spelling -> id (added tokens win)
  std::deque<std::string> byte_keys;                    // stable storage for bytes_vocab keys
  std::unordered_map<std::string_view, uint32_t> bytes_vocab;  // model vocabulary, as bytes
  std::array<uint32_t, 256> byte_id{};
  MergeMap merges;
  bool ignore_merges = false;
  uint32_t unk_id = kNone;
  bool fuse_unk = false;
  std::vector<PreStep> steps;
  AddedMatcher added_raw, added_normalized;
  bool nfc = false;  // the normalizer: NFC, or none
  bool byte_level_decoder = false;
  std::optional<uint32_t> bos, eos;
  uint64_t token_count = 0, max_id = 0;
  uint64_t model_vocab_count = 0;  // entries of model.vocab
  uint32_t max_added = 0;          // largest added-token id so far (when any_added)
  bool any_added = false;

  // Cache of pre-token bytes -> ids, and the merge loop's scratch.
  std::deque<std::string> cache_keys;
  std::unordered_map<std::string_view, std::pair<uint32_t, uint32_t>> cache;
  std::vector<uint32_t> cache_ids;
  std::vector<Symbol> symbols;
  std::vector<HeapItem> heap;
  std::string utf8_scratch, nfc_scratch;

  void load(const json& root);
  void load_model(const json& model);
  void load_normalizer(const json& normalizer, const std::string& where);
  std::unordered_map<std::string, uint32_t> load_vocab(const json& vocab, const std::string& where);
  void load_merges(const json& list, const std::unordered_map<std::string, uint32_t>& model_ids,
                   const std::string& where);
  void load_pre_tokenizer(const json& pre, const std::string& where, bool top);
  void load_added(const json& added);
  void load_config(const json& config);
  void set_token(uint32_t id, const std::string& token);

  void encode_added(std::string_view text, std::vector<uint32_t>& out);
  void encode_normalized_pass(std::string_view text, std::vector<uint32_t>& out);
  void pre_tokenize(std::string_view piece, size_t step, std::vector<uint32_t>& out);
  void bpe(std::string_view word, std::vector<uint32_t>& out);
  // The word's bytes as linked symbols and the heap of their adjacent merges.
  void init_symbols(std::string_view word);
  void merge_word(std::string_view word, std::vector<uint32_t>& out);
};

void Tokenizer::Impl::set_token(uint32_t id, const std::string& token) {
  // Ids index dense tables; a vocabulary with far more holes than tokens is refused rather
  // than allocated.
  FSDP_DATA_CHECK(id < max_id, source, ": token id ", id, " of '", token, "' is too large for ",
                  "a vocabulary of ", token_count, " tokens (ids must be below 2 x tokens + 1024)");
  if (id >= id_token.size()) {
    id_token.resize(id + 1);
    id_used.resize(id + 1, 0);
    id_special.resize(id + 1, 0);
  }
  id_token[id] = token;
  id_used[id] = 1;
}

void Tokenizer::Impl::load(const json& root) {
  FSDP_DATA_CHECK(root.is_object(), source, " is not a JSON object");
  check_keys(root,
             {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer",
              "model", "post_processor", "decoder"},
             source);
  FSDP_DATA_CHECK(field(root, "truncation") == nullptr, source,
                  ": truncation is set; unsupported (encode() never truncates)");
  if (const json* normalizer = field(root, "normalizer")) {
    load_normalizer(*normalizer, source + ": normalizer");
  }
  const json* model = field(root, "model");
  FSDP_DATA_CHECK(model != nullptr && model->is_object(), source, " has no model object");
  const json* vocab = field(*model, "vocab");
  const json* added = field(root, "added_tokens");
  token_count = (vocab != nullptr ? vocab->size() : 0) + (added != nullptr ? added->size() : 0);
  max_id = 2 * token_count + 1024;
  load_model(*model);

  const json* pre = field(root, "pre_tokenizer");
  FSDP_DATA_CHECK(pre != nullptr, source,
                  ": pre_tokenizer is null; only byte-level BPE (a ByteLevel pre-tokenizer) "
                  "is supported");
  load_pre_tokenizer(*pre, source + ": pre_tokenizer", true);
  FSDP_DATA_CHECK(!steps.empty() && steps.back().byte_level, source,
                  ": the pre-tokenizer must end with ByteLevel (byte-level BPE); other "
                  "pre-tokenizer chains are unsupported");

  if (const json* dec = field(root, "decoder")) {
    const std::string t = type_of(*dec, source + ": decoder");
    FSDP_DATA_CHECK(t == "ByteLevel", source, ": decoder '", t,
                    "' is unsupported (only ByteLevel or null)");
    check_keys(*dec, {"type", "add_prefix_space", "trim_offsets", "use_regex"},
               source + ": decoder ByteLevel");
    byte_level_decoder = true;
  }
  if (added != nullptr) load_added(*added);

  id_bytes.resize(id_token.size());
  std::string bytes;
  for (size_t id = 0; id < id_token.size(); ++id) {
    // The ByteLevel decoder maps a token char by char, or keeps its UTF-8 as it is when one
    // of its characters is outside the table.
    id_bytes[id] = unmap_bytes(id_token[id], bytes) ? bytes : id_token[id];
  }
}

void Tokenizer::Impl::load_model(const json& model) {
  const std::string where = source + ": model";
  const std::string t = type_of(model, where);
  FSDP_DATA_CHECK(t == "BPE", where, " type '", t, "' is unsupported (only BPE)");
  check_keys(model,
             {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix",
              "fuse_unk", "byte_fallback", "ignore_merges", "vocab", "merges"},
             where);
  if (const json* d = field(model, "dropout")) {
    FSDP_DATA_CHECK(d->is_number() && d->get<double>() == 0.0, where, ".dropout is ", d->dump(),
                    "; BPE dropout is unsupported (only null or 0)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* v = field(model, key);
    FSDP_DATA_CHECK(v == nullptr || (v->is_string() && v->get<std::string>().empty()), where, ".",
                    key, " is ", v == nullptr ? "" : v->dump(),
                    "; unsupported (only null or empty)");
  }
  FSDP_DATA_CHECK(!opt_bool(model, "byte_fallback", false, where), where,
                  ".byte_fallback is true; unsupported");
  fuse_unk = opt_bool(model, "fuse_unk", false, where);
  ignore_merges = opt_bool(model, "ignore_merges", false, where);

  const json* vocab = field(model, "vocab");
  FSDP_DATA_CHECK(vocab != nullptr && vocab->is_object(), where, ".vocab must be an object");
  const std::unordered_map<std::string, uint32_t> model_ids = load_vocab(*vocab, where);
  if (const json* unk = field(model, "unk_token")) {
    FSDP_DATA_CHECK(unk->is_string(), where, ".unk_token must be a string or null");
    auto it = model_ids.find(unk->get<std::string>());
    FSDP_DATA_CHECK(it != model_ids.end(), where, ".unk_token '", unk->get<std::string>(),
                    "' is not in the vocabulary");
    unk_id = it->second;
  }
  const json* list = field(model, "merges");
  FSDP_DATA_CHECK(list != nullptr && list->is_array(), where, ".merges must be an array");
  load_merges(*list, model_ids, where);
}

std::unordered_map<std::string, uint32_t> Tokenizer::Impl::load_vocab(const json& vocab,
                                                                      const std::string& where) {
  std::unordered_map<std::string, uint32_t> model_ids;
  model_ids.reserve(vocab.size());
  model_vocab_count = vocab.size();
  std::string bytes;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    FSDP_DATA_CHECK(it->is_number_unsigned(), where, ".vocab['", it.key(),
                    "'] must be a non-negative integer id, not ", it->dump());
    const uint64_t id64 = it->get<uint64_t>();
    FSDP_DATA_CHECK(id64 < (1u << 31), where, ".vocab['", it.key(), "'] = ", id64,
                    " is too large (ids must be below 2^31)");
    const auto id = static_cast<uint32_t>(id64);
    set_token(id, it.key());
    model_ids[it.key()] = id;
    token_ids[it.key()] = id;
    if (unmap_bytes(it.key(), bytes)) {
      byte_keys.push_back(bytes);
      bytes_vocab[byte_keys.back()] = id;
    }
  }
  byte_id.fill(kNone);
  for (int b = 0; b < 256; ++b) {
    auto it = bytes_vocab.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    if (it != bytes_vocab.end()) byte_id[b] = it->second;
  }
  return model_ids;
}

void Tokenizer::Impl::load_merges(const json& list,
                                  const std::unordered_map<std::string, uint32_t>& model_ids,
                                  const std::string& where) {
  merges.reserve(list.size());
  for (size_t rank = 0; rank < list.size(); ++rank) {
    const json& m = list[rank];
    std::string a, b;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const size_t sp = s.find(' ');
      FSDP_DATA_CHECK(sp != std::string::npos && s.find(' ', sp + 1) == std::string::npos, where,
                      ".merges[", rank, "] = ", m.dump(),
                      " is not two tokens separated by one space");
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else {
      FSDP_DATA_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), where,
                      ".merges[", rank, "] = ", m.dump(), " is neither \"a b\" nor [\"a\", \"b\"]");
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    }
    auto ia = model_ids.find(a), ib = model_ids.find(b), iab = model_ids.find(a + b);
    FSDP_DATA_CHECK(ia != model_ids.end() && ib != model_ids.end(), where, ".merges[", rank,
                    "] = ", m.dump(), " names a token not in the vocabulary");
    FSDP_DATA_CHECK(iab != model_ids.end(), where, ".merges[", rank, "] = ", m.dump(),
                    ": the merged token '", a + b, "' is not in the vocabulary");
    merges.insert(ia->second, ib->second,
                  MergeMap::Value{static_cast<uint32_t>(rank), iab->second});
  }
}

void Tokenizer::Impl::load_pre_tokenizer(const json& pre, const std::string& where, bool top) {
  const std::string t = type_of(pre, where);
  if (t == "Sequence" && top) {
    check_keys(pre, {"type", "pretokenizers"}, where);
    const json* list = field(pre, "pretokenizers");
    FSDP_DATA_CHECK(list != nullptr && list->is_array(), where, ".pretokenizers must be a list");
    for (size_t i = 0; i < list->size(); ++i) {
      load_pre_tokenizer((*list)[i], where + ".pretokenizers[" + std::to_string(i) + "]", false);
    }
    return;
  }
  FSDP_DATA_CHECK(steps.empty() || !steps.back().byte_level, where,
                  ": a pre-tokenizer after ByteLevel is unsupported");
  PreStep step;
  if (t == "ByteLevel") {
    check_keys(pre, {"type", "add_prefix_space", "trim_offsets", "use_regex"}, where);
    step.byte_level = true;
    step.add_prefix_space = opt_bool(pre, "add_prefix_space", true, where);
    if (opt_bool(pre, "use_regex", true, where)) {
      step.regex = std::make_unique<Regex>(kGpt2Pattern, false);
    }
  } else if (t == "Split") {
    check_keys(pre, {"type", "pattern", "behavior", "invert"}, where);
    const std::string behavior = req_string(pre, "behavior", where);
    FSDP_DATA_CHECK(behavior == "Isolated", where, ".behavior '", behavior,
                    "' is unsupported (only Isolated)");
    FSDP_DATA_CHECK(!opt_bool(pre, "invert", false, where), where, ".invert is true; unsupported");
    const json* pattern = field(pre, "pattern");
    FSDP_DATA_CHECK(pattern != nullptr && pattern->is_object() && pattern->size() == 1, where,
                    ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    if (const json* r = field(*pattern, "Regex")) {
      FSDP_DATA_CHECK(r->is_string(), where, ".pattern.Regex must be a string");
      step.regex = std::make_unique<Regex>(r->get<std::string>(), false);
    } else if (const json* s = field(*pattern, "String")) {
      FSDP_DATA_CHECK(s->is_string(), where, ".pattern.String must be a string");
      step.regex = std::make_unique<Regex>(s->get<std::string>(), true);
    } else {
      detail::throw_data_error(where, ".pattern must be {\"Regex\": ...} or {\"String\": ...}");
    }
  } else {
    detail::throw_data_error(where, " type '", t,
                             "' is unsupported (only ByteLevel, Split, or a Sequence of them)");
  }
  steps.push_back(std::move(step));
}

void Tokenizer::Impl::load_normalizer(const json& normalizer, const std::string& where) {
  const std::string t = type_of(normalizer, where);
  if (t == "NFC") {
    check_keys(normalizer, {"type"}, where);
    nfc = true;
    return;
  }
  FSDP_DATA_CHECK(t == "Sequence", where, " type '", t,
                  "' is unsupported (only NFC, or a Sequence of NFC)");
  check_keys(normalizer, {"type", "normalizers"}, where);
  const json* list = field(normalizer, "normalizers");
  FSDP_DATA_CHECK(list != nullptr && list->is_array(), where, ".normalizers must be a list");
  // NFC is idempotent, so a Sequence of NFCs (or an empty one) is NFC (or nothing).
  for (size_t i = 0; i < list->size(); ++i) {
    load_normalizer((*list)[i], where + ".normalizers[" + std::to_string(i) + "]");
  }
}

void Tokenizer::Impl::load_added(const json& added) {
  FSDP_DATA_CHECK(added.is_array(), source, ": added_tokens must be a list");
  for (size_t i = 0; i < added.size(); ++i) {
    const json& a = added[i];
    const std::string where = source + ": added_tokens[" + std::to_string(i) + "]";
    FSDP_DATA_CHECK(a.is_object(), where, " must be an object");
    check_keys(a, {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"},
               where);
    const json* id = field(a, "id");
    FSDP_DATA_CHECK(id != nullptr && id->is_number_unsigned(), where,
                    ".id must be a non-negative integer");
    const std::string content = req_string(a, "content", where);
    FSDP_DATA_CHECK(!content.empty(), where, ".content is empty");
    for (const char* key : {"single_word", "lstrip", "rstrip"}) {
      FSDP_DATA_CHECK(!opt_bool(a, key, false, where), where, ".", key, " is true ('", content,
                      "'); unsupported");
    }
    const bool special = opt_bool(a, "special", false, where);
    // tokenizers' AddedToken defaults normalized to !special.
    const bool normalized = opt_bool(a, "normalized", !special, where);
    const uint64_t id64 = id->get<uint64_t>();
    FSDP_DATA_CHECK(id64 < (1u << 31), where, ".id ", id64, " is too large");
    const auto tid = static_cast<uint32_t>(id64);
    // tokenizers ignores the file's ids: an added token takes its id from the vocabulary (or an
    // earlier added token) when its content is there, else the next id after the model's
    // vocabulary and the added tokens so far. A file that says otherwise is refused, since
    // `tokenizers` would give different ids than the file shows.
    const auto vocab_count = static_cast<uint32_t>(model_vocab_count);
    uint32_t assigned = vocab_count;
    if (auto it = token_ids.find(content); it != token_ids.end()) {
      assigned = it->second;
    } else if (any_added && (max_added >= vocab_count || vocab_count == 0)) {
      assigned = max_added + 1;
    }
    FSDP_DATA_CHECK(tid == assigned, where, " '", content, "' has id ", tid,
                    ", but `tokenizers` would give it id ", assigned, " (the model vocabulary has ",
                    model_vocab_count, " tokens); refusing an inconsistent file");
    max_added = any_added ? std::max(max_added, tid) : tid;
    any_added = true;
    set_token(tid, content);
    id_special[tid] = special ? 1 : 0;
    token_ids[content] = tid;
    // `tokenizers` matches a normalized token by its normalized content.
    std::string matched = content;
    if (normalized && nfc) detail::to_nfc(content, matched);
    (normalized ? added_normalized : added_raw).add(matched, tid);
  }
}

void Tokenizer::Impl::load_config(const json& config) {
  FSDP_DATA_CHECK(config.is_object(), source, ": tokenizer_config.json is not a JSON object");
  auto lookup = [&](const char* key) -> std::optional<uint32_t> {
    const json* v = field(config, key);
    if (v == nullptr) return std::nullopt;
    std::string name;
    if (v->is_string()) {
      name = v->get<std::string>();
    } else {
      FSDP_DATA_CHECK(v->is_object(), source, ": tokenizer_config.json ", key,
                      " must be a string or an object with 'content'");
      name = req_string(*v, "content", source + ": tokenizer_config.json " + key);
    }
    auto it = token_ids.find(name);
    FSDP_DATA_CHECK(it != token_ids.end(), source, ": tokenizer_config.json ", key, " '", name,
                    "' is not a token of the tokenizer");
    return it->second;
  };
  bos = lookup("bos_token");
  eos = lookup("eos_token");
}

void Tokenizer::Impl::encode_added(std::string_view text, std::vector<uint32_t>& out) {
  // First pass: tokens with normalized=false, over the whole text.
  size_t pos = 0, begin = 0, len = 0;
  uint32_t id = 0;
  while (!added_raw.empty() && added_raw.find(text, pos, begin, len, id)) {
    if (begin > pos) encode_normalized_pass(text.substr(pos, begin - pos), out);
    out.push_back(id);
    pos = begin + len;
  }
  if (pos < text.size()) encode_normalized_pass(text.substr(pos), out);
}

void Tokenizer::Impl::encode_normalized_pass(std::string_view text, std::vector<uint32_t>& out) {
  // Second pass: the normalizer on each piece left by the first, then the tokens with
  // normalized=true in what it gives.
  if (nfc && detail::to_nfc(text, nfc_scratch)) text = nfc_scratch;
  size_t pos = 0, begin = 0, len = 0;
  uint32_t id = 0;
  while (!added_normalized.empty() && added_normalized.find(text, pos, begin, len, id)) {
    if (begin > pos) pre_tokenize(text.substr(pos, begin - pos), 0, out);
    out.push_back(id);
    pos = begin + len;
  }
  if (pos < text.size()) pre_tokenize(text.substr(pos), 0, out);
}

void Tokenizer::Impl::pre_tokenize(std::string_view piece, size_t step,
                                   std::vector<uint32_t>& out) {
  if (piece.empty()) return;
  if (step == steps.size()) {
    bpe(piece, out);
    return;
  }
  PreStep& s = steps[step];
  std::string prefixed;
  if (s.byte_level && s.add_prefix_space && piece[0] != ' ') {
    prefixed.reserve(piece.size() + 1);
    prefixed.push_back(' ');
    prefixed.append(piece);
    piece = prefixed;
  }
  if (s.regex == nullptr) {
    pre_tokenize(piece, step + 1, out);
    return;
  }
  s.regex->split_isolated(
      piece, [&](size_t b, size_t e) { pre_tokenize(piece.substr(b, e - b), step + 1, out); });
}

void Tokenizer::Impl::bpe(std::string_view word, std::vector<uint32_t>& out) {
  auto hit = cache.find(word);
  if (hit != cache.end()) {
    out.insert(out.end(), cache_ids.begin() + hit->second.first,
               cache_ids.begin() + hit->second.first + hit->second.second);
    return;
  }
  const size_t before = out.size();
  merge_word(word, out);
  if (cache.size() >= kCacheEntries) {
    cache.clear();
    cache_keys.clear();
    cache_ids.clear();
  }
  cache_keys.emplace_back(word);
  cache.emplace(cache_keys.back(), std::make_pair(static_cast<uint32_t>(cache_ids.size()),
                                                  static_cast<uint32_t>(out.size() - before)));
  cache_ids.insert(cache_ids.end(), out.begin() + before, out.end());
}

void Tokenizer::Impl::init_symbols(std::string_view word) {
  symbols.clear();
  bool last_unk = false;
  for (const char ch : word) {
    const uint32_t id = byte_id[static_cast<unsigned char>(ch)];
    if (id != kNone) {
      symbols.push_back(Symbol{id, 0, 0, true});
      last_unk = false;
    } else if (unk_id != kNone) {
      // Unknown bytes become unk, consecutive ones fused into one when fuse_unk.
      if (!(fuse_unk && last_unk)) symbols.push_back(Symbol{unk_id, 0, 0, true});
      last_unk = true;
    }  // without an unk token, `tokenizers` drops the byte
  }
  const auto n = static_cast<int32_t>(symbols.size());
  for (int32_t i = 0; i < n; ++i) {
    symbols[i].prev = i - 1;
    symbols[i].next = i + 1 < n ? i + 1 : -1;
  }
  heap.clear();
  for (int32_t i = 0; i + 1 < n; ++i) {
    if (const auto* m = merges.find(symbols[i].id, symbols[i + 1].id)) {
      heap.push_back(HeapItem{m->rank, static_cast<uint32_t>(i), m->id});
    }
  }
}

void Tokenizer::Impl::merge_word(std::string_view word, std::vector<uint32_t>& out) {
  if (ignore_merges) {
    auto it = bytes_vocab.find(word);
    if (it != bytes_vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  init_symbols(word);
  std::make_heap(heap.begin(), heap.end());
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end());
    const HeapItem top = heap.back();
    heap.pop_back();
    Symbol& cur = symbols[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    Symbol& right = symbols[cur.next];
    const auto* m = merges.find(cur.id, right.id);
    if (m == nullptr || m->id != top.id) continue;  // stale entry
    cur.id = top.id;
    right.alive = false;
    cur.next = right.next;
    if (cur.next >= 0) symbols[cur.next].prev = static_cast<int32_t>(top.pos);
    if (cur.prev >= 0) {
      if (const auto* p = merges.find(symbols[cur.prev].id, cur.id)) {
        heap.push_back(HeapItem{p->rank, static_cast<uint32_t>(cur.prev), p->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
    if (cur.next >= 0) {
      if (const auto* p = merges.find(cur.id, symbols[cur.next].id)) {
        heap.push_back(HeapItem{p->rank, top.pos, p->id});
        std::push_heap(heap.begin(), heap.end());
      }
    }
  }
  for (int32_t i = symbols.empty() ? -1 : 0; i >= 0; i = symbols[i].next) {
    out.push_back(symbols[i].id);
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::string& path, const std::string& config_path) {
  const std::string text = read_file(path, "tokenizer file");
  const std::string config = config_path.empty() ? "" : read_file(config_path, "tokenizer config");
  return from_json(text, config, path);
}

Tokenizer Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json,
                               const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  try {
    impl->load(json::parse(tokenizer_json));
    if (!config_json.empty()) impl->load_config(json::parse(config_json));
  } catch (const json::exception& e) {
    detail::throw_data_error(source, ": ", e.what());
  }
  return Tokenizer(std::move(impl));
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out) {
  if (replace_invalid_utf8(text, impl_->utf8_scratch)) {
    const std::string fixed = std::move(impl_->utf8_scratch);
    impl_->encode_added(fixed, out);
    return;
  }
  impl_->encode_added(text, out);
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text) {
  std::vector<uint32_t> out;
  encode(text, out);
  return out;
}

std::string Tokenizer::decode(const std::vector<uint32_t>& ids, bool skip_special_tokens) const {
  FSDP_DATA_CHECK(impl_->byte_level_decoder, impl_->source,
                  " has no decoder (decoder is null); cannot decode");
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    FSDP_DATA_CHECK(id < impl_->id_used.size() && impl_->id_used[id], "decode: ids[", i, "] = ", id,
                    " is not a token of ", impl_->source, " (vocab size ", vocab_size(), ")");
    if (skip_special_tokens && impl_->id_special[id]) continue;
    out += impl_->id_bytes[id];
  }
  return out;
}

uint32_t Tokenizer::vocab_size() const { return static_cast<uint32_t>(impl_->id_token.size()); }

std::optional<uint32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->token_ids.find(std::string(token));
  if (it == impl_->token_ids.end()) return std::nullopt;
  return it->second;
}

std::optional<uint32_t> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<uint32_t> Tokenizer::eos_id() const { return impl_->eos; }

}  // namespace fsdp::data
