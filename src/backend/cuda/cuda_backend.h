// The CUDA backend: every op of backend/ops.h as CUDA kernels on one stream, computing the same
// fp32 function as the CPU reference (bf16 weights are widened inside the kernels). One .cu file per
// op family: memory.cu, elementwise.cu, norm.cu, linear.cu, attention.cu, gdn.cu, moe.cu (the matmul
// regimes: gemv_dense.cu / gemv_fp8_t1.cu decode GEMVs, simt_matmul.cu, quant_linear.cu; moe_*.cu).
// Only the .cu files include this header (it needs cuda_runtime.h); the rest of the program reaches
// the backend through make_cuda_backend (backend/backend_factory.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"

namespace sparkserve {

// Aborts with the CUDA error text: a failed CUDA call is a broken invariant here (bad launch,
// device lost, out of memory), not user input.
void cuda_check(cudaError_t e, const char* expr, const char* file, int line);
#define CUDA_CHECK(x) ::sparkserve::cuda_check((x), #x, __FILE__, __LINE__)
// After every launch: catches bad launch configurations at the op that made them.
#define CUDA_CHECK_LAUNCH() ::sparkserve::cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

// A BatchLayout copied to the device, one int32 array:
//   [0, S)            row_begin        [S, 2S)  num_tokens     [2S, 3S) start_pos
//   [3S, 4S)          gdn_slot         [4S, 5S) block-table offset into `tables`  [5S, 6S) num_blocks
//   [6S, 6S + R)      row -> span index (-1 for rows of no span), R = total_rows
//   [6S + R, ...)     the block tables, concatenated
struct DeviceLayout {
  const int32_t* base = nullptr;
  int32_t num_seqs = 0;
  int32_t total_rows = 0;
  int32_t max_tokens = 0;   // longest span (host-side, for grid sizes)
  int32_t max_len = 0;      // longest start_pos + num_tokens
  __host__ __device__ int32_t row_begin(int s) const { return base[s]; }
  __host__ __device__ int32_t num_tokens(int s) const { return base[num_seqs + s]; }
  __host__ __device__ int32_t start_pos(int s) const { return base[2 * num_seqs + s]; }
  __host__ __device__ int32_t gdn_slot(int s) const { return base[3 * num_seqs + s]; }
  __host__ __device__ const int32_t* table(int s) const {
    return base + 6 * num_seqs + total_rows + base[4 * num_seqs + s];
  }
  __host__ __device__ int32_t num_blocks(int s) const { return base[5 * num_seqs + s]; }
  __host__ __device__ int32_t span_of_row(int r) const { return base[6 * num_seqs + r]; }
  // GDN state saves (SeqSpan::saves): span s has num_saves(s) of them, save(s, i) = {tokens, row}
  // in ascending order. saves_at: where their words start in base (-1: no span saves).
  int32_t saves_at = -1;
  __host__ __device__ int32_t num_saves(int s) const {
    return saves_at < 0 ? 0 : base[saves_at + s + 1] - base[saves_at + s];
  }
  __host__ __device__ int2 save(int s, int i) const {
    const int32_t* p = base + saves_at + num_seqs + 1 + 2 * (base[saves_at + s] + i);
    return make_int2(p[0], p[1]);
  }
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;
  Device device() const override { return Device::kCuda; }
  const char* name() const override { return "cuda"; }
  cudaStream_t stream() const { return stream_; }
  int sm_count() const { return sm_count_; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
  void free(Tensor& t) override;
  void upload(const Tensor& dst, const void* host_src) override;
  void download(void* host_dst, const Tensor& src) override;
  void fill_zero(const Tensor& t) override;
  void copy_batch(const std::vector<TensorCopy>& copies) override;
  void synchronize() override;
  void* alloc_host_staging(size_t bytes) override;
  void free_host_staging(void* p) override;

  void embedding(const Tensor& out, const Tensor& ids, const Linear& table) override;
  void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& w, float eps) override;
  void add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& delta, const Tensor& w,
                   float eps) override;
  void linear(const Tensor& out, const Tensor& x, const Linear& w) override;
  void silu_mul(const Tensor& out, const Tensor& gate_up) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void sigmoid_mul(const Tensor& x, const Tensor& gate) override;
  void add_sigmoid_scaled(const Tensor& out, const Tensor& y, const Tensor& gate_logit) override;
  void gather_rows(const Tensor& out, const Tensor& x, const std::vector<int64_t>& rows) override;
  void gather_rows_at(const Tensor& out, const Tensor& x, const Tensor& rows) override;
  // Vision tower (vision_ops.cu).
  void layernorm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) override;
  void add_bias(const Tensor& x, const Tensor& b) override;
  void linear_bias(const Tensor& out, const Tensor& x, const Linear& w, const Tensor& b, bool accumulate) override;
  void gelu(const Tensor& out, const Tensor& x, bool tanh_approx) override;
  void embedding_mix(const Tensor& out, const Tensor& ids, const Tensor& weights, const Linear& table) override;
  void rope_axes(const Tensor& x, const Tensor& positions, const Tensor& axis, const Tensor& inv_freq) override;
  void attention_segments(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const std::vector<int64_t>& segment_lengths, float scale) override;
  std::vector<RowArgmax> argmax(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded) override;
  std::vector<RowArgmax> draw(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded,
                              const std::vector<RowDraw>& rows) override;

  void split_query_gate(const Tensor& q, const Tensor& gate, const Tensor& qg) override;
  void rope(const Tensor& x, const Tensor& positions, int64_t rotary_dim, double theta) override;
  void kv_cache_write(const KvPool& pool, const Tensor& k, const Tensor& v, const BatchLayout& batch) override;
  void attention(const Tensor& out, const Tensor& q, const KvPool& pool, const BatchLayout& batch,
                 const AttentionDims& dims) override;

  void gdn_conv(const Tensor& out, const Tensor& mixed, const Tensor& weight,
                const Tensor& conv_state_pool, const BatchLayout& batch) override;
  void gdn_gating(const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                  const Tensor& A_log, const Tensor& dt_bias) override;
  void gdn_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                     const Tensor& state_pool, const BatchLayout& batch, const GdnDims& dims) override;
  void gdn_verify(const Tensor& out, const Tensor& qkv, const Tensor& mixed, const Tensor& conv_w, const Tensor& g,
                  const Tensor& beta, const Tensor& conv_state_pool, const Tensor& state_pool,
                  const BatchLayout& batch, const GdnDims& dims) override;
  void gdn_chunked(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                   const Tensor& state_pool, const BatchLayout& batch, const GdnDims& dims) override;
  void gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w,
                     float eps) override;

  // Fused chains: gdn.cu (conv kernel + one a/b-projection/gating/delta/gated-norm kernel, decode and
  // verify), attention.cu (prep in one kernel; attention with its output gate), norm.cu (shared-expert
  // gated add + residual + norm).
  void gdn_decode_step(const Tensor& out, const Tensor& h, const Tensor& mixed, const Tensor& z,
                       const Linear& in_proj_a, const Linear& in_proj_b, const Tensor& conv_w, const Tensor& A_log,
                       const Tensor& dt_bias, const Tensor& norm_w, float eps, const Tensor& conv_state_pool,
                       const Tensor& state_pool, const BatchLayout& batch, const GdnDims& dims) override;
  void gdn_verify_step(const Tensor& out, const Tensor& g, const Tensor& beta, const Tensor& h, const Tensor& mixed,
                       const Tensor& z, const Linear& in_proj_a, const Linear& in_proj_b, const Tensor& conv_w,
                       const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w, float eps,
                       const Tensor& conv_state_pool, const Tensor& state_pool, const BatchLayout& batch,
                       const GdnDims& dims) override;
  void attention_prep(const Tensor& q, const Tensor& gate, const Tensor& qg, const Tensor& k, const Tensor& v,
                      const Tensor& q_norm_w, const Tensor& k_norm_w, float eps, const Tensor& positions,
                      int64_t rotary_dim, double theta, const KvPool& pool, const BatchLayout& batch) override;
  void gated_attention(const Tensor& out, const Tensor& q, const Tensor& gate, const KvPool& pool,
                       const BatchLayout& batch, const AttentionDims& dims) override;
  void add_gated_shared_rmsnorm(const Tensor& residual, const Tensor& h, const Tensor& d, const Tensor& y,
                                const Linear& shared_gate, const Tensor& norm_w, float eps) override;
  // Dense projections (linear_fused.cu): shared activation codes, split-K sums added by the consumer.
  void linears(const std::vector<Tensor>& outs, const Tensor& x, const std::vector<const Linear*>& ws) override;
  void linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& x, const Linear& w,
                          const Tensor& norm_w, float eps) override;
  void gated_mlp(const Tensor& out, const Tensor& x, const Linear& gate_up, const Linear& down) override;
  void gated_rmsnorm_linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& core, const Tensor& z,
                                        const Tensor& gate_norm_w, const Linear& w, const Tensor& norm_w,
                                        float eps) override;

  void moe_route_topk(const Tensor& weights, const Tensor& ids, const Tensor& router_logits) override;
  // W4A4 NVFP4 experts: the routing fused into the experts' first launch (moe_w4a4.cu).
  void moe_route_experts(const Tensor& out, const Tensor& weights, const Tensor& ids, const Tensor& router_logits,
                         const Tensor& x, const Linear& gate_up, const Linear& down) override;
  void moe_experts(const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const Linear& gate_up, const Linear& down) override;

  // Branches on side streams (branches.cu).
  void run_branches(const std::vector<std::function<void()>>& branches) override;
  void set_concurrent_branches(bool on) override { branches_concurrent_ = on; }

  // CUDA graphs (graph.cu): stream capture of the ops, and layouts at a fixed device address.
  bool can_record() const override { return true; }
  std::unique_ptr<Recording> record(const std::function<void()>& body) override;
  int64_t layout_words(int64_t spans, int64_t rows, int64_t max_blocks) const override;
  void pack_layout(const BatchLayout& batch, int64_t max_blocks, int32_t* words) const override;
  void set_fixed_layout(const Tensor& words, const BatchLayout& batch, int64_t max_blocks, int64_t max_len) override;
  void clear_fixed_layout() override { fixed_layouts_.clear(); }

  // The layout on the device. Uploads happen only when the layout differs from every cached one, so
  // a forward pass uploads each of its (at most three) layouts once, whatever the layer count.
  // While fixed layouts are set (set_fixed_layout), a batch equal to one of them gets it with no upload.
  DeviceLayout device_layout(const BatchLayout& batch);
  // Stream-ordered scratch, freed in stream order (cudaFreeAsync) when the owner goes away.
  struct Scratch {
    CudaBackend* owner = nullptr;
    void* ptr = nullptr;
    Scratch() = default;
    Scratch(CudaBackend* o, size_t bytes);
    Scratch(Scratch&& s) noexcept : owner(s.owner), ptr(s.ptr) { s.ptr = nullptr; }
    Scratch& operator=(Scratch&&) = delete;
    ~Scratch();
    template <class T> T* as() const { return static_cast<T*>(ptr); }
  };
  // Quantized (NVFP4 / FP8) out[r, n] = x[r / x_div] . W_e[n], e = ids[r] (expert 0 when ids is null);
  // quant_linear.cu. x: [*, K] f32 (device), ids: [R] i32 (device) -> out: [R, N] f32.
  void quant_matmul(float* out, const float* x, int64_t R, int64_t x_div, const int32_t* ids, const Linear& w);
  // attention / gated_attention (attention.cu); gate: [T, nh, hd] device or null.
  void launch_attention(const Tensor& out, const Tensor& q, const float* gate, const KvPool& pool,
                        const BatchLayout& batch, const AttentionDims& d);
  // Copies a small host array to fresh device scratch (stream-ordered).
  Scratch upload_scratch(const void* host, size_t bytes);
  // inv_freq of rotate-half RoPE computed on the host exactly as the CPU backend does, cached.
  const float* rope_inv_freq(int64_t rotary_dim, double theta);

 private:
  int device_ = 0;
  int sm_count_ = 0;
  // The stream ops are issued to: main_stream_, or inside run_branches a branch's side stream.
  cudaStream_t stream_ = nullptr;
  cudaStream_t main_stream_ = nullptr;
  struct SideStream {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;  // recorded at the branch's end; the forking stream waits on it
  };
  std::vector<SideStream> side_;
  cudaEvent_t fork_ = nullptr;
  bool branches_concurrent_ = true;
  bool in_branches_ = false;
  struct CachedLayout {
    std::vector<int32_t> host;
    int32_t* dev = nullptr;
    DeviceLayout layout;
    uint64_t last_use = 0;
  };
  std::vector<CachedLayout> layouts_;
  struct FixedLayout {
    std::vector<int32_t> words;  // the batch it was set for, packed with max_blocks (what a match compares)
    int64_t max_blocks = 0;
    DeviceLayout layout;
  };
  std::vector<FixedLayout> fixed_layouts_;
  bool capturing_ = false;  // inside record(): device_layout must not upload
  uint64_t use_clock_ = 0;
  std::map<std::pair<int64_t, double>, float*> inv_freq_;
};

