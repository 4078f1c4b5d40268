// Single quantized Linears of the compressed-tensors fixtures (tests/fixtures/qwen35-quant-*/,
// reference.json linear_cases): the input rows the reference model fed a module and the output
// compressed-tensors' own fake-quant forward produced (tools/quant_fixture_linear_cases.py). Loaded
// through the real loader and run through the CPU backend's linear / expert path, the output must
// match to float32 summation noise: the inputs are identical, so activation codes and weights are the
// same numbers on both sides and only the order of the K-term sum differs.
//
// Tolerance: max|y - ref| <= 1e-5 · max|ref|. Both sides sum K <= 256 f32 products of magnitude
// <= max|x̂|·max|w|; the reordering error is <= ~K·2^-24·Σ|x̂w| and in practice ~1e-7 relative. One
// activation value quantized to a neighbouring E2M1 / E4M3 code (a different rounding rule) moves an
// output by ~1e-2 relative, a wrong scale convention by O(1): both far outside.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>

#include <nlohmann/json.hpp>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/npy.h"
#include "loader/hf_config.h"
#include "loader/safetensors.h"
#include "loader/weights.h"

namespace sparkserve {
namespace {

namespace fs = std::filesystem;

fs::path fixtures_root() { return fs::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures"; }

// The Linear holding `module`, the expert index and the column range of its rows in that Linear.
struct Target {
  const Linear* lin = nullptr;
  int64_t expert = 0;
  int64_t col0 = 0;
  int64_t cols = 0;
};

Target resolve(const ModelWeights& w, const std::string& module) {
  std::smatch m;
  static const std::regex re(R"(^model\.language_model\.layers\.(\d+)\.(.*)$)");
  Target t;
  if (!std::regex_match(module, m, re)) return t;
  const LayerWeights& L = w.layers.at(static_cast<size_t>(std::stoi(m[1].str())));
  const std::string rest = m[2].str();
  auto whole = [&](const Linear& l) {
    t.lin = &l;
    t.cols = l.out_features;
  };
  auto half = [&](const Linear& l, bool second) {
    t.lin = &l;
    t.cols = l.out_features / 2;
    t.col0 = second ? t.cols : 0;
  };
  std::smatch e;
  static const std::regex expert_re(R"(^mlp\.experts\.(\d+)\.(gate|up|down)_proj$)");
  if (std::regex_match(rest, e, expert_re)) {
    t.expert = std::stoi(e[1].str());
    if (e[2] == "down") {
      whole(L.moe.experts_down);
    } else {
      half(L.moe.experts_gate_up, e[2] == "up");
    }
    return t;
  }
  if (rest == "linear_attn.in_proj_qkv") whole(L.gdn.in_proj_qkv);
  if (rest == "linear_attn.in_proj_z") whole(L.gdn.in_proj_z);
  if (rest == "linear_attn.in_proj_a") whole(L.gdn.in_proj_a);
  if (rest == "linear_attn.in_proj_b") whole(L.gdn.in_proj_b);
  if (rest == "linear_attn.out_proj") whole(L.gdn.out_proj);
  if (rest == "self_attn.q_proj") whole(L.attn.q_proj);
  if (rest == "self_attn.k_proj") whole(L.attn.k_proj);
  if (rest == "self_attn.v_proj") whole(L.attn.v_proj);
  if (rest == "self_attn.o_proj") whole(L.attn.o_proj);
  if (rest == "mlp.shared_expert.gate_proj") half(L.moe.shared_gate_up, false);
  if (rest == "mlp.shared_expert.up_proj") half(L.moe.shared_gate_up, true);
  if (rest == "mlp.shared_expert.down_proj") whole(L.moe.shared_down);
  return t;
}

TEST(QuantFixtureLinears, MatchCompressedTensorsForward) {
  std::vector<fs::path> dirs;
  if (fs::exists(fixtures_root()))
    for (const auto& d : fs::directory_iterator(fixtures_root()))
      if (d.path().filename().string().rfind("qwen35-quant-", 0) == 0 && fs::exists(d.path() / "reference.json"))
        dirs.push_back(d.path());
  if (dirs.empty()) GTEST_SKIP() << "no tests/fixtures/qwen35-quant-* fixtures";
  std::sort(dirs.begin(), dirs.end());
  int checked = 0;
  for (const fs::path& dir : dirs) {
    std::ifstream f(dir / "reference.json");
    const nlohmann::json ref = nlohmann::json::parse(f);
    if (!ref.contains("linear_cases")) continue;
    auto config = load_model_config(dir);
    ASSERT_TRUE(config.ok()) << config.message();
    auto ckpt = Checkpoint::open(dir);
    ASSERT_TRUE(ckpt.ok()) << ckpt.message();
    CpuBackend be(2);
    auto w = load_weights(*ckpt, *config, be);
    ASSERT_TRUE(w.ok()) << dir << ": " << w.message();
    for (const auto& c : ref["linear_cases"]) {
      const std::string module = c["module"];
      const Target t = resolve(*w, module);
      ASSERT_NE(t.lin, nullptr) << module;
      auto x = read_npy_f32(dir / c["input_file"].get<std::string>());
      auto y = read_npy_f32(dir / c["output_file"].get<std::string>());
      ASSERT_TRUE(x.ok() && y.ok());
      const int64_t T = x->shape[0], K = x->shape[1];
      ASSERT_EQ(K, t.lin->in_features) << module;
      ASSERT_EQ(y->shape[1], t.cols) << module;
      std::vector<float> out(static_cast<size_t>(T * t.lin->out_features));
      cpu::linear_rows(be.pool(), out.data(), x->data.data(), T, *t.lin, t.expert);
      double max_diff = 0, max_ref = 0;
      for (int64_t r = 0; r < T; ++r)
        for (int64_t n = 0; n < t.cols; ++n) {
          const double ref_v = y->data[static_cast<size_t>(r * t.cols + n)];
          const double got = out[static_cast<size_t>(r * t.lin->out_features + t.col0 + n)];
          max_diff = std::max(max_diff, std::fabs(got - ref_v));
          max_ref = std::max(max_ref, std::fabs(ref_v));
        }
      std::printf("[measured] %s %s (%s, %s): max|d| = %.3g, max|ref| = %.3g\n", dir.filename().c_str(),
                  module.c_str(), std::string(weight_format_name(t.lin->format)).c_str(),
                  std::string(activation_quant_name(t.lin->activation)).c_str(), max_diff, max_ref);
      EXPECT_LE(max_diff, 1e-5 * max_ref) << dir.filename() << " " << module;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

}  // namespace
}  // namespace sparkserve
