// The backend op interface. The model (src/model/qwen35.*) is written once against it and never
// names a device; the CPU backend (backend/cpu/) is the executable specification, a CUDA backend
// implements the same functions (fusing steps inside one op where it pays, as long as each op
// computes the same function).
//
// Conventions:
// - Activations are f32 tensors, contiguous, row-major, one row per token ([T, ...]).
// - Tensors passed to ops live in the backend's memory (alloc/upload); `out` may alias an input
//   only where the op says so.
// - Per-sequence state ops (conv/recurrent state, KV cache) take a BatchLayout: host-side metadata
//   saying which rows belong to which sequence, where it starts, and where its state lives. A
//   device backend copies what it needs (span offsets, block tables) to the device itself, once per
//   forward; the model passes the same BatchLayout to every layer.
// - Spans of several tokens go to gdn_chunked and single decode tokens to gdn_recurrent, so a
//   device backend can use a prefill kernel and a decode kernel; attention takes any mix.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "core/tensor.h"
#include "loader/weight_format.h"

namespace sparkserve {

// How a matrix weight is stored: WeightFormat (loader/weight_format.h) names the checkpoint
// formats. Quantized weights stay quantized in backend memory, with their scales below; each
// backend's linear / moe_experts kernel dequantizes inside its inner loop (docs/quantized-model.md).
// A matrix used as y = x W^T. For stacked expert weights the tensor has a leading expert dim
// ([E, out, in]) and `out_features`/`in_features` describe one expert.
//
// Quantized formats (the scale fields stay empty for kBf16 / kF32 / kF16). A Linear fused from
// several checkpoint modules (gate_proj rows then up_proj rows; per-expert modules stacked) keeps
// each module's own global / input scales: `partitions` equal row blocks of out_features/partitions
// rows each, per expert. Nothing is collapsed to one scale.
//   kNvfp4 (compressed-tensors) / kNvfp4ModelOpt:
//     weight        U8 [(E,) out, in/2]      E2M1 codes, lower in-index in the low nibble
//     weight_scale  F8_E4M3 [(E,) out, in/16] one block scale per 16 inputs
//     global_scale  F32 [(E,) partitions]   kNvfp4: weight_global_scale (W = e2m1·fp8(s) / gs);
//                                           kNvfp4ModelOpt: weight_scale_2 (W = e2m1·fp8(s) · ws2)
//     input_scale   F32 [(E,) partitions]   activation == kNvfp4 only. kNvfp4: input_global_scale
//                                           (quantize direction); kNvfp4ModelOpt: input_scale
//                                           (= 1/input_global_scale, the quantizer uses 1/input_scale)
//   kFp8Channel / kFp8Tensor:
//     weight        F8_E4M3 [(E,) out, in]
//     weight_scale  F32 [(E,) out]          dequant multiplier per output row (a per-tensor scale is
//                                           repeated over its partition's rows: same products)
//     input_scale   F32 [(E,) partitions]   activation == kFp8TensorStatic only
// activation says how x is quantized at run time before the product (ActivationQuant):
//   kNone (W4A16 / W8A16 / unquantized), kNvfp4 (per 16 inputs, static global scale),
//   kFp8TokenDynamic (per token s = max(amax/448, 1/(448·512))), kFp8TensorStatic.
struct Linear {
  WeightFormat format = WeightFormat::kBf16;
  Tensor weight;  // [out, in] or [E, out, in] (packed / code layouts above for quantized formats)
  int64_t out_features = 0;
  int64_t in_features = 0;
  ActivationQuant activation = ActivationQuant::kNone;
  Tensor weight_scale;
  Tensor global_scale;
  Tensor input_scale;
  int64_t partitions = 1;
};

// A copy of one sequence's GDN state taken inside a forward (a prefix-cache snapshot): once the first
// `tokens` of its span's tokens are folded in, every GDN layer's conv and recurrent state goes to pool
// row `row` as well as on to the rest of the span.
// One copy of a batch (Backend::copy_batch): dst = src, byte for byte.
struct TensorCopy {
  Tensor dst, src;  // same dtype and element count, both in the backend's memory
};

// Aborts unless `copies` is a valid copy_batch list (matching dtype and size, independent copies);
// every backend's copy_batch calls it first.
void check_copy_batch(const std::vector<TensorCopy>& copies);

struct GdnStateSave {
  int64_t tokens = 0;  // 0 < tokens <= the span's tokens
  int32_t row = -1;    // a pool row other than any span's slot
};

// One sequence's share of a batch: rows [row_begin, row_begin + num_tokens) of every activation
// tensor are its new tokens, at positions start_pos, start_pos + 1, ...
struct SeqSpan {
  int64_t row_begin = 0;
  int64_t num_tokens = 0;
  int64_t start_pos = 0;       // tokens already held in this sequence's state
  int32_t gdn_slot = -1;       // index into the GDN state pools
  const int32_t* block_table = nullptr;  // host: KV block ids covering positions [0, start_pos + num_tokens)
  int64_t num_blocks = 0;
  // Host: GDN state saves inside the span, ascending by tokens, into distinct rows (gdn_conv,
  // gdn_recurrent, gdn_chunked write them; every other op ignores them, gdn_verify and the fused GDN
  // steps take none). A save changes no output and no live state.
  const GdnStateSave* saves = nullptr;
  int64_t num_saves = 0;
};
// The span's GDN slot and save rows lie in a state pool of `rows` rows, its saves ascend inside it.
inline bool gdn_rows_ok(const SeqSpan& s, int64_t rows) {
  int64_t prev = 0;
  for (int64_t i = 0; i < s.num_saves; ++i) {
    const GdnStateSave& v = s.saves[i];
    if (v.tokens <= prev || v.tokens > s.num_tokens || v.row < 0 || v.row >= rows || v.row == s.gdn_slot) return false;
    prev = v.tokens;
  }
  return s.gdn_slot >= 0 && s.gdn_slot < rows;
}
struct BatchLayout {
  std::vector<SeqSpan> seqs;
  int64_t total_rows = 0;
};

// Geometry of a Gated DeltaNet layer (see model-qwen35.md §2.4).
struct GdnDims {
  int64_t num_k_heads = 0;   // Hk
  int64_t num_v_heads = 0;   // Hv (a multiple of Hk; value head h reads key head h / (Hv/Hk))
  int64_t k_head_dim = 0;    // dk
  int64_t v_head_dim = 0;    // dv
  int64_t conv_kernel = 0;   // K
  int64_t key_dim() const { return num_k_heads * k_head_dim; }
  int64_t value_dim() const { return num_v_heads * v_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }
};

// The recurrent state pool: a GDN layer's state [rows, Hv, dk, dv], stored in one of two dtypes:
//   kF32    the values as computed;
//   kBF16   the state between ops in bf16. An op that reads the pool widens each value to f32 and
//           runs the f32 function as above; an op that writes it rounds each value it stores to
//           nearest even, once: at the end of its span (the span's slot) and at each save (the save's
//           row), never between the tokens of one call. A chunked prefill of 3,000 tokens rounds
//           once, a decode step once per token, a commit of k accepted tokens (one gdn_recurrent span)
//           once, and gdn_verify, which writes nothing, not at all: its outputs are those of the same
//           span's gdn_recurrent (the commit), not those of k single-token decode steps.
// So the bf16 form of an op is exactly the f32 op on the widened rows followed by one rounding of
// what it stores; the CPU backend computes it that way (backend/cpu/gdn.cpp) and is the reference.
// The conv state pools stay f32.
// One attention layer's paged KV cache. k, v: [num_blocks, block_size, kvh, hd] of one dtype:
//   kF32    the values as written;
//   kBF16   each value rounded to nearest even bf16;
//   kF8E4M3 each (position, kv head) row of hd values quantized with its own scale, computed when
//           the row is written (no calibrated scales needed): s = max(amax / 448, 1 / (448 * 512)),
//           code = e4m3(x / s) rounded to nearest even (core/fp8_quant.h, as the dynamic per-token
//           activation scales), s kept in k_scale / v_scale [num_blocks, block_size, kvh] f32;
//           the value read back is e4m3(code) * s.
// Every backend stores the same rounded values (bit for bit), so the CPU backend is the reference
// for each dtype.
struct KvPool {
  Tensor k, v;
  Tensor k_scale, v_scale;  // kF8E4M3 only
  DType dtype() const { return k.dtype; }
};

// Geometry of a paged KV pool for one attention layer: [num_blocks, block_size, kv_heads, head_dim].
struct AttentionDims {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;  // query head h reads kv head h / (num_heads / num_kv_heads)
  int64_t head_dim = 0;
  int64_t block_size = 0;
  float scale = 1.0f;        // softmax scale, head_dim^-0.5
};

// A sequence of ops recorded once and replayed as a whole (a CUDA graph): each replay runs the same
// kernels on the same buffers, so whatever changes between replays must be written into those
// buffers (not passed as host arguments) before replay().
class Recording {
 public:
  virtual ~Recording() = default;
  virtual void replay() = 0;
  // Kernels one replay runs (-1: not known).
  virtual int64_t kernel_nodes() const { return -1; }
};

// The most columns one Backend::argmax call may exclude (a request's stop ids); more take the full row.
inline constexpr size_t kArgmaxMaxExcluded = 64;

// One row's random draw for Backend::draw (the sampler's parameters, runtime/sampler.h): temperature
// > 0 (a row with temperature <= 0 is not drawn), top_k 0 = off, top_p 1 = off, min_p 0 = off, and
// the row's uniform number u in [0, 1).
struct RowDraw {
  float temperature = 0.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  double u = 0.0;
};

struct RowArgmax {
  int32_t id = 0;
  int32_t nonfinite = -1;
  bool operator==(const RowArgmax& o) const { return id == o.id && nonfinite == o.nonfinite; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Device device() const = 0;
  virtual const char* name() const = 0;

  // ---- memory -------------------------------------------------------------------------------
  // Uninitialised buffer; release with free().
  virtual Tensor alloc(DType dtype, std::vector<int64_t> shape) = 0;
  virtual void free(Tensor& t) = 0;
  virtual void upload(const Tensor& dst, const void* host_src) = 0;   // dst.nbytes() bytes
  virtual void download(void* host_dst, const Tensor& src) = 0;       // src.nbytes() bytes
  virtual void fill_zero(const Tensor& t) = 0;
  // Every dst = its src, byte for byte (state rows and KV blocks: prefix-cache snapshots and
  // copy-on-write blocks). The copies are independent: no destination overlaps a source or another
  // destination (checked; sources may overlap each other), so the result does not depend on their
  // order and a device backend runs them all in one go (a snapshot restore is ~80 copies, whose
  // separate launches cost more host time than the GPU takes to move the bytes).
  virtual void copy_batch(const std::vector<TensorCopy>& copies) = 0;
  // One copy: copy_batch of {dst, src}.
  void copy(const Tensor& dst, const Tensor& src);
  // Waits for queued work (no-op on CPU).
  virtual void synchronize() {}
  // Host memory that upload() reads fastest (CUDA: page-locked), for the loader's one reused staging
  // buffer (loader/weight_stream.h); nullptr: ordinary heap memory will do. Release with
  // free_host_staging.
  virtual void* alloc_host_staging(size_t bytes) { return nullptr; }
  virtual void free_host_staging(void* p) {}

  // ---- dense ops ----------------------------------------------------------------------------
  // ids: [T] i32, table: [V, H] f32|bf16 -> out: [T, H] f32. ids must be < V (checked by caller).
  virtual void embedding(const Tensor& out, const Tensor& ids, const Linear& table) = 0;
  // Zero-centred RMSNorm over the last dim: out = x * rsqrt(mean(x^2) + eps) * (1 + w).
  // x: [R, D] f32, w: [D] f32 -> out: [R, D] f32 (out may alias x).
  virtual void rmsnorm(const Tensor& out, const Tensor& x, const Tensor& w, float eps) = 0;
  // residual += delta; out = rmsnorm(residual) (zero-centred). residual, delta, out: [R, D] f32.
  virtual void add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& delta,
                           const Tensor& w, float eps) = 0;
  // x: [T, in] f32 -> out: [T, out] f32, out = x W^T.
  virtual void linear(const Tensor& out, const Tensor& x, const Linear& w) = 0;
  // gate_up: [T, 2I] f32 (gate = first I columns, up = last I) -> out: [T, I] = silu(gate) * up.
  virtual void silu_mul(const Tensor& out, const Tensor& gate_up) = 0;
  // out = a + b, all [N] f32 (out may alias a or b).
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // x *= sigmoid(gate), elementwise; x, gate: same shape f32.
  virtual void sigmoid_mul(const Tensor& x, const Tensor& gate) = 0;
  // out[t] += sigmoid(gate_logit[t]) * y[t]; out, y: [T, H] f32, gate_logit: [T, 1] f32.
  virtual void add_sigmoid_scaled(const Tensor& out, const Tensor& y, const Tensor& gate_logit) = 0;
  // Copies rows: out[i] = x[rows[i]]. x: [T, D] f32, rows: host indices -> out: [R, D] f32.
  virtual void gather_rows(const Tensor& out, const Tensor& x, const std::vector<int64_t>& rows) = 0;
  // The same with the indices in backend memory (a recording takes them from its inputs): out[i] =
  // x[rows[i]]; a row index outside [0, T) gives a row of NaN. x: [T, D] f32, rows: [R] i32 -> out: [R, D] f32.
  virtual void gather_rows_at(const Tensor& out, const Tensor& x, const Tensor& rows) = 0;
  // The greedy choice of each row over its first `vocab` columns (vocab <= V), as the CPU sampler
  // makes it: the lowest index among equal maxima (-inf counts, NaN never wins); `nonfinite` is the
  // first index holding NaN or +Inf (-1: none), which the sampler refuses instead of sampling.
  // Columns listed in `excluded` never win (the sampler's -inf mask of stop ids before min_tokens)
  // but still count for `nonfinite`, as the sampler checks the raw row before masking it
  // (at most kArgmaxMaxExcluded of them).
  // logits: [R, V] f32 -> host [R].
  virtual std::vector<RowArgmax> argmax(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded) = 0;
  // One draw per row r with rows[r].temperature > 0 from the sampler's truncated distribution
  // (core/truncated_draw.h: draw_truncated) over the row's first `vocab` columns, `excluded` out of
  // play and `nonfinite` reported as argmax does (then id 0, nothing drawn). A row with no possible
  // token gives its lowest column not excluded. Rows not drawn come back as {0, -1}. Weights and sums
  // are in double as on the host; a backend whose exp or summation order differs in the last bits
  // may pick the neighbouring token where u * total lands within that rounding of a boundary.
  // logits: [R, V] f32, rows: [R] -> host [R].
  virtual std::vector<RowArgmax> draw(const Tensor& logits, int64_t vocab, const std::vector<int32_t>& excluded,
                                      const std::vector<RowDraw>& rows) = 0;

