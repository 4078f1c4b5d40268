// Gated full attention pieces (model-qwen35.md §2.5-2.6): query/gate split, partial rotate-half
// RoPE, paged KV cache writes (rounding to the pool's dtype) and causal GQA attention over the
// pages in fp32.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kernels.h"
#include "core/fp8_quant.h"

namespace sparkserve {

namespace {
// Index of the row of (position `pos`, kv head) of a sequence in a pool [num_blocks, block_size,
// kvh, hd], counted in rows of hd values (scales [num_blocks, block_size, kvh] use the same index).
int64_t kv_row(const Tensor& pool, const SeqSpan& s, int64_t pos, int64_t kv_head) {
  const int64_t block_size = pool.dim(1), kvh = pool.dim(2);
  const int64_t b = pos / block_size;
  CHECK(b < s.num_blocks);
  const int64_t block = s.block_table[b];
  CHECK(block >= 0 && block < pool.dim(0));
  return (block * block_size + pos % block_size) * kvh + kv_head;
}

void check_pool(const KvPool& p) {
  CHECK(p.k.rank() == 4 && p.v.shape == p.k.shape && p.v.dtype == p.k.dtype);
  const DType dt = p.dtype();
  CHECK_MSG(dt == DType::kF32 || dt == DType::kBF16 || dt == DType::kF8E4M3, "KV pool dtype must be f32, bf16 or fp8");
  if (dt == DType::kF8E4M3) {
    const std::vector<int64_t> rows = {p.k.dim(0), p.k.dim(1), p.k.dim(2)};
    CHECK(p.k_scale.dtype == DType::kF32 && p.k_scale.shape == rows && p.v_scale.shape == rows);
  }
}

// Stores x[hd] as row r of `pool` in its dtype (KvPool in backend/ops.h).
void store_row(const Tensor& pool, const Tensor& scales, int64_t r, const float* x, int64_t hd) {
  switch (pool.dtype) {
    case DType::kF32:
      std::memcpy(pool.ptr<float>() + r * hd, x, static_cast<size_t>(hd) * 4);
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < hd; ++i) pool.ptr<uint16_t>()[r * hd + i] = f32_to_bf16(x[i]);
      break;
    default: {
      const float s = fp8_token_scale(x, hd);
      fp8_quantize_row(x, hd, s, pool.ptr<uint8_t>() + r * hd);
      scales.ptr<float>()[r] = s;
    }
  }
}

// Row r of `pool` as f32 values: the row itself (f32 pools) or `buf` filled with the widened
// values (bf16: exact; fp8: e4m3(code) * scale).
const float* load_row(const Tensor& pool, const Tensor& scales, int64_t r, int64_t hd, float* buf) {
  switch (pool.dtype) {
    case DType::kF32:
      return pool.ptr<const float>() + r * hd;
    case DType::kBF16:
      for (int64_t i = 0; i < hd; ++i) buf[i] = bf16_to_f32(pool.ptr<const uint16_t>()[r * hd + i]);
      return buf;
    default: {
      static const std::vector<float> e4m3 = [] {
        std::vector<float> t(256);
        for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
        return t;
      }();
      const float s = scales.ptr<const float>()[r];
      const uint8_t* codes = pool.ptr<const uint8_t>() + r * hd;
      for (int64_t i = 0; i < hd; ++i) buf[i] = e4m3[codes[i]] * s;
      return buf;
    }
  }
}
}  // namespace

void CpuBackend::split_query_gate(const Tensor& q, const Tensor& gate, const Tensor& qg) {
  const int64_t T = q.dim(0), nh = q.dim(1), hd = q.dim(2);
  CHECK(qg.numel() == 2 * q.numel() && gate.numel() == q.numel());
  const float* src = qg.ptr<const float>();
  for (int64_t r = 0; r < T * nh; ++r) {
    std::memcpy(q.ptr<float>() + r * hd, src + r * 2 * hd, static_cast<size_t>(hd) * 4);
    std::memcpy(gate.ptr<float>() + r * hd, src + r * 2 * hd + hd, static_cast<size_t>(hd) * 4);
  }
}