// Make a CUDA backend on device 0, or say why not (no device, driver too old).
Expected<std::unique_ptr<Backend>> make_cuda_backend_on(int device);

// ---- launch helpers shared by the op files --------------------------------------------------
inline unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

__device__ __forceinline__ float bf16_bits_to_f32(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }
// Element i of a weight payload (f32 or bf16) widened to f32.
__device__ __forceinline__ float load_weight(const void* w, bool bf16, int64_t i) {
  return bf16 ? bf16_bits_to_f32(static_cast<const uint16_t*>(w)[i]) : static_cast<const float*>(w)[i];
}
__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Eight consecutive weight elements from element i (16-byte aligned for bf16, 32 for f32), widened.
template <bool kBf16>
__device__ __forceinline__ void load8(const void* w, int64_t i, float (&v)[8]) {
  if constexpr (kBf16) {
    const uint4 u = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w) + i);
    const uint32_t p[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      v[2 * j] = __uint_as_float(p[j] << 16);
      v[2 * j + 1] = __uint_as_float(p[j] & 0xffff0000u);
    }
  } else {
    const float4 a = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + i);
    const float4 b = *reinterpret_cast<const float4*>(static_cast<const float*>(w) + i + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w; v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
  }
}

// Weight formats this backend reads; anything else is a broken invariant (the loader refuses it).
bool weight_is_bf16(const Linear& w);

}  // namespace sparkserve
