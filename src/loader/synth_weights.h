// `sparkserve bench --synth`: the weights of a SynthPlan (loader/synth_checkpoint.h) built directly
// in backend memory, with the random values generated where they live (backend/synth_fill.h), so the
// 122B shapes run on a GPU machine whose disk could not hold the checkpoint.
//
// The result is what load_weights (loader/weights.h) returns for the same plan written by
// `sparkserve synth` with the same seed: the same Linear structs (format, activation, shapes,
// partitions, scale tensors) and the same bytes in every tensor (tests/unit/synth checks this field by
// field and byte by byte for every layout). Module formats come from the same code path as the loader:
// plan_module_formats over the plan's tensor list and quantization config.
#pragma once

#include <cstdint>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/synth_checkpoint.h"
#include "loader/weights.h"

namespace sparkserve {

struct SynthModel {
  ModelConfig config;
  ModelWeights weights;
  double token_bytes = 0;  // weight bytes one decoded token reads at batch 1 (loader/weight_budget.h rule)
  uint64_t total_bytes = 0;  // every tensor of the plan, vision and MTP included (as `synth` would write)
  uint64_t loaded_bytes = 0;  // bytes allocated for the text model's weights
};

// `seed` as `sparkserve synth --seed`; with_mtp builds the MTP layer too (as LoadOptions::load_mtp).
// Errors: the plan's config or quantization config do not parse, or a module's format is not one the
// loader accepts.
Expected<SynthModel> build_synth_model(const SynthPlan& plan, Backend& backend, uint64_t seed = 0,
                                       bool with_mtp = false);

// Every Linear of the text model in model order, named ("layers.3.moe.experts_down", "lm_head").
std::vector<std::pair<std::string, const Linear*>> model_linears(const ModelWeights& w);
// The text model's tensors in model order, for comparisons (tests, `bench --weights-digest`).
std::vector<std::pair<std::string, Tensor>> model_weight_tensors(const ModelWeights& w);
// FNV-1a over the bytes of every tensor of model_weight_tensors (downloaded from the backend),
// with names, dtypes and shapes, as 16 hex digits.
std::string weights_digest(const ModelWeights& w, Backend& backend);

}  // namespace sparkserve
