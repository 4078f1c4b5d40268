// The format of every module of a checkpoint, decided by the tensors it HOLDS and then checked
// against the quantization config (checkpoint-formats.md §8):
//   1. tensors are grouped by module (name minus .weight, .weight_packed, .weight_scale, ...);
//   2. each module's format is read from its tensors' names, dtypes and shapes (a missing scale, a
//      wrong scale dtype or shape is an error naming the module and the tensor);
//   3. the config's verdict for that module (ignore first, then compressed-tensors target priority
//      exact name > regex > class name; ModelOpt exclude_modules fnmatch) must agree, or it is an
//      error naming the module, what the config says and what the tensors hold.
// Every module is checked (every expert, not expert 0 only). Split GDN projections are read as stored.
//
// How the model gets a module (e.g. for its Linear weights):
//   SS_ASSIGN_OR_RETURN(QuantPlan plan, plan_checkpoint(ckpt, quant_config));
//   const ModuleFormat* m = plan.find("model.language_model.layers.0.mlp.experts.3.up_proj");
//   m->format (WeightFormat), m->activation, m->shape ([N, K] unpacked), m->tensors.weight (TensorInfo*:
//   weight or weight_packed), .weight_scale, .global_scale (CT weight_global_scale or ModelOpt
//   weight_scale_2 — see format to know which direction), .input_scale (CT input_global_scale or
//   ModelOpt/FP8 input_scale), .bias.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/status.h"
#include "loader/quant_config.h"
#include "loader/quant_match.h"
#include "loader/safetensors.h"
#include "loader/weight_format.h"

namespace sparkserve {

struct ModuleTensors {
  const TensorInfo* weight = nullptr;        // .weight, or .weight_packed (CT NVFP4), or a bare parameter
  const TensorInfo* weight_scale = nullptr;  // .weight_scale
  const TensorInfo* global_scale = nullptr;  // .weight_global_scale (CT, divides) / .weight_scale_2 (ModelOpt, multiplies)
  const TensorInfo* input_scale = nullptr;   // .input_global_scale (CT NVFP4) / .input_scale (ModelOpt, FP8 static)
  const TensorInfo* bias = nullptr;
  const TensorInfo* k_scale = nullptr;       // FP8 KV cache scales (ModelOpt stores them on k_proj/v_proj)
  const TensorInfo* v_scale = nullptr;
  const TensorInfo* output_scale = nullptr;
};

struct ModuleFormat {
  std::string name;
  ModuleClass cls = ModuleClass::kOther;
  WeightFormat format = WeightFormat::kBf16;
  ActivationQuant activation = ActivationQuant::kNone;
  std::vector<int64_t> shape;  // logical weight shape: [N, K] unpacked for Linear, [E, N, K] fused experts
  ModuleTensors tensors;
  std::string decided_by;      // which config entry gave the verdict (for inspect / messages)
  uint64_t nbytes = 0;         // all tensors of the module
};

struct QuantPlan {
  std::map<std::string, ModuleFormat> modules;
  // Attention modules that only carry KV-cache scales (compressed-tensors `self_attn.k_scale`).
  std::map<std::string, ModuleTensors> kv_scales;
  std::vector<std::string> warnings;  // aggregated: one line per kind, with a count and an example

  const ModuleFormat* find(const std::string& module) const {
    auto it = modules.find(module);
    return it == modules.end() ? nullptr : &it->second;
  }
};

// Strips a known role suffix: "a.b.weight_packed" -> {"a.b", "weight_packed"}; a name without one
// (A_log, experts.gate_up_proj) is its own module with role "".
std::pair<std::string, std::string> split_module_role(const std::string& tensor_name);

// Decides and checks every module. `tensors` is Checkpoint::tensors() (or a synthetic list for
// `inspect --like`); the pointers in the result point into it. Errors list every inconsistent
// module (up to 20, then a count).
Expected<QuantPlan> plan_module_formats(const std::map<std::string, TensorInfo>& tensors, const QuantConfig& config);

}  // namespace sparkserve
