// config.json parsing; see hf_config.h. The file is hostile until proven otherwise: strict JSON
// (bounded size and nesting, no duplicate keys), every value's type and range checked before it
// is used, and the resulting configuration's own checks (problem()) before it is returned.
//
// [Note: which config.json fields count]
// transformers keeps every key of config.json as an attribute, and a model reads the ones its
// modeling file asks for; a key no modeling file reads changes nothing. So for each class we
// read what its modeling code reads (transformers 5.x, and the 4.x spellings: rope_theta and
// rope_scaling beside 5.x's rope_parameters), and ignore the rest, with three exceptions:
// - fields read by the class that we do not implement are refused by name (an unknown rope
//   type, Qwen's per-layer sliding windows, GPT-2's attention scalings and cross-attention);
// - fields other architectures use to change the computation are refused when set, though this
//   class would ignore them (kForeignFields): a config.json carrying attn_logit_softcapping or a
//   quantization_config describes a checkpoint that neither transformers' class nor ours
//   computes faithfully;
// - dropout probabilities (attention_dropout, attn_pdrop, ...) are accepted and not applied:
//   fsdp trains without dropout (its equivalence tests need determinism), and transformers'
//   evaluation-mode forward applies none either.
#include <models/common/config_limits.h>
#include <models/hf/hf_config.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <limits>
#include <set>
#include <vector>

namespace fsdp::models {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 32;                    // config.json nests 3 deep at most
constexpr int64_t kMaxIndex = int64_t{1} << 31;  // max_window_layers and other counts

// Every message starts with "config.json" (model_spec_from_pretrained puts the path there).
[[noreturn]] void fail(const std::string& message) {
  throw HfConfigError("config.json: " + message);
}
[[noreturn]] void fail_file(const std::string& message) {
  throw HfConfigError("config.json " + message);
}

// A value for a message: its JSON text, shortened (a hostile value can be anything).
std::string shown(const json& value) {
  std::string text = value.dump(-1, ' ', /*ensure_ascii=*/true);
  constexpr size_t kMax = 60;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

// Strict JSON: nesting at most kMaxDepth, no key twice in an object (Python's json keeps the
// last of duplicate keys; a file with them is broken whichever one is meant).
json parse_strict(std::string_view text) {
  if (text.size() > kMaxHfConfigBytes) {
    fail_file("is " + std::to_string(text.size()) + " bytes, more than the " +
              std::to_string(kMaxHfConfigBytes) + " accepted");
  }
  std::vector<std::set<std::string>> keys;  // one set per open object
  json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxDepth) fail_file("nests deeper than " + std::to_string(kMaxDepth) + " levels");
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second) {
      fail_file("has the key " + shown(parsed) + " twice in one object");
    }
    return true;
  };
  try {
    json parsed = json::parse(text.begin(), text.end(), check);
    if (!parsed.is_object()) fail_file("is not a JSON object");
    return parsed;
  } catch (const json::exception& e) {
    fail_file(std::string("is not valid JSON: ") + e.what());
  }
}

// Typed, range-checked reads of an object's fields, each error naming the field and its value.
class Fields {
 public:
  Fields(const json& object, std::string where) : object_(object), where_(std::move(where)) {}

  // The field, or null when it is missing or JSON null (transformers treats both alike).
  const json* find(const char* key) const {
    const auto it = object_.find(key);
    return it == object_.end() || it->is_null() ? nullptr : &*it;
  }
  bool has(const char* key) const { return find(key) != nullptr; }

  std::optional<int64_t> integer(const char* key, int64_t lo, int64_t hi) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    const bool fits =
        v->is_number_integer() &&
        (!v->is_number_unsigned() ||
         v->get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (!fits) fail(where_ + key + " must be an integer, got " + shown(*v));
    const int64_t n = v->get<int64_t>();
    if (n < lo || n > hi) {
      fail(where_ + key + "=" + std::to_string(n) + " is out of range [" + std::to_string(lo) +
           ", " + std::to_string(hi) + "]");
    }
    return n;
  }
  int64_t required_size(const char* key, const std::string& needed_by) const {
    if (!has(key)) fail(where_ + key + " is missing (" + needed_by + " needs it)");
    return *integer(key, 1, kMaxConfigSize);
  }
  int64_t size_or(const char* key, int64_t fallback) const {
    return integer(key, 1, kMaxConfigSize).value_or(fallback);
  }
  double number(const char* key, double fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      fail(where_ + key + " must be a finite number, got " + shown(*v));
    }
    return v->get<double>();
  }
  double positive(const char* key, double fallback) const {
    const double x = number(key, fallback);
    if (!(x > 0)) fail(where_ + key + "=" + shown(json(x)) + " must be positive");
    return x;
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) fail(where_ + key + " must be true or false, got " + shown(*v));
    return v->get<bool>();
  }
  std::optional<std::string> string(const char* key) const {
    const json* v = find(key);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) fail(where_ + key + " must be a string, got " + shown(*v));
    return v->get<std::string>();
  }

 private:
  const json& object_;
  std::string where_;  // "" for the top level, "rope_scaling." inside it
};

