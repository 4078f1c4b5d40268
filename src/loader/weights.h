// Checkpoint tensor names -> the model's weights in backend memory (model-qwen35.md §3).
// Accepts the ConditionalGeneration prefix `model.language_model.` and the flat CausalLM prefix
// `model.`; routed experts fused (`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj`
// [E, H, I]) or per expert (`mlp.experts.{e}.{gate,up,down}_proj.weight`), both loaded into the
// same stacked layout so they compute bit-identical results.
#pragma once

#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/load_options.h"
#include "loader/safetensors.h"
#include "loader/vision_weights.h"

namespace sparkserve {

struct GdnWeights {
  Linear in_proj_qkv;  // [conv_dim, H]: q | k | v
  Linear in_proj_z;    // [Hv*dv, H]
  Linear in_proj_b;    // [Hv, H]
  Linear in_proj_a;    // [Hv, H]
  Linear out_proj;     // [H, Hv*dv]
  Tensor conv;         // [conv_dim, K] f32
  Tensor A_log;        // [Hv] f32
  Tensor dt_bias;      // [Hv] f32
  Tensor norm;         // [dv] f32, plain weight
};

struct AttentionWeights {
  Linear q_proj;  // [nh*2*hd, H], per head: query rows then gate rows
  Linear k_proj;  // [kvh*hd, H]
  Linear v_proj;  // [kvh*hd, H]
  Linear o_proj;  // [H, nh*hd]
  Tensor q_norm;  // [hd] f32 (zero-centred)
  Tensor k_norm;  // [hd] f32 (zero-centred)
};

struct MoeWeights {
  Linear router;          // [E, H]
  Linear experts_gate_up; // [E, 2I, H], gate rows first
  Linear experts_down;    // [E, H, I]
  Linear shared_gate_up;  // [2Is, H]: shared_expert.gate_proj rows then up_proj rows
  Linear shared_down;     // [H, Is]
  Linear shared_gate;     // [1, H]
};

struct MlpWeights {
  Linear gate_up;  // [2I, H]: gate_proj rows then up_proj rows
  Linear down;     // [H, I]
};

struct LayerWeights {
  LayerType type = LayerType::kLinearAttention;
  Tensor input_norm;           // [H] f32
  Tensor post_attention_norm;  // [H] f32
  GdnWeights gdn;              // when type == kLinearAttention
  AttentionWeights attn;       // when type == kFullAttention
  MoeWeights moe;              // when config.is_moe
  MlpWeights mlp;              // otherwise
};

// The multi-token-prediction layer (`mtp.*`, model-qwen35.md §2.9): fc over [norm(embedding(next
// token)) ; norm(hidden)], one full-attention decoder layer with its MoE (or MLP), a final norm. It
// shares the text model's embedding and lm_head.
struct MtpWeights {
  bool present = false;
  Linear fc;                     // [H, 2H]: input columns = embedding (first H) then hidden
  Tensor pre_fc_norm_embedding;  // [H] f32 (zero-centred)
  Tensor pre_fc_norm_hidden;     // [H] f32 (zero-centred)
  LayerWeights layer;            // type kFullAttention
  Tensor norm;                   // [H] f32 (zero-centred)
};

// What the loader saw but did not use.
struct LoadReport {
  std::string prefix;        // "model.language_model." or "model."
  bool per_expert_layout = false;
  int visual_tensors = 0;    // model.visual.* left unused (a checkpoint without vision_config)
  int mtp_tensors = 0;       // mtp.* left unused (loaded only for speculative decoding: LoadOptions::load_mtp)
  std::vector<std::string> unexpected;  // anything else the model does not know
  std::vector<std::string> quant_warnings;  // QuantPlan::warnings (overlapping targets, unmatched ignores ...)
  std::vector<std::pair<std::string, uint64_t>> nonfinite;  // float tensors with NaN/Inf values, and how many
  uint64_t bytes_read = 0;          // checkpoint bytes streamed in
  uint64_t peak_staging_bytes = 0;  // the largest host staging buffer held (<= LoadOptions::buffer_bytes)
  // One line each, for stderr.
  std::vector<std::string> notes() const;
};

struct ModelWeights {
  Linear embed;       // [V, H]
  std::vector<LayerWeights> layers;
  Tensor final_norm;  // [H] f32
  Linear lm_head;     // [V, H]; the embedding itself when tie_word_embeddings
  VisionWeights vision;  // vision.present: config.json has a vision tower and the checkpoint its tensors
  MtpWeights mtp;        // mtp.present: loaded on request (LoadOptions::load_mtp)
  LoadReport report;
  std::vector<Buffer> storage;  // owns every tensor above
};

// Loads and validates every tensor the config needs. The quantization config (config.json
// quantization_config / hf_quant_config.json in ckpt.dir()) and plan_module_formats decide each
// module's format; quantized modules stay quantized (NVFP4 / FP8, see Linear in backend/ops.h).
// Errors name the file (or the checkpoint
// folder, for a missing tensor) and the tensor: missing, shape disagreeing with the config
// (expected vs found), or a dtype that is not a float type this backend can use.
// Tensors stream through one bounded host staging buffer (LoadOptions, loader/weight_stream.h):
// host memory above the final weights stays under options.buffer_bytes.
Expected<ModelWeights> load_weights(const Checkpoint& ckpt, const ModelConfig& config, Backend& backend,
                                    const LoadOptions& options = {});

// Bytes of every tensor but (unless with_mtp) the MTP layer and (unless with_vision) the vision
// tower: what a load reads (the progress line's total).
uint64_t text_model_bytes(const Checkpoint& ckpt, bool with_vision = false, bool with_mtp = false);

}  // namespace sparkserve
