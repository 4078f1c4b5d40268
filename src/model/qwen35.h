// The Qwen3.5 text model (dense `qwen3_5` and MoE `qwen3_5_moe`), written once against the
// backend op interface (backend/ops.h); see model-qwen35.md §2 for the math.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/hf_config.h"
#include "loader/weights.h"
#include "model/forward_batch.h"
#include "model/multimodal.h"
#include "model/vision.h"

namespace sparkserve {

// The geometry of a GDN layer's state (conv window + recurrent state) for this config.
GdnDims gdn_dims(const ModelConfig& c);
int count_layers(const ModelConfig& c, LayerType type);


class Qwen35Model {
 public:
  Qwen35Model(Backend& backend, ModelConfig config, ModelWeights weights);
  ~Qwen35Model();

  const ModelConfig& config() const { return config_; }
  // The checkpoint has a vision tower (config.json vision_config and its tensors).
  bool has_vision() const { return vision_ != nullptr; }
  // Runs the vision tower over mm's images (once; forward does it on first sight).
  Status encode_images(MultimodalPrompt& mm);
  Backend& backend() { return backend_; }

  // Runs every sequence's new tokens through the model: their keys/values go into the KV blocks at
  // their positions, their GDN state rows advance, and the requested logits rows come back. The
  // caller owns every block and row: each sequence's block table must already cover its new
  // positions. Errors (token id out of range, a block table too short, a sequence without a GDN
  // slot, two sequences on one slot) are found before anything is written.
  // On a backend that can record (CUDA), a batch of decode spans (one token, one logits row) and
  // speculative verify spans (logits for every token) replays a forward recorded for its shape (span
  // count, verify spans, rows, longest span) once that shape has been seen before: one host->device
  // copy of the step's inputs, one graph launch, one copy of the logits back. Same kernels on the same
  // data: the logits (and the capture) are bitwise those of running the ops one by one.
  // capture (speculative decoding): receives the batch's final-normalised hidden rows and, for
  // speculative spans (required for them), the GDN inputs commit_speculative replays.
  Expected<Logits> forward(std::span<const ForwardSeq> batch, const StatePools& state,
                           SpecCapture* capture = nullptr);

  // ---- speculative decoding (multi-token prediction, model-qwen35.md §2.9) ----------------------
  // The checkpoint's MTP layer was loaded (LoadOptions::load_mtp).
  bool has_mtp() const { return w_.mtp.present; }
  // Advances the GDN state of the captured speculative spans by their accepted prefix: accepted[i]
  // tokens of batch sequence i (as forward saw the batch; 0 leaves the state as it is, e.g. for a
  // sequence that ended). Runs the decode form over the stashed inputs: the state is what decoding
  // those tokens one by one gives. accepted: one entry per batch sequence. After a recorded verify
  // step the commit is recorded too (per span count and stash rows).
  Status commit_speculative(const SpecCapture& capture, std::span<const int64_t> accepted, const StatePools& state);

  // One sequence's multi-token-prediction pass: rows pair the target's hidden row of position p with
  // the token at p + 1 (MTP row p, at position p, keys/values into state.mtp_kv); then
  // num_drafts tokens are proposed after row draft_row, chained (draft j feeds the MTP's own output
  // and draft j - 1 at the next position). Rows after draft_row (a verify span's rejected tail,
  // padded so that every step of a batch has the same shape) are computed but propose nothing: their
  // keys/values are rewritten by the chained drafts and the next pass before anything reads them.
  // On a backend that can record, each pass of a batch whose hidden rows come from a recorded step
  // replays a recording of its shape (the first sight of a shape runs op by op).
  struct DraftSeq {
    // Covers start_pos + max(rows, draft_row + num_drafts) positions.
    std::span<const int32_t> block_table;
    int64_t start_pos = 0;                 // position of the first row
    std::span<const int32_t> next_tokens;  // one per row: the token after the row's position
    int64_t hidden_row = 0;                // row of `hidden` holding the first row's target hidden state
    int64_t draft_row = -1;                // the row the drafts continue (-1: the last)
    int64_t num_drafts = 0;                // 0: only the rows' keys/values (the MTP's history)
    MultimodalPrompt* mm = nullptr;        // positions inside a prompt with images (M-RoPE)
    int64_t rope_delta = 0;
    bool all_logits = false;               // return the draft logits of every row and chain step
  };
  struct DraftResult {
    std::vector<std::vector<int32_t>> drafts;  // per sequence: num_drafts tokens (argmax of the draft logits)
    Logits logits;  // the rows of sequences with all_logits: each row's, then each chain step's, in order
    std::vector<double> pass_ms;  // host wall time of each MTP pass (each ends with its drafts on the host)
  };
  // hidden: [T, H] f32, the hidden rows of the target forward these rows continue (SpecCapture::hidden).
  Expected<DraftResult> draft(std::span<const DraftSeq> seqs, const Tensor& hidden, const StatePools& state);

