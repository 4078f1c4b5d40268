// The CPU reference backend: plain loops, fp32 arithmetic (bf16 weights are converted inside the
// inner loops and stay bf16 in memory), parallel over output rows / heads / experts with a small
// thread pool. One file per op family: memory.cpp, elementwise.cpp, norm.cpp, linear.cpp,
// attention.cpp, gdn.cpp, moe.cpp.
#pragma once

#include <memory>

#include "backend/ops.h"
#include "core/thread_pool.h"

namespace sparkserve {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads);
  Device device() const override { return Device::kCpu; }
  const char* name() const override { return "cpu"; }
  ThreadPool& pool() { return pool_; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override;
  void free(Tensor& t) override;
  void upload(const Tensor& dst, const void* host_src) override;
  void download(void* host_dst, const Tensor& src) override;
  void fill_zero(const Tensor& t) override;
  void copy_batch(const std::vector<TensorCopy>& copies) override;

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

  void moe_route_topk(const Tensor& weights, const Tensor& ids, const Tensor& router_logits) override;
  void moe_experts(const Tensor& out, const Tensor& x, const Tensor& ids, const Tensor& weights,
                   const Linear& gate_up, const Linear& down) override;

  void layernorm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) override;
  void add_bias(const Tensor& x, const Tensor& b) override;
  void linear_bias(const Tensor& out, const Tensor& x, const Linear& w, const Tensor& b, bool accumulate) override;
  void gelu(const Tensor& out, const Tensor& x, bool tanh_approx) override;
  void embedding_mix(const Tensor& out, const Tensor& ids, const Tensor& weights, const Linear& table) override;
  void rope_axes(const Tensor& x, const Tensor& positions, const Tensor& axis, const Tensor& inv_freq) override;
  void attention_segments(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                          const std::vector<int64_t>& segment_lengths, float scale) override;

 private:
  ThreadPool pool_;
};

std::unique_ptr<Backend> make_cpu_backend(int num_threads);

}  // namespace sparkserve
