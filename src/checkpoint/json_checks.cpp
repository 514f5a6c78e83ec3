// See json_checks.h. Moved here from format.cpp so that the sharded checkpoint's index and the
// DCP-HF manifest are read by the same checks.
#include "checkpoint/json_checks.h"

#include "checkpoint/checksum.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>

namespace fsdp::checkpoint::json_checks {

void fail(const std::string& message) { throw FormatError(message); }

// A quoted, shortened name for messages: hostile names can be long or contain anything.
std::string quote_name(std::string_view s) {
  constexpr size_t kMax = 120;
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (s.size() > kMax) out += "...";
  return out + "'";
}

// Parses JSON text, rejecting duplicate keys in any object and nesting deeper than
// kMaxJsonDepth (nlohmann keeps the last of duplicate keys silently).
json parse_json(std::string_view text, const char* what) {
  std::vector<std::set<std::string>> keys;  // one set per open object
  json::parser_callback_t callback = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth) {
      fail(std::string(what) + " nests deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    }
    switch (event) {
      case json::parse_event_t::object_start:
        keys.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key: {
        const std::string& key = parsed.get_ref<const std::string&>();
        if (!keys.empty() && !keys.back().insert(key).second) {
          fail(std::string(what) + " has the key " + quote_name(key) + " twice");
        }
        break;
      }
      default:
        break;
    }
    return true;
  };
  try {
    return json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    fail(std::string(what) + " is not valid JSON: " + e.what());
  }
}

const json& member(const json& object, const char* key, const std::string& where) {
  auto it = object.find(key);
  if (it == object.end()) fail(where + " has no \"" + key + "\"");
  return *it;
}

uint64_t as_u64(const json& value, const std::string& what) {
  if (!value.is_number_unsigned()) {
    // nlohmann stores non-negative integers as unsigned; anything else is not one.
    fail(what + " must be a non-negative integer, got " + value.dump().substr(0, 40));
  }
  return value.get<uint64_t>();
}

int64_t as_i64(const json& value, const std::string& what) {
  const uint64_t v = as_u64(value, what);
  if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    fail(what + " is too large: " + std::to_string(v));
  }
  return static_cast<int64_t>(v);
}

const std::string& as_string(const json& value, const std::string& what) {
  if (!value.is_string()) fail(what + " must be a string, got " + std::string(value.type_name()));
  return value.get_ref<const std::string&>();
}

std::vector<int64_t> parse_shape(const json& value, const std::string& what) {
  if (!value.is_array()) fail(what + " must be an array of integers");
  std::vector<int64_t> shape;
  shape.reserve(value.size());
  for (const auto& d : value) shape.push_back(as_i64(d, what + " dimension"));
  return shape;
}

Dtype parse_dtype(const json& value, const std::string& what) {
  const std::string& name = as_string(value, what);
  auto dtype = dtype_from_name(name);
  if (!dtype) fail(what + " " + quote_name(name) + " is not a safetensors dtype");
  return *dtype;
}

// Elements and bytes of a shape, failing on overflow.
std::pair<int64_t, uint64_t> checked_size(const std::vector<int64_t>& shape, Dtype dtype,
                                          const std::string& what) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) fail(what + " has a negative dimension " + std::to_string(d));
    if (__builtin_mul_overflow(numel, d, &numel)) fail(what + " has too many elements");
  }
  int64_t bytes = 0;
  if (__builtin_mul_overflow(numel, dtype_size(dtype), &bytes)) fail(what + " is too large");
  return {numel, static_cast<uint64_t>(bytes)};
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string to_hex(std::string_view bytes) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  }
  return out;
}

std::optional<std::string> from_hex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  std::string out(hex.size() / 2, '\0');
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = digit(hex[2 * i]), lo = digit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

uint64_t parse_checksum(const json& value, const std::string& what) {
  auto sum = parse_checksum_hex(as_string(value, what));
  if (!sum) fail(what + " must be 16 lowercase hex digits");
  return *sum;
}