void CpuBackend::rope(const Tensor& x, const Tensor& positions, int64_t rotary_dim, double theta) {
  const int64_t T = x.dim(0), heads = x.dim(1), hd = x.dim(2), half = rotary_dim / 2;
  CHECK(rotary_dim % 2 == 0 && rotary_dim <= hd && positions.numel() == T);
  // inv_freq as HF computes it: fp32 base ** (fp32 (2i) / dim), angle = fp32 pos * inv_freq.
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv_freq[static_cast<size_t>(i)] =
        1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
  const int32_t* pos = positions.ptr<const int32_t>();
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      float angle = static_cast<float>(pos[t]) * inv_freq[static_cast<size_t>(i)];
      float c = std::cos(angle), s = std::sin(angle);
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.ptr<float>() + (t * heads + h) * hd;
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * c - x2 * s;
        v[i + half] = x2 * c + x1 * s;
      }
    }
  }
}

void CpuBackend::kv_cache_write(const KvPool& pool, const Tensor& k, const Tensor& v, const BatchLayout& batch) {
  check_pool(pool);
  const int64_t kvh = pool.k.dim(2), hd = pool.k.dim(3), row = kvh * hd;
  CHECK(k.numel() == batch.total_rows * row && v.numel() == k.numel());
  for (const SeqSpan& s : batch.seqs) {
    for (int64_t i = 0; i < s.num_tokens; ++i) {
      for (int64_t h = 0; h < kvh; ++h) {
        const int64_t r = kv_row(pool.k, s, s.start_pos + i, h), src = (s.row_begin + i) * row + h * hd;
        store_row(pool.k, pool.k_scale, r, k.ptr<const float>() + src, hd);
        store_row(pool.v, pool.v_scale, r, v.ptr<const float>() + src, hd);
      }
    }
  }
}

void CpuBackend::attention(const Tensor& out, const Tensor& q, const KvPool& pool, const BatchLayout& batch,
                           const AttentionDims& d) {
  const int64_t nh = d.num_heads, hd = d.head_dim, group = d.num_heads / d.num_kv_heads;
  check_pool(pool);
  CHECK(q.numel() == batch.total_rows * nh * hd && out.numel() == q.numel());
  CHECK(pool.k.dim(2) == d.num_kv_heads && pool.k.dim(3) == hd);
  // Work items: (query row, head) pairs of every span.
  struct Item { const SeqSpan* span; int64_t i; };
  std::vector<Item> rows;
  for (const SeqSpan& s : batch.seqs)
    for (int64_t i = 0; i < s.num_tokens; ++i) rows.push_back({&s, i});
  pool_.parallel_for(static_cast<int64_t>(rows.size()) * nh, [&](int64_t b, int64_t e) {
    std::vector<float> p;
    std::vector<float> acc(static_cast<size_t>(hd)), buf(static_cast<size_t>(hd));
    for (int64_t w = b; w < e; ++w) {
      const Item& it = rows[static_cast<size_t>(w / nh)];
      const int64_t h = w % nh, kvh = h / group;
      const SeqSpan& s = *it.span;
      const int64_t row = s.row_begin + it.i, len = s.start_pos + it.i + 1;  // causal
      const float* qv = q.ptr<const float>() + (row * nh + h) * hd;
      p.resize(static_cast<size_t>(len));
      float mx = -INFINITY;
      for (int64_t j = 0; j < len; ++j) {
        const float* kr = load_row(pool.k, pool.k_scale, kv_row(pool.k, s, j, kvh), hd, buf.data());
        p[static_cast<size_t>(j)] = cpu::dot(qv, kr, hd) * d.scale;
        mx = std::max(mx, p[static_cast<size_t>(j)]);
      }
      float sum = 0;
      for (int64_t j = 0; j < len; ++j) sum += (p[static_cast<size_t>(j)] = std::exp(p[static_cast<size_t>(j)] - mx));
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < len; ++j) {
        const float* vv = load_row(pool.v, pool.v_scale, kv_row(pool.v, s, j, kvh), hd, buf.data());
        const float pj = p[static_cast<size_t>(j)] / sum;
        for (int64_t c = 0; c < hd; ++c) acc[static_cast<size_t>(c)] += pj * vv[c];
      }
      std::memcpy(out.ptr<float>() + (row * nh + h) * hd, acc.data(), static_cast<size_t>(hd) * 4);
    }
  }, cpu::min_chunk_for(2 * hd * (batch.seqs.empty() ? 1 : batch.seqs[0].start_pos + batch.seqs[0].num_tokens)));
}

}  // namespace sparkserve
