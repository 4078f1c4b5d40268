// Reads the checkpoints that transformers' save_pretrained (safetensors 0.8.0) wrote into
// tests/fixtures/qwen35-*: a check of the reader against files this project did not write.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "loader/hf_config.h"
#include "loader/safetensors.h"

namespace sparkserve {
namespace {

using ::testing::ElementsAre;

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures" / name;
}

const char* const kFixtures[] = {"qwen35-moe-tiny", "qwen35-moe-tiny-per-expert", "qwen35-moe-tiny-causallm",
                                 "qwen35-dense-tiny", "qwen35-dense-tiny-causallm"};

uint64_t header_length(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  unsigned char b[8] = {};
  in.read(reinterpret_cast<char*>(b), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | b[i];
  return n;
}

// The reference writer lays tensors out back to back from the end of the header to the end of the
// file (its reader rejects anything else), so our absolute offsets must tile that range exactly.
TEST(FixtureCheckpoints, TensorsTileEachFileAsTheReferenceWriterLaysThemOut) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto ckpt = Checkpoint::open(fixture(name));
    ASSERT_TRUE(ckpt.ok()) << ckpt.message();
    for (const auto& file : ckpt->files()) {
      std::vector<const TensorInfo*> in_file;
      for (const auto& [n, t] : ckpt->tensors())
        if (t.file == file) in_file.push_back(&t);
      ASSERT_FALSE(in_file.empty()) << file;
      std::sort(in_file.begin(), in_file.end(),
                [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
      uint64_t expect = 8 + header_length(file);
      EXPECT_EQ(expect % 8, 0u);
      for (const TensorInfo* t : in_file) {
        EXPECT_EQ(t->offset, expect) << t->name;
        expect = t->offset + t->nbytes;
      }
      EXPECT_EQ(expect, std::filesystem::file_size(file)) << file;
    }
  }
}

TEST(FixtureCheckpoints, ShapesAgreeWithTheirConfigs) {
  for (const char* name : kFixtures) {
    SCOPED_TRACE(name);
    auto ckpt = Checkpoint::open(fixture(name));
    ASSERT_TRUE(ckpt.ok()) << ckpt.message();
    auto cfg = load_model_config(fixture(name));
    ASSERT_TRUE(cfg.ok()) << cfg.message();
    const std::string p = cfg->nested_text_config ? "model.language_model." : "model.";
    auto shape_of = [&](const std::string& t) {
      const TensorInfo* info = ckpt->find(t);
      EXPECT_NE(info, nullptr) << t;
      return info ? info->shape : std::vector<int64_t>{};
    };
    const int64_t h = cfg->hidden_size;
    EXPECT_THAT(shape_of(p + "embed_tokens.weight"), ElementsAre(cfg->vocab_size, h));
    EXPECT_THAT(shape_of("lm_head.weight"), ElementsAre(cfg->vocab_size, h));
    EXPECT_THAT(shape_of(p + "layers.0.linear_attn.in_proj_qkv.weight"), ElementsAre(cfg->gdn_conv_dim(), h));
    EXPECT_THAT(shape_of(p + "layers.1.self_attn.q_proj.weight"),
                ElementsAre(2 * cfg->num_attention_heads * cfg->head_dim, h));
    EXPECT_EQ(cfg->layer_types[1], LayerType::kFullAttention);
    if (!cfg->is_moe) {
      EXPECT_THAT(shape_of(p + "layers.0.mlp.gate_proj.weight"), ElementsAre(cfg->intermediate_size, h));
    } else if (std::string(name) == "qwen35-moe-tiny-per-expert") {
      EXPECT_THAT(shape_of(p + "layers.4.mlp.experts.7.down_proj.weight"), ElementsAre(h, cfg->moe_intermediate_size));
    } else {
      EXPECT_THAT(shape_of(p + "layers.0.mlp.experts.gate_up_proj"),
                  ElementsAre(cfg->num_experts, 2 * cfg->moe_intermediate_size, h));
    }
  }
}

TEST(FixtureCheckpoints, ShardedIndexAndExtraMtpShard) {
  auto dense = Checkpoint::open(fixture("qwen35-dense-tiny"));
  ASSERT_TRUE(dense.ok()) << dense.message();  // the index cross-check passed
  // The two indexed shards and the MTP layer's extra file the index does not list.
  ASSERT_EQ(dense->files().size(), 3u);
  EXPECT_EQ(dense->find("lm_head.weight")->file.filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(dense->find("mtp.fc.weight")->file.filename(), "mtp_extra.safetensors");

  auto moe = Checkpoint::open(fixture("qwen35-moe-tiny"));
  ASSERT_TRUE(moe.ok()) << moe.message();
  int mtp = 0, visual = 0;
  for (const auto& [n, t] : moe->tensors()) {
    if (n.rfind("mtp.", 0) == 0) {
      ++mtp;
      EXPECT_EQ(t.file.filename(), "mtp_extra.safetensors") << n;
    }
    if (n.rfind("model.visual.", 0) == 0) ++visual;
  }
  EXPECT_EQ(mtp, 19);  // tests/fixtures/README.md
  EXPECT_GT(visual, 0);
}

// A_log = log(A) with A log-uniform in [0.01, 2] (fixtures README), stored as F32 in this fixture
// and as BF16 elsewhere. Bounds widened by 2^-8 relative for bf16 rounding.
TEST(FixtureCheckpoints, ReadsF32AndBf16ValuesInTheDocumentedRange) {
  const double lo = std::log(0.01) * (1 + 1.0 / 256), hi = std::log(2.0) * (1 + 1.0 / 256);
  struct Case {
    const char* fixture;
    const char* tensor;
    DType dtype;
  };
  for (const Case& c : {Case{"qwen35-dense-tiny-causallm", "model.layers.0.linear_attn.A_log", DType::kF32},
                        Case{"qwen35-moe-tiny", "model.language_model.layers.3.linear_attn.A_log", DType::kBF16}}) {
    SCOPED_TRACE(c.tensor);
    auto ckpt = Checkpoint::open(fixture(c.fixture));
    ASSERT_TRUE(ckpt.ok()) << ckpt.message();
    const TensorInfo* info = ckpt->find(c.tensor);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->dtype, c.dtype);
    auto v = ckpt->read_f32(*info);
    ASSERT_TRUE(v.ok()) << v.message();
    ASSERT_EQ(static_cast<int64_t>(v->size()), info->numel());
    for (float x : *v) {
      EXPECT_GE(x, lo);
      EXPECT_LE(x, hi);
    }
    // Not all equal: the values are the random draws, not a constant.
    EXPECT_NE(v->front(), v->back());
  }
}

}  // namespace
}  // namespace sparkserve