  // ---- gated attention (model-qwen35.md §2.5, §2.6) --------------------------------------------
  // qg: [T, nh, 2*hd] (per head: query then gate) -> q: [T, nh, hd], gate: [T, nh, hd].
  virtual void split_query_gate(const Tensor& q, const Tensor& gate, const Tensor& qg) = 0;
  // In place, partial rotate-half RoPE on the first rotary_dim dims of each head (pairs i and
  // i + rotary_dim/2), angle = pos * theta^(-2i/rotary_dim). x: [T, heads, hd] f32,
  // positions: [T] i32 (device).
  virtual void rope(const Tensor& x, const Tensor& positions, int64_t rotary_dim, double theta) = 0;
  // Writes each span's new k/v rows into the paged pools at positions start_pos..., rounded to the
  // pool's dtype (KvPool). k, v: [T, kvh, hd] f32.
  virtual void kv_cache_write(const KvPool& pool, const Tensor& k, const Tensor& v, const BatchLayout& batch) = 0;
  // Causal GQA attention of each span's queries over its cached positions [0, start_pos + i], in
  // fp32 over the values the pool holds. q: [T, nh, hd] f32 -> out: [T, nh, hd] f32. The pool
  // already holds the span's new keys/values.
  virtual void attention(const Tensor& out, const Tensor& q, const KvPool& pool, const BatchLayout& batch,
                         const AttentionDims& dims) = 0;

