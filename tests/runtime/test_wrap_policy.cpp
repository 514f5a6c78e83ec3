// Auto-wrap policies (fsdp/wrap_policy.h) on GPT-2 (tiny, small) and Llama (llama-tiny).
//
// The expected units under min-params come from an independent model of each tree: the
// modules and their parameter counts written out here from the config's sizes, with FSDP1's
// _recursive_wrap applied to it as PyTorch's wrap.py writes it (recurse into a module whose
// subtree reaches the threshold; wrap it when what its children did not wrap reaches it too;
// ModuleList never wrapped). Tied modules (GPT-2's wte and lm_head, and transformer, which
// holds wte) are marked by hand. The trees' totals are checked against the registry's
// parameter counts, so a wrong tree cannot pass silently. Then training under a min-params
// policy at W = 2 equals the single-process reference within 1e-5, as the other equivalence
// tests.
#include "support/gpt_case.h"
#include "support/harness.h"
#include "support/test_support.h"

#include <fsdp/comm/rendezvous.h>
#include <fsdp/models/model.h>
#include <fsdp/wrap_policy.h>
#include <models/gpt2/gpt2.h>
#include <models/llama/llama.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace fsdp::test {
namespace {

using models::GPT2Config;
using models::GPT2LMHead;
using models::GPT2LMHeadImpl;
using models::GPT2Options;
using models::LlamaConfig;
using models::LlamaForCausalLM;
using models::LlamaForCausalLMImpl;
using models::LlamaOptions;

// ---- the independent model of a module tree ----------------------------------------------

struct Node {
  std::string name;
  int64_t own = 0;  // elements of the parameters registered on this module itself
  std::vector<Node> children;
  bool container = false;  // ModuleList: FSDP1 never wraps it
  bool tied = false;       // shares a parameter with a module outside it: never a unit
};

int64_t total(const Node& n) {
  int64_t t = n.own;
  for (const auto& c : n.children) t += total(c);
  return t;
}

std::string join(const std::string& path, const std::string& name) {
  return path.empty() ? name : path + "." + name;
}

// FSDP1's _recursive_wrap with size_based_auto_wrap_policy: returns the elements wrapped at or
// under n and appends the wrapped paths.
int64_t recursive_wrap(const Node& n, const std::string& path, int64_t min,
                       std::vector<std::string>& out) {
  const int64_t nonwrapped = total(n);
  if (nonwrapped < min) return 0;  // policy(recurse=True) is false
  int64_t wrapped = 0;
  for (const auto& c : n.children) wrapped += recursive_wrap(c, join(path, c.name), min, out);
  if (!path.empty() && nonwrapped - wrapped >= min && !n.container && !n.tied) {
    out.push_back(path);
    return nonwrapped;
  }
  return wrapped;
}

std::set<std::string> expected_units(const Node& root, int64_t min) {
  std::vector<std::string> out;
  recursive_wrap(root, "", min, out);
  return {out.begin(), out.end()};
}

Node leaf(const std::string& name, int64_t own) { return Node{name, own, {}, false, false}; }

Node gpt2_tree(const GPT2Config& c) {
  const int64_t d = c.n_embd;
  Node h{"h", 0, {}, true, false};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    h.children.push_back(
        Node{std::to_string(i),
             0,
             {leaf("ln_1", 2 * d),
              Node{"attn", 0, {leaf("c_attn", 3 * d * d + 3 * d), leaf("c_proj", d * d + d)}},
              leaf("ln_2", 2 * d),
              Node{"mlp", 0, {leaf("c_fc", 4 * d * d + 4 * d), leaf("c_proj", 4 * d * d + d)}}}});
  }
  Node wte{"wte", c.vocab_size * d, {}, false, true};
  Node transformer{
      "transformer", 0, {wte, leaf("wpe", c.n_positions * d), h, leaf("ln_f", 2 * d)}, false, true};
  Node lm_head{"lm_head", 0, {}, false, true};  // its weight is wte's, counted there
  return Node{"", 0, {transformer, lm_head}};
}