// ---- which class ----------------------------------------------------------------------------

enum class Family { kLlama, kMistral, kQwen2, kQwen3, kGpt2 };

struct ClassInfo {
  const char* class_name;
  const char* model_type;
  Family family;
};

constexpr ClassInfo kClasses[] = {
    {"LlamaForCausalLM", "llama", Family::kLlama},
    {"MistralForCausalLM", "mistral", Family::kMistral},
    {"Qwen2ForCausalLM", "qwen2", Family::kQwen2},
    {"Qwen3ForCausalLM", "qwen3", Family::kQwen3},
    {"GPT2LMHeadModel", "gpt2", Family::kGpt2},
};

// The class config.json names: architectures (one entry) and model_type must agree, and either
// one alone decides (transformers' AutoModelForCausalLM goes by model_type).
const ClassInfo& class_of(const Fields& f) {
  const std::optional<std::string> type = f.string("model_type");
  const ClassInfo* by_class = nullptr;
  if (const json* archs = f.find("architectures")) {
    if (!archs->is_array() || archs->size() != 1 || !(*archs)[0].is_string()) {
      fail("architectures must name one class, as [\"LlamaForCausalLM\"], got " + shown(*archs));
    }
    const std::string name = (*archs)[0].get<std::string>();
    for (const auto& c : kClasses) by_class = name == c.class_name ? &c : by_class;
    if (by_class == nullptr) {
      fail("architectures names " + shown((*archs)[0]) + ", not one of the classes implemented (" +
           hf_supported_classes() + ")");
    }
  }
  if (type) {
    for (const auto& c : kClasses) {
      if (*type != c.model_type) continue;
      if (by_class != nullptr && by_class != &c) {
        fail(std::string("architectures names ") + by_class->class_name + " but model_type is " +
             shown(json(*type)) + " (" + by_class->class_name + "'s is \"" + by_class->model_type +
             "\")");
      }
      return c;
    }
    if (by_class == nullptr) {
      fail("model_type " + shown(json(*type)) +
           " is not one of those implemented (llama, mistral, "
           "qwen2, qwen3, gpt2)");
    }
    fail(std::string("architectures names ") + by_class->class_name + " but model_type is " +
         shown(json(*type)));
  }
  if (by_class == nullptr) fail_file("names neither architectures nor model_type");
  return *by_class;
}

// ---- fields that change the computation elsewhere (see the note) ----------------------------

// Fields other transformers architectures read to change the computation, with the value that
// changes nothing: set to anything else, the file is refused.
struct ForeignField {
  const char* key;
  enum Neutral { kAbsent, kFalse, kOne } neutral;
};

constexpr ForeignField kForeignFields[] = {
    {"quantization_config", ForeignField::kAbsent},     // quantized weights
    {"attn_logit_softcapping", ForeignField::kAbsent},  // Gemma 2
    {"final_logit_softcapping", ForeignField::kAbsent},
    {"query_pre_attn_scalar", ForeignField::kAbsent},  // Gemma's attention scale
    {"partial_rotary_factor", ForeignField::kOne},     // rotary on part of each head
    {"rope_interleaved", ForeignField::kFalse},        // Meta's pairwise rotary layout
    {"embedding_multiplier", ForeignField::kOne},      // Granite's scalings
    {"residual_multiplier", ForeignField::kOne},
    {"attention_multiplier", ForeignField::kOne},
    {"logits_scaling", ForeignField::kOne},
    {"use_qk_norm", ForeignField::kFalse},
    {"qk_layernorm", ForeignField::kFalse},
};

bool neutral(const json& v, ForeignField::Neutral n) {
  switch (n) {
    case ForeignField::kAbsent:
      return false;  // present and not null
    case ForeignField::kFalse:
      return v.is_boolean() && !v.get<bool>();
    case ForeignField::kOne:
      return v.is_number() && v.get<double>() == 1.0;
  }
  return false;
}

void refuse_foreign_fields(const Fields& f, const std::string& class_name) {
  for (const auto& field : kForeignFields) {
    const json* v = f.find(field.key);
    if (v != nullptr && !neutral(*v, field.neutral)) {
      fail(std::string(field.key) + "=" + shown(*v) + " changes the computation and is not " +
           "implemented (" + class_name + " as fsdp builds it has no such feature)");
    }
  }
}

