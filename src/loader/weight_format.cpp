#include "loader/weight_format.h"

namespace sparkserve {

std::string_view weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBf16: return "bf16";
    case WeightFormat::kF16: return "f16";
    case WeightFormat::kF32: return "f32";
    case WeightFormat::kNvfp4: return "nvfp4";
    case WeightFormat::kNvfp4ModelOpt: return "nvfp4-modelopt";
    case WeightFormat::kFp8Channel: return "fp8-channel";
    case WeightFormat::kFp8Tensor: return "fp8-tensor";
  }
  return "?";
}

bool is_nvfp4(WeightFormat f) { return f == WeightFormat::kNvfp4 || f == WeightFormat::kNvfp4ModelOpt; }
bool is_fp8(WeightFormat f) { return f == WeightFormat::kFp8Channel || f == WeightFormat::kFp8Tensor; }
bool is_quantized(WeightFormat f) { return is_nvfp4(f) || is_fp8(f); }

std::string_view activation_quant_name(ActivationQuant a) {
  switch (a) {
    case ActivationQuant::kNone: return "none";
    case ActivationQuant::kNvfp4: return "nvfp4";
    case ActivationQuant::kFp8TokenDynamic: return "fp8-token-dynamic";
    case ActivationQuant::kFp8TensorStatic: return "fp8-tensor-static";
  }
  return "?";
}

}  // namespace sparkserve
