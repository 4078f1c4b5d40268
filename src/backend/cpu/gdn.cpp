// Gated DeltaNet (model-qwen35.md §2.4): causal conv with state, gating, and the delta rule in its
// recurrent (decode) and chunked (prefill, HF torch_chunk_gated_delta_rule) forms.
#include <algorithm>
#include <cmath>
#include <map>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"

namespace sparkserve {

void CpuBackend::gdn_conv(const Tensor& out, const Tensor& mixed, const Tensor& weight,
                          const Tensor& conv_state_pool, const BatchLayout& batch) {
  const int64_t C = weight.dim(0), K = weight.dim(1), S = K - 1;
  CHECK(mixed.numel() == batch.total_rows * C && out.numel() == mixed.numel());
  CHECK(conv_state_pool.dim(1) == C && conv_state_pool.dim(2) == S);
  for (const SeqSpan& sp : batch.seqs) CHECK(gdn_rows_ok(sp, conv_state_pool.dim(0)));
  const float* x = mixed.ptr<const float>();
  const float* w = weight.ptr<const float>();
  float* o = out.ptr<float>();
  pool_.parallel_for(C, [&](int64_t cb, int64_t ce) {
    std::vector<float> window;
    for (const SeqSpan& sp : batch.seqs) {
      for (int64_t c = cb; c < ce; ++c) {
        float* state = conv_state_pool.ptr<float>() + (sp.gdn_slot * C + c) * S;
        // window = the K-1 previous inputs followed by this span's inputs on channel c.
        window.assign(state, state + S);
        for (int64_t t = 0; t < sp.num_tokens; ++t) window.push_back(x[(sp.row_begin + t) * C + c]);
        for (int64_t t = 0; t < sp.num_tokens; ++t) {
          float acc = 0;
          for (int64_t j = 0; j < K; ++j) acc += w[c * K + j] * window[static_cast<size_t>(t + j)];
          o[(sp.row_begin + t) * C + c] = cpu::silu(acc);
        }
        // The state after t tokens: window[t, t + K-1).
        for (const GdnStateSave& v : std::span(sp.saves, static_cast<size_t>(sp.num_saves)))
          std::copy_n(window.begin() + v.tokens, S, conv_state_pool.ptr<float>() + (v.row * C + c) * S);
        std::copy(window.end() - S, window.end(), state);
      }
    }
  }, cpu::min_chunk_for(batch.total_rows * K));
}

void CpuBackend::gdn_gating(const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                            const Tensor& A_log, const Tensor& dt_bias) {
  const int64_t Hv = A_log.numel(), T = a.numel() / Hv;
  CHECK(b.numel() == a.numel() && g.numel() == a.numel() && beta.numel() == a.numel());
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < Hv; ++h) {
      const int64_t i = t * Hv + h;
      float x = a.ptr<const float>()[i] + dt_bias.ptr<const float>()[h];
      // torch softplus (beta 1, threshold 20): linear above the threshold.
      float softplus = x > 20.0f ? x : std::log1p(std::exp(x));
      g.ptr<float>()[i] = -std::exp(A_log.ptr<const float>()[h]) * softplus;
      beta.ptr<float>()[i] = cpu::sigmoid(b.ptr<const float>()[i]);
    }
  }
}