  // ---- Gated DeltaNet (model-qwen35.md §2.4) --------------------------------------------------
  // Causal depthwise conv (kernel K, no bias) + SiLU over each span, continuing from and updating
  // the span's conv state (the last K-1 inputs, zeros for a fresh sequence). A save (SeqSpan::saves)
  // after t tokens: row `row` := the state after the span's first t tokens.
  // mixed: [T, C] f32, weight: [C, K] f32, conv_state_pool: [slots, C, K-1] f32 -> out: [T, C] f32.
  virtual void gdn_conv(const Tensor& out, const Tensor& mixed, const Tensor& weight,
                        const Tensor& conv_state_pool, const BatchLayout& batch) = 0;
  // g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b).
  // a, b: [T, Hv] f32, A_log, dt_bias: [Hv] f32 -> g, beta: [T, Hv] f32.
  virtual void gdn_gating(const Tensor& g, const Tensor& beta, const Tensor& a, const Tensor& b,
                          const Tensor& A_log, const Tensor& dt_bias) = 0;
  // Delta rule, token by token (decode form): q, k L2-normalised (eps 1e-6), q scaled by dk^-0.5,
  // per value head: S = exp(g) S; S += k (beta (v - S^T k))^T; o = S^T q. A save after t tokens:
  // row `row` := S after the span's t-th token.
  // qkv: [T, conv_dim] f32 (conv output: q | k | v), g, beta: [T, Hv] f32,
  // state_pool: [slots, Hv, dk, dv] f32|bf16 -> out: [T, Hv, dv] f32. Only rows of the batch's spans.
  virtual void gdn_recurrent(const Tensor& out, const Tensor& qkv, const Tensor& g,
                             const Tensor& beta, const Tensor& state_pool, const BatchLayout& batch,
                             const GdnDims& dims) = 0;
  // A speculative verify: gdn_conv then gdn_recurrent over each span's tokens as if run on copies of
  // the span's state rows, i.e. the outputs of decoding those tokens one by one, while both pools keep
  // the state before the span (commit_speculative folds in the accepted prefix later).
  // mixed: [T, C] f32, conv_w: [C, K] f32, g, beta: [T, Hv] f32, conv_state_pool: [slots, C, K-1] f32,
  // state_pool: [slots, Hv, dk, dv] f32|bf16 (both read only) -> qkv: [T, C] f32 (conv outputs),
  // out: [T, Hv, dv] f32. Only rows of the batch's spans.
  virtual void gdn_verify(const Tensor& out, const Tensor& qkv, const Tensor& mixed, const Tensor& conv_w,
                          const Tensor& g, const Tensor& beta, const Tensor& conv_state_pool,
                          const Tensor& state_pool, const BatchLayout& batch, const GdnDims& dims) = 0;
  // The same function in the chunked form (chunk 64, HF torch_chunk_gated_delta_rule) for prefill. A
  // save after t tokens: row `row` := the state this op leaves for the span's first t tokens alone
  // (chunks from the span's start, the last one ending at t); the chunks of the span itself are not cut.
  virtual void gdn_chunked(const Tensor& out, const Tensor& qkv, const Tensor& g, const Tensor& beta,
                           const Tensor& state_pool, const BatchLayout& batch, const GdnDims& dims) = 0;
  // Gated RMSNorm with a PLAIN weight: out = x * rsqrt(mean(x^2) + eps) * w * silu(z).
  // x, z: [R, D] f32, w: [D] f32 -> out: [R, D] f32.
  virtual void gated_rmsnorm(const Tensor& out, const Tensor& x, const Tensor& z, const Tensor& w,
                             float eps) = 0;