void expect_only(const json& object, std::initializer_list<const char*> allowed,
                 const std::string& where) {
  for (const auto& item : object.items()) {
    if (std::none_of(allowed.begin(), allowed.end(),
                     [&](const char* k) { return item.key() == k; })) {
      fail(where + " has an unexpected field " + quote_name(item.key()));
    }
  }
}

// A double as its shortest exact-enough text ("1e+39", "0.5"), for messages.
std::string number_text(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.9g", v);
  return text;
}

double as_finite(const json& value, const std::string& what) {
  if (!value.is_number()) fail(what + " must be a number, got " + value.dump().substr(0, 40));
  const double v = value.get<double>();
  if (!std::isfinite(v)) fail(what + " is not finite");
  return v;
}

GradScalerRecord parse_grad_scaler(const json& g) {
  const std::string where = "grad_scaler";
  if (!g.is_object()) fail("\"grad_scaler\" must be an object");
  expect_only(g, {"scale", "growth_tracker", "growth_factor", "backoff_factor", "growth_interval"},
              where);
  GradScalerRecord r;
  r.scale = as_finite(member(g, "scale", where), "grad_scaler scale");
  r.growth_tracker = as_i64(member(g, "growth_tracker", where), "grad_scaler growth_tracker");
  r.growth_factor = as_finite(member(g, "growth_factor", where), "grad_scaler growth_factor");
  r.backoff_factor = as_finite(member(g, "backoff_factor", where), "grad_scaler backoff_factor");
  r.growth_interval = as_i64(member(g, "growth_interval", where), "grad_scaler growth_interval");
  if (!(r.scale > 0 && r.scale <= std::numeric_limits<float>::max())) {
    fail("grad_scaler scale " + number_text(r.scale) + " is not a positive float32 value");
  }
  if (!(r.growth_factor > 1) || !(r.backoff_factor > 0 && r.backoff_factor < 1)) {
    fail("grad_scaler growth_factor " + number_text(r.growth_factor) + " must be > 1 and " +
         "backoff_factor " + number_text(r.backoff_factor) + " in (0, 1)");
  }
  if (r.growth_interval < 1 || r.growth_interval > std::numeric_limits<int32_t>::max() ||
      r.growth_tracker >= r.growth_interval) {
    fail("grad_scaler growth_tracker " + std::to_string(r.growth_tracker) +
         " must be below growth_interval " + std::to_string(r.growth_interval) +
         ", itself in [1, 2^31)");
  }
  return r;
}

std::vector<std::string> parse_rng_states(const json& rng, int64_t world) {
  if (!rng.is_array() || rng.size() > static_cast<size_t>(world)) {
    fail("rng_cpu must be an array of at most one state per rank");
  }
  std::vector<std::string> states;
  for (const auto& s : rng) {
    const std::string& hex = as_string(s, "rng_cpu state");
    auto bytes = from_hex(hex);
    if (!bytes || bytes->size() > kMaxRngBytes) fail("an rng_cpu state is not short lowercase hex");
    states.push_back(std::move(*bytes));
  }
  return states;
}

json grad_scaler_json(const GradScalerRecord& g) {
  return {{"scale", g.scale},
          {"growth_tracker", g.growth_tracker},
          {"growth_factor", g.growth_factor},
          {"backoff_factor", g.backoff_factor},
          {"growth_interval", g.growth_interval}};
}

json rng_states_json(const std::vector<std::string>& states) {
  json rng = json::array();
  for (const auto& state : states) rng.push_back(to_hex(state));
  return rng;
}

uint64_t self_checksum(const json& body) {
  const std::string canonical = body.dump();
  return detail::xxh3(canonical.data(), canonical.size());
}

void verify_self_checksum(const json& j, const std::string& what) {
  const uint64_t stored = parse_checksum(member(j, "xxh3_64", what), what + "'s checksum");
  json body = j;
  body.erase("xxh3_64");
  const uint64_t actual = self_checksum(body);
  if (actual != stored) {
    fail(what + "'s checksum does not match its content (stored " + checksum_hex(stored) +
         ", computed " + checksum_hex(actual) + "): the file is corrupted");
  }
}

}  // namespace fsdp::checkpoint::json_checks