namespace {

// L2 normalisation as HF's l2norm: x * rsqrt(sum(x^2) + 1e-6).
void l2norm_scaled(float* dst, const float* src, int64_t n, float scale) {
  float ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += src[i] * src[i];
  const float r = 1.0f / std::sqrt(ss + 1e-6f) * scale;
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * r;
}

// Per (span, value head) views into the conv output row t: q | k | v.
struct HeadIo {
  const float* qkv;
  int64_t conv_dim, kh, h;
  const GdnDims* d;
  const float* q(int64_t row) const { return qkv + row * conv_dim + kh * d->k_head_dim; }
  const float* k(int64_t row) const { return qkv + row * conv_dim + d->key_dim() + kh * d->k_head_dim; }
  const float* v(int64_t row) const { return qkv + row * conv_dim + 2 * d->key_dim() + h * d->v_head_dim; }
};

struct Work { const SeqSpan* span; int64_t h; };

std::vector<Work> span_heads(const BatchLayout& batch, int64_t Hv) {
  std::vector<Work> w;
  for (const SeqSpan& s : batch.seqs)
    for (int64_t h = 0; h < Hv; ++h) w.push_back({&s, h});
  return w;
}

// A bf16 recurrent-state pool seen by the f32 delta rule (ops.h, "The recurrent state pool"): the
// rows the batch reads or writes (every span's slot and save rows, each pool row once) widened into
// an f32 pool, and the batch renumbered onto it; store() rounds them back to nearest even. So a bf16
// op is the f32 op from the widened state, its state writes rounded once, bit for bit.
class WidenedState {
 public:
  WidenedState(const Tensor& pool, const BatchLayout& batch) : pool_(pool), batch_(batch) {
    const int64_t row_n = pool.numel() / pool.dim(0);
    std::map<int32_t, int32_t> index;  // pool row -> widened row
    auto widened = [&](int32_t row) {
      auto [it, fresh] = index.emplace(row, static_cast<int32_t>(rows_.size()));
      if (fresh) rows_.push_back(row);
      return it->second;
    };
    saves_.resize(batch.seqs.size());
    for (size_t i = 0; i < batch.seqs.size(); ++i) {
      SeqSpan& s = batch_.seqs[i];
      s.gdn_slot = widened(s.gdn_slot);
      for (int64_t j = 0; j < s.num_saves; ++j) saves_[i].push_back({s.saves[j].tokens, widened(s.saves[j].row)});
      s.saves = saves_[i].data();
    }
    data_.resize(rows_.size() * static_cast<size_t>(row_n));
    const uint16_t* src = pool.ptr<const uint16_t>();
    for (size_t r = 0; r < rows_.size(); ++r)
      for (int64_t i = 0; i < row_n; ++i) data_[r * row_n + i] = bf16_to_f32(src[rows_[r] * row_n + i]);
    std::vector<int64_t> shape = pool.shape;
    shape[0] = static_cast<int64_t>(rows_.size());
    f32_ = Tensor(data_.data(), DType::kF32, std::move(shape), Device::kCpu);
  }
  const Tensor& pool() const { return f32_; }
  const BatchLayout& batch() const { return batch_; }
  void store() const {
    const int64_t row_n = pool_.numel() / pool_.dim(0);
    uint16_t* dst = pool_.ptr<uint16_t>();
    for (size_t r = 0; r < rows_.size(); ++r)
      for (int64_t i = 0; i < row_n; ++i) dst[rows_[r] * row_n + i] = f32_to_bf16(data_[r * row_n + i]);
  }

 private:
  Tensor pool_;
  BatchLayout batch_;
  std::vector<std::vector<GdnStateSave>> saves_;
  std::vector<int32_t> rows_;
  std::vector<float> data_;
  Tensor f32_;
};

void check_state_pool(const Tensor& pool, const BatchLayout& batch) {
  CHECK_MSG(pool.dtype == DType::kF32 || pool.dtype == DType::kBF16, "a GDN recurrent state pool is f32 or bf16");
  for (const SeqSpan& sp : batch.seqs) CHECK(gdn_rows_ok(sp, pool.dim(0)));
}

}  // namespace