Node llama_tree(const LlamaConfig& c) {
  const int64_t d = c.hidden_size, f = c.intermediate_size;
  const int64_t kv = c.num_key_value_heads * (d / c.num_attention_heads);
  Node layers{"layers", 0, {}, true, false};
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    layers.children.push_back(
        Node{std::to_string(i),
             0,
             {leaf("input_layernorm", d),
              Node{"self_attn",
                   0,
                   {leaf("q_proj", d * d), leaf("k_proj", kv * d), leaf("v_proj", kv * d),
                    leaf("o_proj", d * d)}},
              leaf("post_attention_layernorm", d),
              Node{"mlp",
                   0,
                   {leaf("gate_proj", f * d), leaf("up_proj", f * d), leaf("down_proj", d * f)}}}});
  }
  EXPECT_FALSE(c.tie_word_embeddings) << "llama_tree models the untied head only";
  Node model{"model", 0, {leaf("embed_tokens", c.vocab_size * d), layers, leaf("norm", d)}};
  return Node{"", 0, {model, leaf("lm_head", c.vocab_size * d)}};
}

std::vector<std::string> paths_of(const std::vector<WrapUnit>& units) {
  std::vector<std::string> paths;
  for (const auto& u : units) paths.push_back(u.path);
  return paths;
}

// Every unit comes after the units below it (fully_shard must go bottom-up).
void expect_bottom_up(const std::vector<std::string>& order) {
  for (size_t i = 0; i < order.size(); ++i) {
    for (size_t j = i + 1; j < order.size(); ++j) {
      EXPECT_NE(order[j].rfind(order[i] + ".", 0), 0u)
          << order[j] << " (an ancestor) comes before " << order[i];
    }
  }
}

void expect_min_params_units(const torch::nn::Module& model, const Node& tree, int64_t min) {
  const auto units = select_wrap_units(model, size_based_wrap_policy(min));
  const auto order = paths_of(units);
  EXPECT_EQ(std::set<std::string>(order.begin(), order.end()), expected_units(tree, min))
      << "min_num_params " << min;
  EXPECT_EQ(std::set<std::string>(order.begin(), order.end()).size(), order.size());
  expect_bottom_up(order);
  for (const auto& u : units) EXPECT_GE(u.params, min) << u.path;
}

std::shared_ptr<torch::nn::Module> build_gpt2(const GPT2Config& config) {
  return GPT2LMHead(GPT2Options(config).seed(3)).ptr();
}

std::shared_ptr<torch::nn::Module> build_llama(const LlamaConfig& config) {
  return LlamaForCausalLM(LlamaOptions(config).seed(3)).ptr();
}

// ---- which units ------------------------------------------------------------------------

