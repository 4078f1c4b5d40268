// The tensor-core attention kernels (attention_prefill.cu, attention_decode.cu) as
// CudaBackend::launch_attention (attention.cu) calls them, for bf16 and fp8 KV pools.
#pragma once

#include <type_traits>

#include "backend/cuda/attention_common.cuh"

namespace sparkserve {

// q: [T, nh, hd] f32, gate: [T, nh, hd] f32 or null -> out: [T, nh, hd] f32 (times sigmoid(gate)
// when given). Query head h reads kv head h / group. scale: the softmax scale.
struct AttentionArgs {
  float* out;
  const float* q;
  const float* gate;
  KvView kv;
  DeviceLayout L;
  int nh;
  int group;
  float scale;
};

// Batches whose spans all have at most this many tokens (decode, speculative verify) go to the
// split-K decode kernel; others to the flash prefill kernel.
constexpr int kDecodeMaxTokens = 8;

inline bool tensor_core_head_dim(int64_t hd) { return hd == 32 || hd == 64 || hd == 128 || hd == 256; }

// Calls f(std::integral_constant<int, HD>, std::bool_constant<fp8>) for a tensor-core head dim.
template <class F>
void with_head_dim(int64_t hd, bool fp8, F&& f) {
  auto go = [&](auto h) { fp8 ? f(h, std::true_type{}) : f(h, std::false_type{}); };
  switch (hd) {
    case 32: return go(std::integral_constant<int, 32>{});
    case 64: return go(std::integral_constant<int, 64>{});
    case 128: return go(std::integral_constant<int, 128>{});
    case 256: return go(std::integral_constant<int, 256>{});
    default: CHECK_MSG(false, "CUDA attention: the tensor-core kernels take head_dim 32, 64, 128 or 256");
  }
}

void launch_attention_prefill(CudaBackend& be, const AttentionArgs& a, bool fp8);
// The sm_90a warpgroup-MMA prefill kernel (attention_prefill_wgmma.cu), head_dim 256: available
// when this build has sm_90a code, the device is compute 9.0 and its shared memory suffices.
bool attention_prefill_wgmma_available();
void launch_attention_prefill_wgmma(CudaBackend& be, const AttentionArgs& a, bool fp8);
void launch_attention_decode(CudaBackend& be, const AttentionArgs& a, bool fp8);

}  // namespace sparkserve