  // ---- fused chains (fewer kernel boundaries per decode step) ---------------------------------
  // Each computes exactly the composition of the ops named, in that order; the defaults below
  // (backend/fused_ops.cpp) ARE that composition, so the CPU reference is unchanged by them. A
  // device backend may override one with fewer kernels (other fp32 rounding, same function).
  //
  // A GDN layer's token mixing for a batch of single-token spans (every span num_tokens == 1),
  // after the two big projections (mixed = in_proj_qkv(h), z = in_proj_z(h)):
  //   linear(b, h, in_proj_b) -> linear(a, h, in_proj_a) -> gdn_conv(qkv, mixed)
  //   -> gdn_gating(g, beta, a, b) -> gdn_recurrent(core, qkv, g, beta)
  //   -> gated_rmsnorm(out, core, z, norm_w) over rows of dv.
  // h: [T, H] f32, mixed: [T, conv_dim] f32, z: [T, Hv*dv] f32, in_proj_a, in_proj_b: [Hv, H],
  // conv_w: [conv_dim, K] f32, A_log, dt_bias: [Hv] f32, norm_w: [dv] f32,
  // conv_state_pool: [slots, conv_dim, K-1] f32, state_pool: [slots, Hv, dk, dv] f32|bf16
  // -> out: [T, Hv*dv] f32. Both pools are updated.
  virtual void gdn_decode_step(const Tensor& out, const Tensor& h, const Tensor& mixed, const Tensor& z,
                               const Linear& in_proj_a, const Linear& in_proj_b, const Tensor& conv_w,
                               const Tensor& A_log, const Tensor& dt_bias, const Tensor& norm_w, float eps,
                               const Tensor& conv_state_pool, const Tensor& state_pool,
                               const BatchLayout& batch, const GdnDims& dims);
  // The same chain for speculative verify spans (any number of tokens each), the state read and never
  // written (gdn_verify in place of gdn_conv + gdn_recurrent), the gates kept:
  //   linear(b, h, in_proj_b) -> linear(a, h, in_proj_a) -> gdn_gating(g, beta, a, b)
  //   -> gdn_verify(core, qkv, mixed, conv_w, g, beta, pools) -> gated_rmsnorm(out, core, z, norm_w).
  // Shapes as gdn_decode_step's, plus g, beta: [T, Hv] f32 (out). Only rows of the batch's spans.
  virtual void gdn_verify_step(const Tensor& out, const Tensor& g, const Tensor& beta, const Tensor& h,
                               const Tensor& mixed, const Tensor& z, const Linear& in_proj_a, const Linear& in_proj_b,
                               const Tensor& conv_w, const Tensor& A_log, const Tensor& dt_bias,
                               const Tensor& norm_w, float eps, const Tensor& conv_state_pool,
                               const Tensor& state_pool, const BatchLayout& batch, const GdnDims& dims);
  // Attention input preparation, any layout:
  //   split_query_gate(q, gate, qg) -> rmsnorm(q per head, q_norm_w) -> rmsnorm(k per head, k_norm_w)
  //   -> rope(q) -> rope(k) -> kv_cache_write(pool, k, v).
  // qg: [T, nh, 2*hd] f32, k, v: [T, kvh, hd] f32 (k is left normalised and rotated, as the
  // composition leaves it), q_norm_w, k_norm_w: [hd] f32, positions: [T] i32 (device)
  // -> q, gate: [T, nh, hd] f32; the pool gets the span rows in its dtype.
  virtual void attention_prep(const Tensor& q, const Tensor& gate, const Tensor& qg, const Tensor& k,
                              const Tensor& v, const Tensor& q_norm_w, const Tensor& k_norm_w, float eps,
                              const Tensor& positions, int64_t rotary_dim, double theta, const KvPool& pool,
                              const BatchLayout& batch);
  // attention(out, q, pool) -> sigmoid_mul(out, gate). q, gate: [T, nh, hd] f32 -> out: [T, nh, hd] f32.
  virtual void gated_attention(const Tensor& out, const Tensor& q, const Tensor& gate, const KvPool& pool,
                               const BatchLayout& batch, const AttentionDims& dims);
  // The end of an MoE block and the residual step after it:
  //   linear(logit, h, shared_gate) -> add_sigmoid_scaled(d, y, logit) -> add_rmsnorm(residual, h, d, norm_w).
  // d: [T, H] f32 the routed experts' sum (left holding the block output), y: [T, H] f32 the shared
  // expert's output, h: [T, H] f32 the block's input, overwritten with the normalised new residual,
  // shared_gate: [1, H], norm_w: [H] f32; residual: [T, H] f32 (+= d).
  virtual void add_gated_shared_rmsnorm(const Tensor& residual, const Tensor& h, const Tensor& d, const Tensor& y,
                                        const Linear& shared_gate, const Tensor& norm_w, float eps);
  // Linears of one input, each as linear: outs[i] = x ws[i]^T (the projections of a layer's input).
  // A backend may quantize x once for all of them and run them at the same time (as run_branches).
  // x: [T, K] f32 -> outs[i]: [T, ws[i]->out_features] f32.
  virtual void linears(const std::vector<Tensor>& outs, const Tensor& x, const std::vector<const Linear*>& ws);
  // A layer's output projection and the residual step after it:
  //   linear(d, x, w) -> add_rmsnorm(residual, out, d, norm_w).
  // x: [T, K] f32, residual: [T, D] f32 (+= x W^T), norm_w: [D] f32 -> out: [T, D] f32 (not aliasing x).
  virtual void linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& x, const Linear& w,
                                  const Tensor& norm_w, float eps);
  // The end of a GDN block and the residual step after it:
  //   gated_rmsnorm(normed, core, z, gate_norm_w) over rows of dv -> linear_add_rmsnorm(residual, out, normed, w,
  //   norm_w), eps for both norms.
  // core, z: [T, Hv, dv] f32, gate_norm_w: [dv] f32, w: [D, Hv dv], residual: [T, D] f32, norm_w: [D] f32
  // -> out: [T, D] f32.
  virtual void gated_rmsnorm_linear_add_rmsnorm(const Tensor& residual, const Tensor& out, const Tensor& core,
                                                const Tensor& z, const Tensor& gate_norm_w, const Linear& w,
                                                const Tensor& norm_w, float eps);
  // The gated MLP (dense layers, the MoE's shared expert):
  //   linear(gu, x, gate_up) -> silu_mul(act, gu) -> linear(out, act, down).
  // x: [T, H] f32, gate_up: [2I, H] (gate rows first), down: [H', I] -> out: [T, H'] f32.
  virtual void gated_mlp(const Tensor& out, const Tensor& x, const Linear& gate_up, const Linear& down);

