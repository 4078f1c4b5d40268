// Checkpoint names -> weights: both expert layouts give bit-identical logits, errors name the file
// and tensor (missing, wrong shape with expected vs found, wrong dtype), unused tensors are reported.
#include <gtest/gtest.h>

#include "backend/cpu/cpu_backend.h"
#include "model/load.h"
#include "tiny_checkpoint.h"
#include "runtime/direct_state.h"

namespace sparkserve::test {
namespace {

std::filesystem::path tmp_dir(const std::string& name) {
  return std::filesystem::temp_directory_path() / ("sparkserve_model_test_" + std::to_string(::getpid()) + "_" + name);
}

ModelConfig parse(const std::string& json) {
  auto c = parse_model_config(json, "config.json");
  EXPECT_TRUE(c.ok()) << c.message();
  return *c;
}

// Logits of all positions of a fixed prompt, or the load error.
Expected<std::vector<float>> run(const std::filesystem::path& dir, std::vector<std::string>* notes = nullptr) {
  auto backend = make_cpu_backend(2);
  SS_ASSIGN_OR_RETURN(auto model, load_qwen35(dir, *backend, notes));
  StateLimits lim;
  lim.num_kv_blocks = 8;
  DirectState st(*backend, model->config(), lim);
  SS_ASSIGN_OR_RETURN(SequenceState seq, st.open_sequence());
  std::vector<SequenceInput> b(1);
  b[0].state = &seq;
  b[0].tokens = {3, 999, 0, 512, 77, 77, 12, 400, 401, 2};
  b[0].all_logits = true;
  SS_ASSIGN_OR_RETURN(Logits l, st.forward(*model, b));
  return l.data;
}

TEST(Weights, FusedAndPerExpertLayoutsGiveBitIdenticalLogits) {
  // Both layouts are loaded into the same stacked [E, 2I, H] / [E, H, I] buffers, so the
  // arithmetic is the same instruction for instruction: bitwise equality is expected.
  const std::string cfg = tiny_config();
  ModelConfig c = parse(cfg);
  auto fused_dir = tmp_dir("fused"), split_dir = tmp_dir("split");
  write_checkpoint(fused_dir, cfg, random_tensors(c, false, 7));
  write_checkpoint(split_dir, cfg, random_tensors(c, true, 7));
  std::vector<std::string> notes;
  auto a = run(fused_dir), b = run(split_dir, &notes);
  ASSERT_TRUE(a.ok()) << a.message();
  ASSERT_TRUE(b.ok()) << b.message();
  EXPECT_TRUE(notes.empty());
  ASSERT_EQ(a->size(), b->size());
  for (size_t i = 0; i < a->size(); ++i) ASSERT_EQ((*a)[i], (*b)[i]) << i;
  // And a different random checkpoint gives different logits (the comparison can fail).
  auto other_dir = tmp_dir("other");
  write_checkpoint(other_dir, cfg, random_tensors(c, false, 8));
  auto o = run(other_dir);
  ASSERT_TRUE(o.ok());
  EXPECT_NE(*o, *a);
  for (auto& d : {fused_dir, split_dir, other_dir}) std::filesystem::remove_all(d);
}

TEST(Weights, FixtureLayoutsGiveBitIdenticalLogits) {
  auto fused = run(fixture_dir("qwen35-moe-tiny"));
  auto split = run(fixture_dir("qwen35-moe-tiny-per-expert"));
  auto flat = run(fixture_dir("qwen35-moe-tiny-causallm"));
  ASSERT_TRUE(fused.ok() && split.ok() && flat.ok());
  EXPECT_EQ(*fused, *split);
  EXPECT_EQ(*fused, *flat);
}

TEST(Weights, UnusedTensorsAreReportedNotErrors) {
  std::vector<std::string> notes;
  ASSERT_TRUE(run(fixture_dir("qwen35-moe-tiny"), &notes).ok());
  // The vision tower (config.json has vision_config) is loaded now; only MTP stays unused.
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("19 multi-token-prediction tensors (mtp.*)"), std::string::npos) << notes[0];

  const std::string cfg = tiny_config();
  ModelConfig c = parse(cfg);
  auto ts = random_tensors(c, false, 1);
  ts.push_back({"model.layers.0.mlp.mystery.weight", DType::kBF16, {2}, {1, 2}});
  auto dir = tmp_dir("extra");
  write_checkpoint(dir, cfg, ts);
  notes.clear();
  ASSERT_TRUE(run(dir, &notes).ok());
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0], "warning: checkpoint tensor 'model.layers.0.mlp.mystery.weight' is not used by the model");
  std::filesystem::remove_all(dir);
}

// Writes the tiny checkpoint with `mutate` applied and returns the load error.
std::string load_error(const std::function<void(std::vector<RawTensor>&)>& mutate, bool per_expert = false) {
  const std::string cfg = tiny_config();
  ModelConfig c = parse(cfg);
  auto ts = random_tensors(c, per_expert, 3);
  mutate(ts);
  auto dir = tmp_dir("bad");
  write_checkpoint(dir, cfg, ts);
  auto r = run(dir);
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.message();
}

