// How one module's weight is stored in a checkpoint (decided from the tensors it holds, checked
// against the quantization config by quant_scheme.h).
#pragma once

#include <cstdint>
#include <string_view>

namespace sparkserve {

enum class WeightFormat : uint8_t {
  kBf16,
  kF16,
  kF32,
  kNvfp4,          // compressed-tensors: weight_packed U8 [N,K/2], weight_scale F8 [N,K/16], weight_global_scale F32 (divides)
  kNvfp4ModelOpt,  // ModelOpt: weight U8 [N,K/2], weight_scale F8 [N,K/16], weight_scale_2 F32 (multiplies)
  kFp8Channel,     // weight F8_E4M3 [N,K], weight_scale [N,1] (dequant multiplier per output row)
  kFp8Tensor,      // weight F8_E4M3 [N,K], weight_scale [1] or scalar
};

// "bf16", "f16", "f32", "nvfp4", "nvfp4-modelopt", "fp8-channel", "fp8-tensor".
std::string_view weight_format_name(WeightFormat f);
bool is_quantized(WeightFormat f);
bool is_nvfp4(WeightFormat f);
bool is_fp8(WeightFormat f);

// How activations entering a quantized Linear are quantized at run time.
enum class ActivationQuant : uint8_t {
  kNone,            // activations stay in the compute dtype (BF16 modules, W4A16, W8A16)
  kNvfp4,           // per 16 values, E4M3 block scale computed at run time, static global scale
  kFp8TokenDynamic, // per token: s = max(amax/448, 1/(448*512))
  kFp8TensorStatic, // one calibrated input_scale per tensor
};
std::string_view activation_quant_name(ActivationQuant a);

}  // namespace sparkserve
