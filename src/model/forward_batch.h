// What one forward pass reads and writes, as plain data: the sequences of the batch (which state
// rows and KV blocks each one uses), the state pools themselves, and the logits that come back (plus,
// for speculative decoding, what the draft and commit steps after it read).
// The model never allocates or frees any of it: whoever calls forward (the engine's scheduler and
// model runner, or a tool running one sequence) owns the accounting.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "core/tensor.h"

namespace sparkserve {

struct MultimodalPrompt;  // model/multimodal.h

// One sequence's part of a forward batch: `tokens` continue the sequence at position start_pos.
struct ForwardSeq {
  int32_t gdn_slot = -1;                   // row of the GDN state pools holding its state
  std::span<const int32_t> block_table;    // KV blocks covering positions [0, start_pos + tokens.size())
  int64_t start_pos = 0;                   // tokens already held in its state and KV blocks
  std::span<const int32_t> tokens;         // the new tokens (a prefill chunk, a decode token, ...)
  // Logits rows wanted for the LAST num_logits new tokens: 1 to sample the next token, 0 for a
  // prefill chunk short of the prompt's end, tokens.size() for teacher forcing or a verify step.
  int64_t num_logits = 1;
  // The prompt's images and M-RoPE positions, for the chunks of a prompt with images (the images are
  // encoded by the first forward that sees them). Tokens at or past mm->length, and every token when
  // mm is null, sit at rotary position index + rope_delta.
  MultimodalPrompt* mm = nullptr;
  int64_t rope_delta = 0;  // the sequence's M-RoPE offset (mm->rope_delta once its prompt had images)
  // > 0: the caller needs only the greedy choice over the first argmax_vocab columns (at most all) of this
  // sequence's logits rows (Backend::argmax, taken where the logits are); 0: the whole rows. A
  // served greedy step then downloads a few ids instead of [rows, vocab] floats.
  int64_t argmax_vocab = 0;
  // With argmax_vocab: columns that never win (the request's stop ids while min_tokens is not
  // reached; at most kArgmaxMaxExcluded), as the sampler masks them. Must outlive the forward.
  std::span<const int32_t> argmax_excluded;
  // With argmax_vocab and draw.temperature > 0: one draw from the sampler's truncated distribution
  // (Backend::draw) instead of the argmax.
  RowDraw draw;
  // A speculative verify span (the sequence's next token and the drafts after it, num_logits =
  // tokens.size()): its GDN state is read but not advanced (Backend::gdn_verify: the decode form from
  // the live row, which it never writes), and the forward's SpecCapture keeps what
  // Qwen35Model::commit_speculative needs to advance it by the accepted prefix afterwards. Keys and
  // values are written as for any span; those past the accepted prefix are rewritten by later steps.
  bool speculative = false;
  // State saves inside this span (GdnStateSave, backend/ops.h: one forward both runs a prompt chunk
  // and saves the states at positions inside it), ascending by `tokens`, into rows >=
  // StatePools::num_slots (none for a speculative span).
  std::span<const GdnStateSave> saves{};
};

// What a forward keeps for speculative decoding (Qwen35Model::forward's optional output): the inputs of
// the multi-token-prediction pass and of the GDN commit that follow acceptance. The tensors are views,
// valid until the model's next forward: into `storage` (a forward run op by op) or into the model's
// own buffers (a recorded step).
struct SpecCapture {
  Tensor hidden;  // [T, H] f32: the final-normalised hidden row of every token of the batch
  // The speculative spans in batch order: row_begin indexes the stash rows below, gdn_slot is the
  // sequence's live state row; seq[i] is the span's index in the forward's batch.
  std::vector<SeqSpan> spans;
  std::vector<int64_t> seq;
  // Per GDN layer, the stash rows (every speculative span's tokens, maybe other rows too): conv inputs
  // [rows, conv_dim] and gates g, beta [rows, Hv].
  std::vector<Tensor> mixed, g, beta;
  std::vector<Buffer> storage;
};

// Logits rows in batch order: for each sequence, its num_logits rows in position order.
struct Logits {
  int64_t rows = 0;
  int64_t vocab = 0;
  std::vector<float> data;        // [rows whose values came back, vocab]
  std::vector<int64_t> data_row;  // [rows]: row r's place in data, -1 where only its argmax came back;
                                  // empty: every row is in data, in order
  std::vector<RowArgmax> argmax;  // [rows] when some row asked for argmax_vocab, else empty
  bool has_values(int64_t r) const { return data_row.empty() || data_row[static_cast<size_t>(r)] >= 0; }
  const float* row(int64_t r) const {
    return data.data() + (data_row.empty() ? r : data_row[static_cast<size_t>(r)]) * vocab;
  }
};

// The state pools a forward reads and writes (views; the owner keeps the memory).
//   kv[i]:        attention layer i's paged KV pool [num_blocks, block_size, kv_heads, head_dim]
//                 (f32, bf16 or fp8 with per-row scales: KvPool in backend/ops.h)
//   conv[i]:      GDN layer i's conv state [rows, conv_dim, K-1]
//   recurrent[i]: GDN layer i's recurrent state [rows, Hv, dk, dv]
// Rows [0, num_slots) of the GDN pools are the state of running sequences; an owner may keep more
// rows after them (e.g. prefix-cache snapshots) that a forward writes only as a span's saves.
struct StatePools {
  int64_t block_size = 0;
  int64_t num_slots = 0;
  std::vector<KvPool> kv;
  std::vector<Tensor> conv, recurrent;
  // The multi-token-prediction layer's own paged KV pool, indexed by the same block tables as kv
  // (position p holds the MTP row of position p); no tensors when the model runs without its MTP layer.
  KvPool mtp_kv;
};

}  // namespace sparkserve