  // The routed experts of an MoE block from the router's logits:
  //   moe_route_topk(weights, ids, router_logits) -> moe_experts(out, x, ids, weights, gate_up, down).
  // router_logits: [T, E] f32, x: [T, H] f32 -> weights: [T, k] f32, ids: [T, k] i32, out: [T, H] f32.
  virtual void moe_route_experts(const Tensor& out, const Tensor& weights, const Tensor& ids,
                                 const Tensor& router_logits, const Tensor& x, const Linear& gate_up,
                                 const Linear& down);

  // ---- MoE (model-qwen35.md §2.7) ------------------------------------------------------------
  // fp32 softmax over all E experts, top-k (ties: lower id first), renormalised to sum 1.
  // router_logits: [T, E] f32 -> weights: [T, k] f32, ids: [T, k] i32.
  virtual void moe_route_topk(const Tensor& weights, const Tensor& ids, const Tensor& router_logits) = 0;
  // out[t] = sum_j weights[t, j] * down_e(silu(gate_e(x_t)) * up_e(x_t)), e = ids[t, j].
  // x: [T, H] f32, gate_up: [E, 2I, H] (gate rows first), down: [E, H, I] -> out: [T, H] f32.
  virtual void moe_experts(const Tensor& out, const Tensor& x, const Tensor& ids,
                           const Tensor& weights, const Linear& gate_up, const Linear& down) = 0;

