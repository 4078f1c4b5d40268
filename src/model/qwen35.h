// The Qwen3.5 text model (dense `qwen3_5` and MoE `qwen3_5_moe`), written once against the
// backend op interface (backend/ops.h); see model-qwen35.md §2 for the math.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/weights.h"
#include "model/forward_batch.h"
#include "model/multimodal.h"
#include "model/vision.h"

namespace sparkserve {

// The geometry of a GDN layer's state (conv window + recurrent state) for this config.
GdnDims gdn_dims(const ModelConfig& c);
int count_layers(const ModelConfig& c, LayerType type);

class Qwen35Model {
 public:
  Qwen35Model(Backend& backend, ModelConfig config, ModelWeights weights);
  ~Qwen35Model();

  const ModelConfig& config() const { return config_; }
  // The checkpoint has a vision tower (config.json vision_config and its tensors).
  bool has_vision() const { return vision_ != nullptr; }
  // Runs the vision tower over mm's images (once; forward does it on first sight).
  Status encode_images(MultimodalPrompt& mm);
  Backend& backend() { return backend_; }

  // Runs every sequence's new tokens through the model: their keys/values go into the KV blocks at
  // their positions, their GDN state rows advance, and the requested logits rows come back. The
  // caller owns every block and row: each sequence's block table must already cover its new
  // positions. Errors (token id out of range, a block table too short, a sequence without a GDN
  // slot, two sequences on one slot) are found before anything is written.
  // On a backend that can record (CUDA), a batch of B single-token (decode) spans replays a forward
  // recorded for B once B has been seen before: one host->device copy of the step's inputs, one graph
  // launch, one copy of the logits back. Same kernels on the same data: the logits are bitwise those
  // of running the ops one by one.
  Expected<Logits> forward(std::span<const ForwardSeq> batch, const StatePools& state);

  // Recorded decode steps are on by default; off only for A/B measurements (bench --no-graphs) and tests.
  void set_graphs_enabled(bool on);
  bool graphs_enabled() const { return graphs_enabled_; }
  // Fused chains (Backend::gdn_decode_step for pure-decode GDN layers, attention_prep,
  // gated_attention, add_gated_shared_rmsnorm) are on by default; off only for A/B measurements
  // (bench --no-fused) and tests. On the CPU backend both settings compute bit-identical results
  // (the fused ops are the compositions there).
  void set_fused_enabled(bool on) { fused_ = on; }
  bool fused_enabled() const { return fused_; }
  struct GraphStats {
    int64_t recorded = 0;  // decode steps recorded (a new batch size, more KV blocks, new state pools)
    int64_t replayed = 0;  // forwards that replayed a recording (recording steps included)
    double record_ms = 0;  // host time spent recording and instantiating, all recordings
    int64_t kernels = -1;  // kernel nodes of the latest recording (-1: unknown)
  };
  GraphStats graph_stats() const { return graph_stats_; }

 private:
  struct Layout;  // the batch as rows and spans, see qwen35.cpp
  struct DecodeGraph;  // one recorded decode step, see qwen35.cpp

  // The layers: tok [T] i32 -> h [T, H] f32, the final-normalised hidden rows.
  void trunk(const Tensor& h, const Tensor& tok, const Layout& layout, const StatePools& state);
  // A pure-decode batch through its recording (recording it first where needed); nullopt when the
  // step has to run op by op (first sight of this batch size, or the backend could not record).
  // ids, pos: the batch's token ids and positions, one per span.
  std::optional<Logits> forward_recorded(const Layout& layout, const std::vector<int32_t>& ids,
                                         const std::vector<int32_t>& pos, const StatePools& state,
                                         const std::vector<int64_t>& row_argmax);
  void drop_graphs();

  // Each block reads h ([T, H], normalised hidden) and writes its output to out ([T, H]).
  void gdn_layer(const Tensor& out, const Tensor& h, const LayerWeights& w, int gdn_index,
                 const Layout& layout, const StatePools& state);
  void attention_layer(const Tensor& out, const Tensor& h, const LayerWeights& w, int attn_index,
                       const Layout& layout, const StatePools& state);
  // The attention input chain op by op (split, q/k norms, RoPE, KV write): what attention_prep
  // fuses; run when fused ops are off. qg: [T, nh, 2hd], k, v: [T, kvh, hd] -> q, gate: [T, nh, hd].
  void unfused_attention_prep(const Tensor& q, const Tensor& gate, const Tensor& qg, const Tensor& k,
                              const Tensor& v, const AttentionWeights& w, const Layout& layout,
                              const KvPool& pool);
  // The MoE block and the residual step after it: out = the block's output, residual += out,
  // h = rmsnorm(residual) with next_norm. residual: [T, H], next_norm: [H].
  void moe(const Tensor& out, const Tensor& h, const MoeWeights& w, const Tensor& residual, const Tensor& next_norm);
  void mlp(const Tensor& out, const Tensor& h, const MlpWeights& w);
  // hidden: [R, H] final-normalised rows -> [R, V] logits on the host (see download_logits).
  Logits lm_head(const Tensor& hidden, const std::vector<int64_t>& row_argmax = {});
  // logits: [R, V] f32 in backend memory -> host copy of the rows whose row_argmax is 0 (or every
  // row when row_argmax is empty), and the argmax over the first row_argmax[r] columns of the others.
  Logits download_logits(const Tensor& logits, const std::vector<int64_t>& row_argmax = {});

  Buffer buffer(std::vector<int64_t> shape, DType dtype = DType::kF32) {
    return Buffer(&backend_, dtype, std::move(shape));
  }

  Backend& backend_;
  ModelConfig config_;
  ModelWeights w_;
  std::unique_ptr<VisionTower> vision_;
  Buffer mrope_axis_, mrope_inv_freq_;  // the text M-RoPE as rope_axes tables: [rotary_dim / 2]
  std::vector<int> layer_slot_;  // per layer: its index among GDN layers or among attention layers

  bool graphs_enabled_ = true;
  bool fused_ = true;
  GraphStats graph_stats_;
  std::map<int64_t, std::unique_ptr<DecodeGraph>> graphs_;  // by batch size
  std::vector<uintptr_t> graph_state_key_;  // block size and the state pools the recordings write
  Buffer graph_logits_;                        // [slots, V]: every recording's logits rows
};

}  // namespace sparkserve