  // Recorded decode steps are on by default; off only for A/B measurements (bench --no-graphs) and tests.
  void set_graphs_enabled(bool on);
  bool graphs_enabled() const { return graphs_enabled_; }
  // Fused chains (Backend::gdn_decode_step for pure-decode GDN layers, attention_prep,
  // gated_attention, add_gated_shared_rmsnorm) are on by default; off only for A/B measurements
  // (bench --no-fused) and tests. On the CPU backend both settings compute bit-identical results
  // (the fused ops are the compositions there).
  void set_fused_enabled(bool on) { fused_ = on; }
  bool fused_enabled() const { return fused_; }
  struct GraphStats {
    int64_t recorded = 0;  // decode steps recorded (a new batch size, more KV blocks, new state pools)
    int64_t replayed = 0;  // forwards that replayed a recording (recording steps included)
    double record_ms = 0;  // host time spent recording and instantiating, all recordings
    int64_t kernels = -1;  // kernel nodes of the latest recording (-1: unknown)
  };
  GraphStats graph_stats() const { return graph_stats_; }

 private:
  struct Layout;  // the batch as rows and spans, see qwen35.cpp
  struct StepGraph;  // one recorded step (decode and verify spans), see qwen35.cpp
  struct CommitGraph;  // one recorded commit_speculative, see qwen35_layout.h
  struct DraftGraph;  // one recorded MTP pass, see qwen35_layout.h
  // What a logits row needs back (ForwardSeq::argmax_vocab, argmax_excluded, draw): vocab 0 = its values.
  struct ArgmaxWant {
    int64_t vocab = 0;
    std::span<const int32_t> excluded;
    RowDraw draw;  // temperature > 0: a draw instead of the argmax
  };
  // A recorded step's shape: spans, verify spans, rows, longest span.
  using StepKey = std::array<int64_t, 4>;

  // The layers: tok [T] i32 -> h [T, H] f32, the final-normalised hidden rows.
  void trunk(const Tensor& h, const Tensor& tok, const Layout& layout, const StatePools& state);
  // A batch of decode and verify spans through its recording (recording it first where needed);
  // nullopt when the step has to run op by op (first sight of its shape, or the backend could not
  // record). ids, pos: the batch's token ids and positions, one per row.
  std::optional<Logits> forward_recorded(std::span<const ForwardSeq> batch, const Layout& layout,
                                         const std::vector<int32_t>& ids, const std::vector<int32_t>& pos,
                                         const StatePools& state, const std::vector<ArgmaxWant>& row_argmax,
                                         SpecCapture* capture);
  // Records body (with the fixed layouts already set), or says why not (then graphs are off).
  std::unique_ptr<Recording> record_step(const std::function<void()>& body, const std::string& what);
  // The block size and the state pools a recording writes: recordings are valid for these only.
  std::vector<uintptr_t> state_key(const StatePools& state) const;
  // Makes the recorded steps' shared buffers hold `rows` rows (and the verify stash when stash),
  // dropping every recording that points at the old ones.
  void reserve_step_storage(int64_t rows, bool stash, int64_t min_rows);
  // Views of rows [0, rows) of the stash (a SpecCapture's mixed, g, beta).
  void stash_views(SpecCapture& c, int64_t rows) const;
  void drop_graphs();