  // ---- vision tower (model-qwen35.md §5; backend/cpu/vision_ops.cpp) ---------------------------
  // LayerNorm with bias over the last dim: out = (x - mean) / sqrt(var + eps) * w + b, biased variance.
  // x: [R, D] f32, w, b: [D] f32 -> out: [R, D] f32 (out may alias x).
  virtual void layernorm(const Tensor& out, const Tensor& x, const Tensor& w, const Tensor& b, float eps) = 0;
  // x[r, :] += b for every row. x: [R, D] f32, b: [D] f32.
  virtual void add_bias(const Tensor& x, const Tensor& b) = 0;
  // The vision tower's linear with its bias, and optionally its residual add, as one op so a backend
  // can fold both into the matmul: out = x W^T + b, or out += x W^T + b when accumulate (out is then
  // the residual stream). The same function as linear, then add_bias (then add).
  // x: [T, K] f32, b: [N] f32 -> out: [T, N] f32 (written, or added to when accumulate).
  virtual void linear_bias(const Tensor& out, const Tensor& x, const Linear& w, const Tensor& b, bool accumulate) = 0;
  // GELU: tanh approximation (gelu_pytorch_tanh) or the exact erf form. x: [N] f32 -> out: [N] f32
  // (out may alias x).
  virtual void gelu(const Tensor& out, const Tensor& x, bool tanh_approx) = 0;
  // Weighted rows of a table (the vision tower's interpolated position embedding):
  // out[n] = sum over k in order of weights[n, k] * table[ids[n, k]].
  // ids: [N, K] i32, weights: [N, K] f32, table: [V, D] f32|bf16 -> out: [N, D] f32.
  virtual void embedding_mix(const Tensor& out, const Tensor& ids, const Tensor& weights, const Linear& table) = 0;
  // Rotate-half rotary embedding whose angle for pair i comes from one of several position axes:
  // angle(t, i) = positions[t, axis[i]] * inv_freq[i] (fp32), pairs (i, i + P), P = inv_freq.numel(),
  // on the first 2P dims of every head; the vision tower's 2-D rope (axes row, col) and the text
  // model's interleaved M-RoPE (axes t, h, w) are both this op.
  // x: [T, heads, hd] f32 (in place), positions: [T, A] i32, axis: [P] i32 (< A), inv_freq: [P] f32.
  virtual void rope_axes(const Tensor& x, const Tensor& positions, const Tensor& axis, const Tensor& inv_freq) = 0;
  // Bidirectional attention within segments: rows of one segment (consecutive, lengths on the host,
  // summing to N) attend to every row of that segment and no other; fp32 softmax.
  // q, k, v: [N, heads, hd] f32 -> out: [N, heads, hd] f32.
  virtual void attention_segments(const Tensor& out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const std::vector<int64_t>& segment_lengths, float scale) = 0;