// layer_types must be absent or all "full_attention": per-layer sliding windows are not
// implemented (Qwen's max_window_layers, Ministral's alternation).
void refuse_sliding_layers(const Fields& f) {
  const json* types = f.find("layer_types");
  if (types == nullptr) return;
  if (!types->is_array()) fail("layer_types must be a list, got " + shown(*types));
  for (size_t i = 0; i < types->size(); ++i) {
    if ((*types)[i] != "full_attention") {
      fail("layer_types[" + std::to_string(i) + "]=" + shown((*types)[i]) +
           ": per-layer attention types other than full_attention are not implemented");
    }
  }
}

// ---- rotary embeddings ----------------------------------------------------------------------

// rope_theta and rope_scaling, from 5.x's rope_parameters or 4.x's rope_scaling and rope_theta
// (rope_scaling wins when both are there, as in transformers).
void read_rope(const Fields& f, int64_t max_positions, LlamaConfig& c) {
  const char* key = f.has("rope_scaling") ? "rope_scaling" : "rope_parameters";
  const json* dict = f.find(key);
  const std::string name = std::string(key) + ".";
  c.rope_theta = f.positive("rope_theta", 10000.0);  // transformers' default_theta
  c.rope_scaling.reset();
  if (dict == nullptr) return;
  if (!dict->is_object()) fail(std::string(key) + " must be an object, got " + shown(*dict));
  const Fields r(*dict, name);
  for (const auto& item : dict->items()) {
    if (item.value().is_object()) {
      fail(name + item.key() + ": rotary parameters per layer type are not implemented");
    }
  }
  c.rope_theta = r.positive("rope_theta", c.rope_theta);
  if (const json* p = r.find("partial_rotary_factor"); p != nullptr && !(*p == 1.0)) {
    fail(name + "partial_rotary_factor=" + shown(*p) + " is not implemented");
  }
  std::string type = r.string("rope_type").value_or(r.string("type").value_or("default"));
  if (type == "default") return;
  LlamaRopeScaling s;
  if (type == "linear") {
    s.rope_type = RopeType::kLinear;
    if (!r.has("factor")) fail(name + "factor is missing (linear scaling needs it)");
    s.factor = r.positive("factor", 1.0);
  } else if (type == "llama3") {
    for (const char* needed : {"factor", "low_freq_factor", "high_freq_factor"}) {
      if (!r.has(needed)) fail(name + needed + " is missing (llama3 scaling needs it)");
    }
    s.factor = r.positive("factor", 1.0);
    s.low_freq_factor = r.positive("low_freq_factor", 1.0);
    s.high_freq_factor = r.positive("high_freq_factor", 1.0);
    // transformers prefers a top-level original_max_position_embeddings (Phi-3's spelling).
    const char* original = "original_max_position_embeddings";
    s.original_max_position_embeddings =
        f.integer(original, 1, kMaxConfigSize)
            .value_or(r.integer(original, 1, kMaxConfigSize).value_or(max_positions));
  } else {
    fail(name + "rope_type " + shown(json(type)) +
         " is not implemented (default, linear and llama3 are)");
  }
  c.rope_scaling = s;
}

// ---- the Llama-shaped classes ---------------------------------------------------------------

Activation activation_of(const Fields& f, const char* key, const char* fallback) {
  const std::string name = f.string(key).value_or(fallback);
  const std::optional<Activation> act = activation_named(name);
  if (!act) {
    fail(std::string(key) + " " + shown(json(name)) + " is not implemented (" + kActivationNames +
         " are)");
  }
  return *act;
}

// Qwen2's and Qwen3's use_sliding_window: transformers then gives layers i >= max_window_layers
// (or those layer_types marks) a window of sliding_window positions. Accepted where it changes
// nothing (no layer is sliding, or the window spans every position the model accepts).
void read_qwen_window(const Fields& f, const LlamaConfig& c) {
  if (!f.boolean("use_sliding_window", false)) return;
  const std::optional<int64_t> window = f.integer("sliding_window", 1, kMaxIndex);
  if (!window || *window >= c.max_position_embeddings) return;
  const int64_t first = f.integer("max_window_layers", 0, kMaxIndex).value_or(28);
  bool sliding = first < c.num_hidden_layers;
  if (const json* types = f.find("layer_types"); types != nullptr && types->is_array()) {
    sliding = false;
    for (const auto& t : *types) sliding = sliding || t == "sliding_attention";
  }
  if (sliding) {
    fail("use_sliding_window=true with sliding_window=" + std::to_string(*window) +
         " (less than max_position_embeddings=" + std::to_string(c.max_position_embeddings) +
         ") on layers from max_window_layers=" + std::to_string(first) +
         ": per-layer sliding windows are not implemented");
  }
}