TEST(WrapPolicy, IndependentTreesMatchTheRegistry) {
  EXPECT_EQ(total(gpt2_tree(GPT2Config::tiny())), 35'712);
  EXPECT_EQ(total(gpt2_tree(GPT2Config::small())), 14'393'088);
  EXPECT_EQ(total(llama_tree(LlamaConfig::tiny())), 34'976);
  // And the hand-derived sets the trees give for tiny GPT-2 (block: 12,704 elements; attn
  // 4,224; c_fc 4,224; mlp.c_proj 4,128; the tied wte keeps transformer out). At 4,200 the
  // mlp keeps 4,128 < 4,200 once c_fc is a unit, and the block 12,704 - 2 x 4,224 = 4,256.
  EXPECT_EQ(expected_units(gpt2_tree(GPT2Config::tiny()), 12'704),
            (std::set<std::string>{"transformer.h.0", "transformer.h.1"}));
  EXPECT_EQ(expected_units(gpt2_tree(GPT2Config::tiny()), 4'200),
            (std::set<std::string>{"transformer.h.0.attn", "transformer.h.0.mlp.c_fc",
                                   "transformer.h.0", "transformer.h.1.attn",
                                   "transformer.h.1.mlp.c_fc", "transformer.h.1"}));
}

TEST(WrapPolicy, MinParamsOnGpt2Tiny) {
  const auto model = build_gpt2(GPT2Config::tiny());
  const Node tree = gpt2_tree(GPT2Config::tiny());
  for (const int64_t min : {1, 64, 1'000, 2'048, 4'000, 4'128, 4'200, 4'224, 8'352, 12'704, 12'705,
                            25'408, 1'000'000}) {
    expect_min_params_units(*model, tree, min);
  }
}

TEST(WrapPolicy, MinParamsOnGpt2Small) {
  const auto model = build_gpt2(GPT2Config::small());
  const Node tree = gpt2_tree(GPT2Config::small());
  for (const int64_t min : {100'000, 443'136, 600'000, 1'000'000, 1'770'000, 3'000'000}) {
    expect_min_params_units(*model, tree, min);
  }
}

TEST(WrapPolicy, MinParamsOnLlamaTiny) {
  const auto model = build_llama(LlamaConfig::tiny());
  const Node tree = llama_tree(LlamaConfig::tiny());
  for (const int64_t min : {1, 32, 1'024, 2'048, 3'072, 6'144, 8'192, 9'280, 9'281, 100'000}) {
    expect_min_params_units(*model, tree, min);
  }
  // llama-tiny is untied: the embeddings and the head can be units of their own.
  EXPECT_EQ(paths_of(select_wrap_units(*model, size_based_wrap_policy(8'192))),
            (std::vector<std::string>{"model.embed_tokens", "model.layers.0", "model.layers.1",
                                      "lm_head"}));
}

// By type: the model's own units' types select exactly its units (the blocks).
TEST(WrapPolicy, ModuleTypeSelectsTheBlocks) {
  for (const std::string name : {"tiny", "small", "llama-tiny"}) {
    const auto built = models::model_spec(name)->build(models::BuildOptions().seed(3));
    std::vector<std::type_index> types;
    std::vector<std::string> names;
    for (const auto& [unit_name, unit] : built->units()) {
      types.emplace_back(typeid(*unit));
      names.push_back(unit_name);
    }
    EXPECT_EQ(paths_of(select_wrap_units(*built->root(), module_type_wrap_policy(types))), names)
        << name;
  }
  // A type that appears nowhere selects nothing; LayerNorm selects every LayerNorm.
  const auto gpt2 = build_gpt2(GPT2Config::tiny());
  EXPECT_EQ(
      select_wrap_units(*gpt2, module_type_wrap_policy({typeid(torch::nn::LinearImpl)})).size(),
      8u);
  EXPECT_EQ(paths_of(select_wrap_units(
                *gpt2, module_type_wrap_policy({typeid(torch::nn::LayerNormImpl)}))),
            (std::vector<std::string>{"transformer.h.0.ln_1", "transformer.h.0.ln_2",
                                      "transformer.h.1.ln_1", "transformer.h.1.ln_2",
                                      "transformer.ln_f"}));
  // The tied embedding is never a unit, even when its type is asked for.
  EXPECT_EQ(paths_of(select_wrap_units(
                *gpt2, module_type_wrap_policy({typeid(torch::nn::EmbeddingImpl)}))),
            std::vector<std::string>{"transformer.wpe"});
}

// A predicate sees every module in post-order with its unwrapped count.
TEST(WrapPolicy, PredicateSeesPathsAndUnwrappedCounts) {
  const auto model = build_gpt2(GPT2Config::tiny());
  std::map<std::string, int64_t> seen;
  const auto units = select_wrap_units(
      *model, predicate_wrap_policy(
                  [&seen](const std::string& path, const torch::nn::Module&, int64_t unwrapped) {
                    seen[path] = unwrapped;
                    return path.size() >= 4 && path.compare(path.size() - 4, 4, ".mlp") == 0;
                  }));
  EXPECT_EQ(paths_of(units),
            (std::vector<std::string>{"transformer.h.0.mlp", "transformer.h.1.mlp"}));
  EXPECT_EQ(units[0].params, 8'352);
  EXPECT_EQ(seen.at("transformer.h.0.mlp.c_fc"), 4'224);
  EXPECT_EQ(seen.at("transformer.h.0"), 12'704 - 8'352);  // its mlp is a unit already
  EXPECT_EQ(seen.at("transformer.h"), 2 * (12'704 - 8'352));
  EXPECT_EQ(seen.at("transformer"), 35'712 - 2 * 8'352);
  EXPECT_EQ(seen.count(""), 0u);  // the root is not asked: it is always a unit
}

TEST(WrapPolicy, RefusesBadPolicies) {
  EXPECT_THROW(size_based_wrap_policy(0), c10::Error);
  EXPECT_THROW(size_based_wrap_policy(-5), c10::Error);
  const auto model = build_gpt2(GPT2Config::tiny());
  EXPECT_THROW(select_wrap_units(*model, WrapPolicy()), c10::Error);
}

// fully_shard_tree shards exactly the selected modules and the root, on every rank.
TEST(WrapPolicy, FullyShardTreeShardsTheSelectedUnitsThenTheRoot) {
  const Node tree = gpt2_tree(GPT2Config::tiny());
  std::set<std::string> expected = expected_units(tree, 4'000);
  expected.insert("");
  run_ranks_in_threads(2, [&](std::shared_ptr<ProcessGroup> group) {
    DeviceMesh mesh(group);
    const auto model = build_gpt2(GPT2Config::tiny());
    const FSDPModule root = fully_shard_tree(model, mesh, size_based_wrap_policy(4'000));
    EXPECT_EQ(root.path(), "");
    std::set<std::string> sharded;
    int64_t elements = 0;
    for (const FSDPModule& unit : fsdp_modules_under(*model)) {
      sharded.insert(unit.path());
      for (const auto& p : unit.sharded_parameters()) {
        int64_t n = 1;
        for (const int64_t s : p.metadata.global_shape) n *= s;
        elements += n;
        // The tied embedding stays with the root.
        if (p.name == "transformer.wte.weight") EXPECT_EQ(unit.path(), "");
      }
    }
    EXPECT_EQ(sharded, expected);
    EXPECT_EQ(elements, 35'712);  // every parameter in exactly one unit
  });
  EXPECT_THROW(run_ranks_in_threads(1,
                                    [](std::shared_ptr<ProcessGroup> group) {
                                      fully_shard_tree(std::shared_ptr<torch::nn::Module>(),
                                                       DeviceMesh(group),
                                                       size_based_wrap_policy(1));
                                    }),
               std::exception);
}

// ---- training under a min-params policy equals the reference -----------------------------

TrainCase gpt_min_params_case(int64_t min) {
  GptCaseOptions opt;
  opt.deferred = false;
  TrainCase c = gpt_case(opt);
  c.shard = [min](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    fully_shard_tree(m, mesh, size_based_wrap_policy(min),
                     FullyShardTreeOptions().root_options(FullyShardOptions()));
  };
  return c;
}

TEST(WrapPolicyEquivalence, Gpt2NestedUnitsMatchSingleProcess) {
  // attn, mlp.c_fc and mlp.c_proj of each block are units inside an unwrapped block.
  const TrainCase c = gpt_min_params_case(4'000);
  expect_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
}

TEST(WrapPolicyEquivalence, Gpt2EveryModuleAUnitMatchesSingleProcess) {
  const TrainCase c = gpt_min_params_case(1);  // every Linear, LayerNorm, wpe: a unit
  expect_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
}

TEST(WrapPolicyEquivalence, LlamaMatchesSingleProcess) {
  TrainCase c;
  c.loss = [](const std::shared_ptr<torch::nn::Module>& m, const at::Tensor& x,
              const at::Tensor& y) {
    LlamaForCausalLM model(std::static_pointer_cast<LlamaForCausalLMImpl>(m));
    return models::loss(fsdp::forward(model, x), y);
  };
  c.batch = [](int64_t step) { return text_batch(step, 12, 16, 7); };
  c.steps = 8;
  c.lr = 1e-3;
  c.make_model = [](const DeviceMesh*) {
    return LlamaForCausalLM(LlamaOptions(LlamaConfig::tiny()).seed(42)).ptr();
  };
  // The MLP projections, self_attn, the embeddings and the head are units (see the tree).
  c.shard = [](const std::shared_ptr<torch::nn::Module>& m, const DeviceMesh& mesh) {
    fully_shard_tree(m, mesh, size_based_wrap_policy(2'048));
  };
  expect_equivalent(train_reference(c), train_sharded(c, 2), 1e-5, 1e-5);
}

}  // namespace
}  // namespace fsdp::test