  // ---- independent branches -----------------------------------------------------------------
  // Runs each branch, a sequence of ops, as if one after another in order. The caller promises that
  // no branch reads or writes what another branch writes, and that buffers a branch allocates are
  // freed inside it; the backend may then run the branches at the same time (CUDA: branch 0 on the
  // stream, the others on side streams forked from it and joined before this returns), with the
  // same results bit for bit. Ops issued after the call see every branch's writes.
  virtual void run_branches(const std::vector<std::function<void()>>& branches) {
    for (const auto& b : branches) b();
  }
  // false: run_branches runs the branches in order on one stream even where it could overlap them
  // (A/B measurements: bench --sequential-branches; tests). Results are bitwise the same either way.
  virtual void set_concurrent_branches(bool on) {}

  // ---- recorded forward passes (CUDA graphs; the CPU backend runs every op as it comes) --------
  // The ops `body` issues, recorded instead of run; null where the backend cannot record. Inside
  // body, ops must not upload, download or synchronize, and state ops must read a fixed layout.
  virtual bool can_record() const { return false; }
  virtual std::unique_ptr<Recording> record(const std::function<void()>& body) { return nullptr; }
  // A BatchLayout at a fixed device address: pack_layout writes `batch` (every span with at most
  // max_blocks KV blocks) as layout_words(spans, rows, max_blocks) int32 words whose positions depend
  // only on those three numbers, so one recording serves every step of that shape. While
  // set_fixed_layout(words, batch, max_blocks, max_len) holds (until clear_fixed_layout; a recording
  // may set several, one per layout its ops read), a state op given a batch equal to `batch` reads its
  // layout from `words` (a device i32 buffer the caller refills with pack_layout before each replay).
  // Every batch replayed there has batch's span count, row count and longest span; max_len bounds
  // start_pos + num_tokens of every span.
  virtual int64_t layout_words(int64_t spans, int64_t rows, int64_t max_blocks) const { return 0; }
  virtual void pack_layout(const BatchLayout& batch, int64_t max_blocks, int32_t* words) const {}
  virtual void set_fixed_layout(const Tensor& words, const BatchLayout& batch, int64_t max_blocks, int64_t max_len) {}
  virtual void clear_fixed_layout() {}
};

// A backend buffer freed when the owner goes away.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend* backend, DType dtype, std::vector<int64_t> shape)
      : backend_(backend), t_(backend->alloc(dtype, std::move(shape))) {}
  Buffer(Buffer&& o) noexcept : backend_(o.backend_), t_(std::move(o.t_)) { o.backend_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      backend_ = o.backend_;
      t_ = std::move(o.t_);
      o.backend_ = nullptr;
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { release(); }
  const Tensor& tensor() const { return t_; }
  operator const Tensor&() const { return t_; }  // NOLINT: a Buffer is used where a Tensor is

 private:
  void release() {
    if (backend_ && t_.data) backend_->free(t_);
    backend_ = nullptr;
  }
  Backend* backend_ = nullptr;
  Tensor t_;
};

}  // namespace sparkserve