TEST(Weights, MissingTensorIsNamed) {
  std::string msg = load_error([](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "model.layers.1.self_attn.k_norm.weight"; }),
             ts.end());
  });
  EXPECT_NE(msg.find("tensor 'model.layers.1.self_attn.k_norm.weight' is missing"), std::string::npos) << msg;
  EXPECT_NE(msg.find("sparkserve_model_test_"), std::string::npos) << msg;  // names the checkpoint folder
  EXPECT_NE(msg.find("expected shape [32]"), std::string::npos) << msg;

  msg = load_error([](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "model.layers.2.mlp.experts.5.up_proj.weight"; }),
             ts.end());
  }, true);
  EXPECT_NE(msg.find("'model.layers.2.mlp.experts.5.up_proj.weight' is missing"), std::string::npos) << msg;

  msg = load_error([](auto& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "lm_head.weight"; }), ts.end());
  });
  EXPECT_NE(msg.find("'lm_head.weight' is missing"), std::string::npos) << msg;
}

TEST(Weights, WrongShapeShowsExpectedAndFound) {
  std::string msg = load_error([](auto& ts) {
    RawTensor* t = find_tensor(ts, "model.layers.0.linear_attn.in_proj_qkv.weight");
    t->shape = {t->shape[1], t->shape[0]};  // transposed: same element count, wrong shape
  });
  EXPECT_NE(msg.find("model.safetensors: tensor 'model.layers.0.linear_attn.in_proj_qkv.weight' has shape [64, 208], "
                     "expected [208, 64]"),
            std::string::npos)
      << msg;
  msg = load_error([](auto& ts) {
    RawTensor* t = find_tensor(ts, "model.layers.3.mlp.experts.gate_up_proj");
    t->shape[0] = 4;  // 4 experts instead of 8
    t->values.resize(t->values.size() / 2);
  });
  EXPECT_NE(msg.find("'model.layers.3.mlp.experts.gate_up_proj' has shape [4, 80, 64], expected [8, 80, 64]"),
            std::string::npos)
      << msg;
}

TEST(Weights, WrongDtypeIsNamed) {
  std::string msg = load_error([](auto& ts) { find_tensor(ts, "model.norm.weight")->dtype = DType::kI32; });
  EXPECT_NE(msg.find("model.safetensors: tensor 'model.norm.weight' has dtype I32, expected F32, BF16 or F16"),
            std::string::npos)
      << msg;
}

TEST(Weights, F32AndMixedDtypesAreAccepted) {
  // The same numbers stored as F32 (some tensors) give the same logits as all-BF16: the values are
  // bf16-exact, and both formats are converted to f32 exactly before arithmetic.
  const std::string cfg = tiny_config();
  ModelConfig c = parse(cfg);
  auto ts = random_tensors(c, false, 11);
  auto bf16_dir = tmp_dir("bf16"), mixed_dir = tmp_dir("mixed");
  write_checkpoint(bf16_dir, cfg, ts);
  for (const char* n : {"model.layers.0.linear_attn.A_log", "model.layers.0.linear_attn.norm.weight",
                        "model.layers.1.self_attn.q_proj.weight", "model.layers.2.mlp.experts.down_proj", "lm_head.weight"})
    find_tensor(ts, n)->dtype = DType::kF32;
  write_checkpoint(mixed_dir, cfg, ts);
  auto a = run(bf16_dir), b = run(mixed_dir);
  ASSERT_TRUE(a.ok() && b.ok()) << b.message();
  EXPECT_EQ(*a, *b);
  std::filesystem::remove_all(bf16_dir);
  std::filesystem::remove_all(mixed_dir);
}

TEST(Weights, TiedEmbeddingsUseTheEmbeddingAsLmHead) {
  const std::string untied_cfg = tiny_config();
  const std::string tied_cfg = tiny_config("qwen35-moe-tiny-causallm", [](nlohmann::json& j) { j["tie_word_embeddings"] = true; });
  ModelConfig c = parse(untied_cfg);
  auto ts = random_tensors(c, false, 5);
  // Untied checkpoint whose lm_head is a copy of the embedding == tied checkpoint without lm_head.
  find_tensor(ts, "lm_head.weight")->values = find_tensor(ts, "model.embed_tokens.weight")->values;
  auto untied = tmp_dir("untied"), tied = tmp_dir("tied");
  write_checkpoint(untied, untied_cfg, ts);
  ts.erase(std::remove_if(ts.begin(), ts.end(), [](auto& t) { return t.name == "lm_head.weight"; }), ts.end());
  write_checkpoint(tied, tied_cfg, ts);
  auto a = run(untied), b = run(tied);
  ASSERT_TRUE(a.ok() && b.ok()) << b.message();
  EXPECT_EQ(*a, *b);
  std::filesystem::remove_all(untied);
  std::filesystem::remove_all(tied);
}

TEST(Weights, NotAModelFolder) {
  auto backend = make_cpu_backend(1);
  auto r = load_qwen35("/nonexistent/model", *backend);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("/nonexistent/model"), std::string::npos);
}

}  // namespace
}  // namespace sparkserve::test
