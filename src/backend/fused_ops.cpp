// The fused-chain ops of backend/ops.h as the compositions they are defined to be. The CPU
// reference backend uses these (so its results are those of the separate ops, bit for bit); a
// device backend overrides them with fewer kernels.
#include "backend/ops.h"

#include <algorithm>
#include <functional>

#include "core/check.h"

namespace sparkserve {

void Backend::gdn_decode_step(const Tensor& out, const Tensor& h, const Tensor& mixed, const Tensor& z,
                              const Linear& in_proj_a, const Linear& in_proj_b, const Tensor& conv_w,
                              const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w, float eps,
                              const Tensor& conv_state_pool, const Tensor& state_pool, const BatchLayout& batch,
                              const GdnDims& dims) {
  const int64_t T = mixed.dim(0), Hv = dims.num_v_heads, dv = dims.v_head_dim;
  for (const SeqSpan& s : batch.seqs) CHECK_MSG(s.num_tokens == 1, "gdn_decode_step takes single-token spans");
  Buffer a(this, DType::kF32, {T, Hv}), b(this, DType::kF32, {T, Hv});
  linear(b, h, in_proj_b);
  linear(a, h, in_proj_a);
  Buffer qkv(this, DType::kF32, {T, dims.conv_dim()});
  gdn_conv(qkv, mixed, conv_w, conv_state_pool, batch);
  Buffer g(this, DType::kF32, {T, Hv}), beta(this, DType::kF32, {T, Hv});
  gdn_gating(g, beta, a, b, A_log, dt_bias);
  Buffer core(this, DType::kF32, {T, Hv, dv});
  gdn_recurrent(core, qkv, g, beta, state_pool, batch, dims);
  gated_rmsnorm(out.view({T * Hv, dv}), core.tensor().view({T * Hv, dv}), z.view({T * Hv, dv}), norm_w, eps);
}

void Backend::gdn_verify_step(const Tensor& out, const Tensor& g, const Tensor& beta, const Tensor& h,
                              const Tensor& mixed, const Tensor& z, const Linear& in_proj_a, const Linear& in_proj_b,
                              const Tensor& conv_w, const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w,
                              float eps, const Tensor& conv_state_pool, const Tensor& state_pool,
                              const BatchLayout& batch, const GdnDims& dims) {
  const int64_t T = mixed.dim(0), Hv = dims.num_v_heads, dv = dims.v_head_dim;
  Buffer a(this, DType::kF32, {T, Hv}), b(this, DType::kF32, {T, Hv});
  linear(b, h, in_proj_b);
  linear(a, h, in_proj_a);
  gdn_gating(g, beta, a, b, A_log, dt_bias);
  Buffer qkv(this, DType::kF32, {T, dims.conv_dim()}), core(this, DType::kF32, {T, Hv, dv});
  gdn_verify(core, qkv, mixed, conv_w, g, beta, conv_state_pool, state_pool, batch, dims);
  gated_rmsnorm(out.view({T * Hv, dv}), core.tensor().view({T * Hv, dv}), z.view({T * Hv, dv}), norm_w, eps);
}

void Backend::attention_prep(const Tensor& q, const Tensor& gate, const Tensor& qg, const Tensor& k,
                             const Tensor& v, const Tensor& q_norm_w, const Tensor& k_norm_w, float eps,
                             const Tensor& positions, int64_t rotary_dim, double theta, const KvPool& pool,
                             const BatchLayout& batch) {
  const int64_t T = q.dim(0), nh = q.dim(1), hd = q.dim(2), kvh = k.dim(1);
  split_query_gate(q, gate, qg);
  rmsnorm(q.view({T * nh, hd}), q.view({T * nh, hd}), q_norm_w, eps);
  rmsnorm(k.view({T * kvh, hd}), k.view({T * kvh, hd}), k_norm_w, eps);
  rope(q, positions, rotary_dim, theta);
  rope(k, positions, rotary_dim, theta);
  kv_cache_write(pool, k, v, batch);
}

void Backend::gated_attention(const Tensor& out, const Tensor& q, const Tensor& gate, const KvPool& pool,
                              const BatchLayout& batch, const AttentionDims& dims) {
  attention(out, q, pool, batch, dims);
  sigmoid_mul(out, gate);
}

void Backend::add_gated_shared_rmsnorm(const Tensor& residual, const Tensor& h, const Tensor& d, const Tensor& y,
                                       const Linear& shared_gate, const Tensor& norm_w, float eps) {
  Buffer logit(this, DType::kF32, {h.dim(0), 1});
  linear(logit, h, shared_gate);
  add_sigmoid_scaled(d, y, logit);
  add_rmsnorm(residual, h, d, norm_w, eps);
}

void Backend::linears(const std::vector<Tensor>& outs, const Tensor& x, const std::vector<const Linear*>& ws) {
  CHECK(outs.size() == ws.size());
  std::vector<std::function<void()>> branches;
  for (size_t i = 0; i < ws.size(); ++i) branches.push_back([&, i] { linear(outs[i], x, *ws[i]); });
  run_branches(branches);
}

void Backend::linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& x, const Linear& w,
                                 const Tensor& norm_w, float eps) {
  Buffer d(this, DType::kF32, {residual.numel() / std::max<int64_t>(norm_w.numel(), 1), norm_w.numel()});
  linear(d, x, w);
  add_rmsnorm(residual, out, d, norm_w, eps);
}

void Backend::gated_rmsnorm_linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& core,
                                                const Tensor& z, const Tensor& gate_norm_w, const Linear& w,
                                                const Tensor& norm_w, float eps) {
  const int64_t K = w.in_features, T = K == 0 ? 0 : core.numel() / K, dv = gate_norm_w.numel();
  CHECK(core.numel() == T * K && z.numel() == T * K && dv > 0 && K % dv == 0);
  Buffer normed(this, DType::kF32, {T, K});
  gated_rmsnorm(normed.tensor().view({T * K / dv, dv}), core.view({T * K / dv, dv}), z.view({T * K / dv, dv}),
                gate_norm_w, eps);
  linear_add_rmsnorm(residual, out, normed, w, norm_w, eps);
}

void Backend::gated_mlp(const Tensor& out, const Tensor& x, const Linear& gate_up, const Linear& down) {
  const int64_t T = x.dim(0), I = down.in_features;
  Buffer gu(this, DType::kF32, {T, 2 * I}), act(this, DType::kF32, {T, I});
  linear(gu, x, gate_up);
  silu_mul(act, gu);
  linear(out, act, down);
}

void Backend::moe_route_experts(const Tensor& out, const Tensor& weights, const Tensor& ids,
                                const Tensor& router_logits, const Tensor& x, const Linear& gate_up,
                                const Linear& down) {
  moe_route_topk(weights, ids, router_logits);
  moe_experts(out, x, ids, weights, gate_up, down);
}

}  // namespace sparkserve
