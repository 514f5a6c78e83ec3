// Strict JSON reading for the checkpoint formats (format.cpp, dcp_format.cpp): every value
// read through these helpers is checked for its type and range, and every failure throws
// FormatError naming what is wrong. No LibTorch here: the parsers built on it are fuzzed alone.
#pragma once

#include <fsdp/checkpoint/format.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fsdp::checkpoint::json_checks {

using nlohmann::json;

// The largest RNG state a checkpoint may store per rank, in bytes.
inline constexpr size_t kMaxRngBytes = 1 << 20;

[[noreturn]] void fail(const std::string& message);

// A quoted, shortened name for messages: hostile names can be long or contain anything.
std::string quote_name(std::string_view s);

// Parses JSON text, rejecting duplicate keys in any object and nesting deeper than
// kMaxJsonDepth (nlohmann keeps the last of duplicate keys silently). `what` names the text.
json parse_json(std::string_view text, const char* what);

const json& member(const json& object, const char* key, const std::string& where);
uint64_t as_u64(const json& value, const std::string& what);
int64_t as_i64(const json& value, const std::string& what);
const std::string& as_string(const json& value, const std::string& what);
std::vector<int64_t> parse_shape(const json& value, const std::string& what);
Dtype parse_dtype(const json& value, const std::string& what);
// Elements and bytes of a shape, failing on a negative dimension or overflow.
std::pair<int64_t, uint64_t> checked_size(const std::vector<int64_t>& shape, Dtype dtype,
                                          const std::string& what);
std::string shape_string(const std::vector<int64_t>& shape);  // "[3, 4]"
std::string to_hex(std::string_view bytes);
std::optional<std::string> from_hex(std::string_view hex);
uint64_t parse_checksum(const json& value, const std::string& what);
// Fails naming the first field of object outside allowed.
void expect_only(const json& object, std::initializer_list<const char*> allowed,
                 const std::string& where);
// A double as its shortest exact-enough text ("1e+39", "0.5"), for messages.
std::string number_text(double v);
double as_finite(const json& value, const std::string& what);

// fp16's gradient scaler and the per-rank CPU RNG states, as both checkpoint formats store them.
json grad_scaler_json(const GradScalerRecord& g);
GradScalerRecord parse_grad_scaler(const json& g);
json rng_states_json(const std::vector<std::string>& states);
std::vector<std::string> parse_rng_states(const json& rng, int64_t world);

// The "xxh3_64" a JSON document stores of its own content (every other member, compact dump).
uint64_t self_checksum(const json& body);
// Fails unless j's stored "xxh3_64" matches its content; `what` names the document.
void verify_self_checksum(const json& j, const std::string& what);

}  // namespace fsdp::checkpoint::json_checks