void CpuBackend::gdn_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& g,
                               const Tensor& beta, const Tensor& state_pool, const BatchLayout& batch,
                               const GdnDims& d) {
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, r = Hv / d.num_k_heads;
  CHECK(qkv.dim(1) == d.conv_dim() && state_pool.dim(1) == Hv && state_pool.dim(2) == dk &&
        state_pool.dim(3) == dv);
  check_state_pool(state_pool, batch);
  if (state_pool.dtype == DType::kBF16) {
    const WidenedState w(state_pool, batch);
    gdn_recurrent(out, qkv, g, beta, w.pool(), w.batch(), d);
    w.store();
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  auto work = span_heads(batch, Hv);
  pool_.parallel_for(static_cast<int64_t>(work.size()), [&](int64_t b, int64_t e) {
    std::vector<float> q(static_cast<size_t>(dk)), k(static_cast<size_t>(dk)), kv(static_cast<size_t>(dv));
    for (int64_t wi = b; wi < e; ++wi) {
      const SeqSpan& s = *work[static_cast<size_t>(wi)].span;
      const int64_t h = work[static_cast<size_t>(wi)].h;
      HeadIo io{qkv.ptr<const float>(), d.conv_dim(), h / r, h, &d};
      float* S = state_pool.ptr<float>() + (s.gdn_slot * Hv + h) * dk * dv;  // [dk, dv]
      const GdnStateSave *save = s.saves, *saves_end = s.saves + s.num_saves;
      for (int64_t t = 0; t < s.num_tokens; ++t) {
        const int64_t row = s.row_begin + t;
        l2norm_scaled(q.data(), io.q(row), dk, scale);
        l2norm_scaled(k.data(), io.k(row), dk, 1.0f);
        const float* v = io.v(row);
        const float decay = std::exp(g.ptr<const float>()[row * Hv + h]);
        const float bt = beta.ptr<const float>()[row * Hv + h];
        for (int64_t i = 0; i < dk * dv; ++i) S[i] *= decay;  // decay first
        std::fill(kv.begin(), kv.end(), 0.0f);
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) kv[static_cast<size_t>(j)] += S[i * dv + j] * k[static_cast<size_t>(i)];
        for (int64_t j = 0; j < dv; ++j) kv[static_cast<size_t>(j)] = (v[j] - kv[static_cast<size_t>(j)]) * bt;  // delta
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) S[i * dv + j] += k[static_cast<size_t>(i)] * kv[static_cast<size_t>(j)];
        float* o = out.ptr<float>() + (row * Hv + h) * dv;
        for (int64_t j = 0; j < dv; ++j) o[j] = 0;
        for (int64_t i = 0; i < dk; ++i)
          for (int64_t j = 0; j < dv; ++j) o[j] += S[i * dv + j] * q[static_cast<size_t>(i)];
        for (; save != saves_end && save->tokens == t + 1; ++save)
          std::copy_n(S, dk * dv, state_pool.ptr<float>() + (save->row * Hv + h) * dk * dv);
      }
    }
  }, cpu::min_chunk_for(4 * dk * dv));  // per decode token
}

void CpuBackend::gdn_verify(const Tensor& out, const Tensor& qkv, const Tensor& mixed, const Tensor& conv_w,
                            const Tensor& g, const Tensor& beta, const Tensor& conv_state_pool,
                            const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  // Copies of the spans' state rows (copy i = span i; a bf16 recurrent state widened to f32), run
  // through the decode form: the pools keep the state before the spans.
  const auto n = static_cast<int64_t>(batch.seqs.size());
  CHECK_MSG(state_pool.dtype == DType::kF32 || state_pool.dtype == DType::kBF16,
            "a GDN recurrent state pool is f32 or bf16");
  for (const SeqSpan& s : batch.seqs) CHECK_MSG(s.num_saves == 0, "gdn_verify spans save no state");
  const int64_t conv_row = conv_state_pool.numel() / conv_state_pool.dim(0);
  const int64_t rec_row = state_pool.numel() / state_pool.dim(0);
  std::vector<float> conv_copy(static_cast<size_t>(n * conv_row)), rec_copy(static_cast<size_t>(n * rec_row));
  BatchLayout copies = batch;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = batch.seqs[static_cast<size_t>(i)].gdn_slot;
    CHECK(slot >= 0 && slot < conv_state_pool.dim(0) && slot < state_pool.dim(0));
    std::copy_n(conv_state_pool.ptr<const float>() + slot * conv_row, conv_row, conv_copy.data() + i * conv_row);
    if (state_pool.dtype == DType::kBF16) {
      const uint16_t* src = state_pool.ptr<const uint16_t>() + slot * rec_row;
      std::transform(src, src + rec_row, rec_copy.data() + i * rec_row, bf16_to_f32);
    } else {
      std::copy_n(state_pool.ptr<const float>() + slot * rec_row, rec_row, rec_copy.data() + i * rec_row);
    }
    copies.seqs[static_cast<size_t>(i)].gdn_slot = static_cast<int32_t>(i);
  }
  const Tensor conv_t(conv_copy.data(), DType::kF32, {n, conv_state_pool.dim(1), conv_state_pool.dim(2)}, Device::kCpu);
  const Tensor rec_t(rec_copy.data(), DType::kF32,
                     {n, state_pool.dim(1), state_pool.dim(2), state_pool.dim(3)}, Device::kCpu);
  gdn_conv(qkv, mixed, conv_w, conv_t, copies);
  gdn_recurrent(out, qkv, g, beta, rec_t, copies, d);
}