LlamaConfig read_llama_shaped(const Fields& f, const ClassInfo& info) {
  const std::string needs = info.class_name;
  LlamaConfig c;
  c.vocab_size = f.required_size("vocab_size", needs);
  c.hidden_size = f.required_size("hidden_size", needs);
  c.intermediate_size = f.required_size("intermediate_size", needs);
  c.num_hidden_layers = f.required_size("num_hidden_layers", needs);
  c.num_attention_heads = f.required_size("num_attention_heads", needs);
  c.max_position_embeddings = f.required_size("max_position_embeddings", needs);
  // transformers' defaults: Mistral's class has 8 key/value heads, Qwen3's a head_dim of 128.
  c.num_key_value_heads =
      f.size_or("num_key_value_heads", info.family == Family::kMistral ? 8 : c.num_attention_heads);
  c.explicit_head_dim = f.size_or("head_dim", info.family == Family::kQwen3 ? 128 : 0);
  c.rms_norm_eps = f.positive("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.hidden_act = activation_of(f, "hidden_act", "silu");
  read_rope(f, c.max_position_embeddings, c);
  switch (info.family) {
    case Family::kLlama:
      c.attention_bias =
          f.boolean("attention_bias", false) ? AttentionBias::kAll : AttentionBias::kNone;
      c.mlp_bias = f.boolean("mlp_bias", false);
      break;
    case Family::kMistral:
      c.sliding_window = f.integer("sliding_window", 1, kMaxIndex).value_or(0);
      if (c.sliding_window >= c.max_position_embeddings) c.sliding_window = 0;  // no effect
      break;
    case Family::kQwen2:
      c.attention_bias = AttentionBias::kQkv;  // Qwen2's q, k and v always carry biases
      read_qwen_window(f, c);
      break;
    case Family::kQwen3:
      c.attention_bias =
          f.boolean("attention_bias", false) ? AttentionBias::kAll : AttentionBias::kNone;
      c.qk_norm = true;
      read_qwen_window(f, c);
      break;
    case Family::kGpt2:
      break;
  }
  refuse_sliding_layers(f);
  return c;
}

// ---- GPT-2 ----------------------------------------------------------------------------------

// A GPT-2 field that must keep the value transformers' default gives it.
void require_bool(const Fields& f, const char* key, bool want, const char* why) {
  if (f.boolean(key, want) != want) {
    fail(std::string(key) + "=" + (want ? "false" : "true") + " is not implemented (" + why + ")");
  }
}

GPT2Config read_gpt2(const Fields& f) {
  const std::string needs = "GPT2LMHeadModel";
  GPT2Config c;
  c.vocab_size = f.required_size("vocab_size", needs);
  c.n_positions = f.required_size("n_positions", needs);
  c.n_embd = f.required_size("n_embd", needs);
  c.n_layer = f.required_size("n_layer", needs);
  c.n_head = f.required_size("n_head", needs);
  c.n_inner = f.size_or("n_inner", 0);
  c.activation_function = activation_of(f, "activation_function", "gelu_new");
  c.layer_norm_epsilon = f.positive("layer_norm_epsilon", 1e-5);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", true);
  require_bool(f, "scale_attn_weights", true, "attention scores are scaled by 1/sqrt(head_dim)");
  require_bool(f, "scale_attn_by_inverse_layer_idx", false, "no per-layer attention scaling");
  require_bool(f, "reorder_and_upcast_attn", false, "attention runs in the compute dtype");
  require_bool(f, "add_cross_attention", false, "a decoder-only model");
  return c;
}

}  // namespace

std::string hf_supported_classes() {
  std::string out;
  for (const auto& c : kClasses) out += (out.empty() ? "" : ", ") + std::string(c.class_name);
  return out;
}

HfConfig parse_hf_config(std::string_view json_text) {
  const json config = parse_strict(json_text);
  const Fields f(config, "");
  const ClassInfo& info = class_of(f);
  refuse_foreign_fields(f, info.class_name);
  HfConfig out;
  out.class_name = info.class_name;
  out.model_type = info.model_type;
  std::optional<std::string> problem;
  if (info.family == Family::kGpt2) {
    out.gpt2 = read_gpt2(f);
    problem = out.gpt2->problem();
  } else {
    out.llama = read_llama_shaped(f, info);
    problem = out.llama->problem();
  }
  if (problem) fail(*problem);
  return out;
}

}  // namespace fsdp::models