  // The residual step after a block: residual += the block's output, h = rmsnorm(residual) with norm.
  // residual, h: [T, H], norm: [H].
  struct ResidualStep {
    Tensor residual, h, norm;
  };
  // Each block reads h ([T, H], normalised hidden) and writes its output to out ([T, H]); with
  // `then`, it also takes that residual step (fused with its output projection; out is scratch then).
  void gdn_layer(const Tensor& out, const Tensor& h, const LayerWeights& w, int gdn_index,
                 const Layout& layout, const StatePools& state, const ResidualStep* then = nullptr);
  // pool: this layer's paged KV pool [num_blocks, block_size, kvh, hd].
  void attention_layer(const Tensor& out, const Tensor& h, const LayerWeights& w, const Layout& layout,
                       const KvPool& pool, int64_t block_size, const ResidualStep* then = nullptr);
  // A block's output projection: out = x W^T, then the residual step when `then` is given.
  void project_out(const Tensor& out, const Tensor& x, const Linear& w, const ResidualStep* then);
  // Rows, spans and positions of a batch; with_images collects the rows image embeddings replace.
  // ids, pos, pos3 (t, h, w per token), logit_rows and row_argmax (what each logits row needs back): filled.
  void make_layout(std::span<const ForwardSeq> batch, bool with_images, Layout& layout, std::vector<int32_t>& ids,
                   std::vector<int32_t>& pos, std::vector<int32_t>& pos3, std::vector<int64_t>& logit_rows,
                   std::vector<ArgmaxWant>& row_argmax);
  // Uploads the layout's positions (and M-RoPE positions when needed).
  void upload_positions(Layout& layout, const std::vector<int32_t>& pos, const std::vector<int32_t>& pos3);
  // The MTP layer over R rows: tok [R] i32 (device), hidden [R, H] -> out [R, H], the MTP's
  // final-normalised output (what lm_head reads and the next chained draft takes as hidden).
  // interleave: [2R] i32 (device) = 0, R, 1, R + 1, ... (fc's input rows from [embeddings ; hidden]).
  void mtp_layer(const Tensor& out, const Tensor& tok, const Tensor& hidden, const Tensor& interleave,
                 const Layout& layout, const StatePools& state);
  // The attention input chain op by op (split, q/k norms, RoPE, KV write): what attention_prep
  // fuses; run when fused ops are off. qg: [T, nh, 2hd], k, v: [T, kvh, hd] -> q, gate: [T, nh, hd].
  void unfused_attention_prep(const Tensor& q, const Tensor& gate, const Tensor& qg, const Tensor& k,
                              const Tensor& v, const AttentionWeights& w, const Layout& layout,
                              const KvPool& pool);
  // The MoE block and the residual step after it: out = the block's output, residual += out,
  // h = rmsnorm(residual) with next_norm. residual: [T, H], next_norm: [H].
  void moe(const Tensor& out, const Tensor& h, const MoeWeights& w, const Tensor& residual, const Tensor& next_norm);
  void mlp(const Tensor& out, const Tensor& h, const MlpWeights& w);
  // hidden: [R, H] final-normalised rows -> [R, V] logits on the host (see download_logits).
  Logits lm_head(const Tensor& hidden, const std::vector<ArgmaxWant>& row_argmax = {});
  // logits: [R, V] f32 in backend memory -> host copy of the rows whose row_argmax vocab is 0 (or every
  // row when row_argmax is empty), and the argmax over the first row_argmax[r].vocab columns of the
  // others, their excluded columns out of play.
  Logits download_logits(const Tensor& logits, const std::vector<ArgmaxWant>& row_argmax = {});

  Buffer buffer(std::vector<int64_t> shape, DType dtype = DType::kF32) {
    return Buffer(&backend_, dtype, std::move(shape));
  }

  Backend& backend_;
  ModelConfig config_;
  ModelWeights w_;
  std::unique_ptr<VisionTower> vision_;
  Buffer mrope_axis_, mrope_inv_freq_;  // the text M-RoPE as rope_axes tables: [rotary_dim / 2]
  std::vector<int> layer_slot_;  // per layer: its index among GDN layers or among attention layers

  bool graphs_enabled_ = true;
  bool fused_ = true;
  GraphStats graph_stats_;
  SpecCapture* capture_ = nullptr;  // the running forward's capture (speculative spans' GDN inputs)
  std::map<StepKey, std::unique_ptr<StepGraph>> graphs_;
  std::map<std::array<int64_t, 2>, std::unique_ptr<CommitGraph>> commit_graphs_;  // by spans, stash rows
  // By hidden source (0: a recorded step's rows, 1: the previous pass's), spans, rows, logits rows,
  // longest span.
  std::map<std::array<int64_t, 5>, std::unique_ptr<DraftGraph>> draft_graphs_;
  std::vector<uintptr_t> graph_state_key_;  // block size and the state pools the recordings write
  // What every recording reads and writes besides the state (shared, so that many shapes do not each
  // hold their own): rows of logits [rows, V] and final hidden rows [rows, H] (of the steps, and of
  // the MTP passes: `carried` holds a pass's drafting rows for the next); the verify stash per GDN
  // layer, mixed [stash_rows, conv_dim], g and beta [stash_rows, Hv].
  struct StepStorage {
    int64_t rows = 0, stash_rows = 0;
    Buffer logits, hidden, carried;
    std::vector<Buffer> mixed, g, beta;
  } storage_;
};

}  // namespace sparkserve