void CpuBackend::gdn_chunked(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                             const Tensor& state_pool, const BatchLayout& batch, const GdnDims& d) {
  constexpr int64_t C = 64;
  const int64_t Hv = d.num_v_heads, dk = d.k_head_dim, dv = d.v_head_dim, r = Hv / d.num_k_heads;
  CHECK(qkv.dim(1) == d.conv_dim() && state_pool.dim(1) == Hv && state_pool.dim(2) == dk &&
        state_pool.dim(3) == dv);
  check_state_pool(state_pool, batch);
  if (state_pool.dtype == DType::kBF16) {
    const WidenedState w(state_pool, batch);
    gdn_chunked(out, qkv, g, beta, w.pool(), w.batch(), d);
    w.store();
    return;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(dk));
  auto work = span_heads(batch, Hv);
  pool_.parallel_for(static_cast<int64_t>(work.size()), [&](int64_t b, int64_t e) {
    // Per-chunk scratch (row-major): Q, K, Kb = beta K, Vb = beta V; A = the (I+L)^-1 factor.
    std::vector<float> Q(C * dk), Kc(C * dk), Kb(C * dk), Vb(C * dv), gc(C), A(C * C), U(C * dv),
        W(C * dk), Vn(C * dv), row(C);
    for (int64_t wi = b; wi < e; ++wi) {
      const SeqSpan& s = *work[static_cast<size_t>(wi)].span;
      const int64_t h = work[static_cast<size_t>(wi)].h;
      HeadIo io{qkv.ptr<const float>(), d.conv_dim(), h / r, h, &d};
      float* S = state_pool.ptr<float>() + (s.gdn_slot * Hv + h) * dk * dv;  // [dk, dv]
      const GdnStateSave *save = s.saves, *saves_end = s.saves + s.num_saves;
      for (int64_t c0 = 0; c0 < s.num_tokens; c0 += C) {
        const int64_t n = std::min(C, s.num_tokens - c0);
        // Load the chunk; rows past n are the zero padding of the HF form (g = 0, beta = 0).
        std::fill(Q.begin(), Q.end(), 0.0f);
        std::fill(Kc.begin(), Kc.end(), 0.0f);
        std::fill(Kb.begin(), Kb.end(), 0.0f);
        std::fill(Vb.begin(), Vb.end(), 0.0f);
        float cum = 0;
        for (int64_t i = 0; i < C; ++i) {
          if (i < n) {
            const int64_t rw = s.row_begin + c0 + i;
            const float bt = beta.ptr<const float>()[rw * Hv + h];
            l2norm_scaled(&Q[i * dk], io.q(rw), dk, scale);
            l2norm_scaled(&Kc[i * dk], io.k(rw), dk, 1.0f);
            for (int64_t x = 0; x < dk; ++x) Kb[i * dk + x] = Kc[i * dk + x] * bt;
            for (int64_t x = 0; x < dv; ++x) Vb[i * dv + x] = io.v(rw)[x] * bt;
            cum += g.ptr<const float>()[rw * Hv + h];
          }
          gc[i] = cum;  // within-chunk cumulative log decay
        }
        auto decay = [&](int64_t i, int64_t j) { return j <= i ? std::exp(gc[i] - gc[j]) : 0.0f; };
        // A = -(Kb K^T ⊙ decay), strictly lower; then the forward-substitution loop of HF turns
        // it into (I + L)^-1 - I row by row; finally add I.
        for (int64_t i = 0; i < C; ++i)
          for (int64_t j = 0; j < C; ++j)
            A[i * C + j] = j < i ? -cpu::dot(&Kb[i * dk], &Kc[j * dk], dk) * decay(i, j) : 0.0f;
        for (int64_t i = 1; i < C; ++i) {
          for (int64_t j = 0; j < i; ++j) row[j] = A[i * C + j];
          for (int64_t j = 0; j < i; ++j) {
            float acc = row[j];
            for (int64_t m = 0; m < i; ++m) acc += row[m] * A[m * C + j];
            A[i * C + j] = acc;
          }
        }
        for (int64_t i = 0; i < C; ++i) A[i * C + i] += 1.0f;
        // U = A Vb ("new values"), W = A (Kb ⊙ exp(gc)) (k_cumdecay).
        for (int64_t i = 0; i < C; ++i) {
          for (int64_t x = 0; x < dv; ++x) U[i * dv + x] = 0;
          for (int64_t x = 0; x < dk; ++x) W[i * dk + x] = 0;
          for (int64_t j = 0; j <= i; ++j) {
            const float a = A[i * C + j], ea = a * std::exp(gc[j]);
            for (int64_t x = 0; x < dv; ++x) U[i * dv + x] += a * Vb[j * dv + x];
            for (int64_t x = 0; x < dk; ++x) W[i * dk + x] += ea * Kb[j * dk + x];
          }
        }
        // V' = U - W S_prev (row i of W S as a sum of rows of S: contiguous, vectorisable).
        for (int64_t i = 0; i < C; ++i) {
          float* vn = &Vn[i * dv];
          for (int64_t x = 0; x < dv; ++x) vn[x] = 0;
          for (int64_t y = 0; y < dk; ++y) {
            const float wy = W[i * dk + y];
            for (int64_t x = 0; x < dv; ++x) vn[x] += wy * S[y * dv + x];
          }
          for (int64_t x = 0; x < dv; ++x) vn[x] = U[i * dv + x] - vn[x];
        }
        // O = (Q ⊙ e^gc) S_prev + ((Q K^T) ⊙ decay) V'.
        for (int64_t i = 0; i < n; ++i) {
          float* o = out.ptr<float>() + ((s.row_begin + c0 + i) * Hv + h) * dv;
          const float eg = std::exp(gc[i]);
          for (int64_t x = 0; x < dv; ++x) o[x] = 0;
          for (int64_t y = 0; y < dk; ++y) {
            const float qy = Q[i * dk + y] * eg;
            for (int64_t x = 0; x < dv; ++x) o[x] += qy * S[y * dv + x];
          }
          for (int64_t j = 0; j <= i; ++j) {
            const float a = cpu::dot(&Q[i * dk], &Kc[j * dk], dk) * decay(i, j);
            for (int64_t x = 0; x < dv; ++x) o[x] += a * Vn[j * dv + x];
          }
        }
        // S = e^{gc_last} S_prev + (K ⊙ e^{gc_last - gc})^T V'. A save after token e of this chunk
        // takes the same update over rows [0, e] into its row: what a chunk ending at e leaves (its
        // padding rows add zeros; V'_i depends on rows <= i only).
        auto update = [&](float* dst, int64_t e) {
          if (dst != S) std::copy_n(S, dk * dv, dst);
          const float last = gc[e];
          for (int64_t y = 0; y < dk * dv; ++y) dst[y] *= std::exp(last);
          for (int64_t i = 0; i <= e; ++i) {
            const float f = std::exp(last - gc[i]);
            for (int64_t y = 0; y < dk; ++y) {
              const float ky = Kc[i * dk + y] * f;
              for (int64_t x = 0; x < dv; ++x) dst[y * dv + x] += ky * Vn[i * dv + x];
            }
          }
        };
        for (; save != saves_end && save->tokens <= c0 + n; ++save)
          update(state_pool.ptr<float>() + (save->row * Hv + h) * dk * dv, save->tokens - c0 - 1);
        update(S, C - 1);
      }
    }
  });
}

}  // namespace sparkserve
