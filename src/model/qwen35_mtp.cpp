// Speculative decoding on the Qwen3.5 model: the multi-token-prediction (MTP) layer's forward and the
// GDN commit after a verify step (model-qwen35.md §2.9). Written against the backend ops like the rest
// of the model; Qwen35Model::forward (qwen35.cpp) runs the verify step itself.
#include <algorithm>
#include <string>

#include "model/qwen35.h"
#include "model/qwen35_layout.h"

namespace sparkserve {

Status Qwen35Model::commit_speculative(const SpecCapture& capture, std::span<const int64_t> accepted,
                                       const StatePools& state) {
  // The accepted prefix of each captured span, as a decode-form layout over the stash rows.
  BatchLayout commit;
  for (size_t i = 0; i < capture.spans.size(); ++i) {
    const auto s = static_cast<size_t>(capture.seq[i]);
    if (s >= accepted.size()) return make_error("commit_speculative: no accepted count for sequence " + std::to_string(s));
    const int64_t m = accepted[s];
    if (m < 0 || m > capture.spans[i].num_tokens)
      return make_error("commit_speculative: sequence " + std::to_string(s) + " accepts " + std::to_string(m) +
                        " of " + std::to_string(capture.spans[i].num_tokens) + " tokens");
    if (m == 0) continue;
    SeqSpan span = capture.spans[i];
    span.num_tokens = m;
    commit.seqs.push_back(span);
  }
  if (commit.seqs.empty() || capture.mixed.empty()) return Status::Ok();
  const GdnDims dims = gdn_dims(config_);
  const int64_t Ts = capture.mixed[0].tensor().dim(0);
  commit.total_rows = Ts;
  // The same ops, on the same rows, as decoding the accepted tokens one by one: gdn_conv folds their
  // conv inputs into the conv state, gdn_recurrent their delta steps into the recurrent state.
  Buffer qkv = buffer({Ts, dims.conv_dim()}), core = buffer({Ts, dims.num_v_heads, dims.v_head_dim});
  int gdn = 0;
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    if (w_.layers[l].type != LayerType::kLinearAttention) continue;
    const auto i = static_cast<size_t>(gdn++);
    backend_.gdn_conv(qkv, capture.mixed[i], w_.layers[l].gdn.conv, state.conv[i], commit);
    backend_.gdn_recurrent(core, qkv, capture.g[i], capture.beta[i], state.recurrent[i], commit, dims);
  }
  return Status::Ok();
}

void Qwen35Model::mtp_layer(const Tensor& out, const Tensor& tok, const Tensor& hidden, const Layout& layout,
                            const StatePools& state) {
  const ModelConfig& c = config_;
  const MtpWeights& m = w_.mtp;
  const LayerWeights& lw = m.layer;
  const int64_t R = tok.numel(), H = c.hidden_size;
  // fc over [norm(embedding(tok)) ; norm(hidden)]: both halves as rows of one [2R, H] buffer, then one
  // gather interleaves them into the [R, 2H] rows fc reads (row r = embedding r, then hidden r).
  Buffer both = buffer({2 * R, H});
  const Tensor emb = both.tensor().rows(0, R), hid = both.tensor().rows(R, R);
  backend_.embedding(emb, tok, w_.embed);
  backend_.rmsnorm(emb, emb, m.pre_fc_norm_embedding, c.rms_norm_eps);
  backend_.rmsnorm(hid, hidden, m.pre_fc_norm_hidden, c.rms_norm_eps);
  std::vector<int64_t> interleave;
  for (int64_t r = 0; r < R; ++r) interleave.insert(interleave.end(), {r, R + r});
  Buffer cat = buffer({R, 2 * H});
  backend_.gather_rows(cat.tensor().view({2 * R, H}), both, interleave);
  // The decoder layer (pre-norm, two residual steps) with the MTP's final norm after it.
  Buffer x = buffer({R, H}), d = buffer({R, H});
  backend_.linear(x, cat, m.fc);
  backend_.rmsnorm(out, x, lw.input_norm, c.rms_norm_eps);
  attention_layer(d, out, lw, layout, state.mtp_kv, state.block_size);
  backend_.add_rmsnorm(x, out, d, lw.post_attention_norm, c.rms_norm_eps);
  if (c.is_moe) {
    moe(d, out, lw.moe, x, m.norm);
  } else {
    mlp(d, out, lw.mlp);
    backend_.add_rmsnorm(x, out, d, m.norm, c.rms_norm_eps);
  }
}

Expected<Qwen35Model::DraftResult> Qwen35Model::draft(std::span<const DraftSeq> seqs, const Tensor& hidden,
                                                      const StatePools& state) {
  const ModelConfig& c = config_;
  const int64_t H = c.hidden_size;
  if (!w_.mtp.present) return make_error("the model was loaded without its multi-token-prediction layer");
  if (!state.mtp_kv.k.data) return make_error("the state has no KV pool for the multi-token-prediction layer");
  // Validate everything before touching any state.
  for (size_t s = 0; s < seqs.size(); ++s) {
    const DraftSeq& q = seqs[s];
    const auto rows = static_cast<int64_t>(q.next_tokens.size());
    if (rows == 0) return make_error("draft sequence " + std::to_string(s) + " has no rows");
    if (q.num_drafts < 0) return make_error("draft sequence " + std::to_string(s) + ": negative draft count");
    if (q.hidden_row < 0 || q.hidden_row + rows > hidden.dim(0))
      return make_error("draft sequence " + std::to_string(s) + ": hidden rows out of range");
    const int64_t end = q.start_pos + rows + std::max<int64_t>(q.num_drafts - 1, 0);
    if (static_cast<int64_t>(q.block_table.size()) * state.block_size < end)
      return make_error("draft sequence " + std::to_string(s) + ": its " + std::to_string(q.block_table.size()) +
                        " KV blocks do not cover position " + std::to_string(end - 1));
    for (int32_t id : q.next_tokens)
      if (id < 0 || id >= c.vocab_size)
        return make_error("token id " + std::to_string(id) + " is out of range [0, " + std::to_string(c.vocab_size) + ")");
  }
  DraftResult result;
  result.drafts.resize(seqs.size());
  result.logits.vocab = c.vocab_size;
  if (seqs.empty()) return result;

  // Each pass: rows of `in` (one ForwardSeq per sequence taking part), their hidden rows, and the
  // sequences whose last row proposes a draft (logits rows, argmax).
  std::vector<std::vector<float>> kept(seqs.size());  // all_logits rows per sequence
  Buffer carried;                                      // the previous pass's MTP output rows, [B, H]
  std::vector<size_t> carried_seq;                     // which sequence each carried row belongs to
  for (int64_t step = 0;; ++step) {
    std::vector<ForwardSeq> in;
    std::vector<size_t> who;
    std::vector<int64_t> source;  // per row: its hidden row (of `hidden` at step 0, of `carried` after)
    for (size_t s = 0; s < seqs.size(); ++s) {
      const DraftSeq& q = seqs[s];
      const auto rows = static_cast<int64_t>(q.next_tokens.size());
      ForwardSeq f;
      f.gdn_slot = 0;  // the MTP layer has no GDN state
      f.block_table = q.block_table;
      f.mm = q.mm;
      f.rope_delta = q.rope_delta;
      if (step == 0) {
        f.start_pos = q.start_pos;
        f.tokens = q.next_tokens;
        f.num_logits = q.all_logits ? rows : (q.num_drafts > 0 ? 1 : 0);
        for (int64_t r = 0; r < rows; ++r) source.push_back(q.hidden_row + r);
      } else {
        if (q.num_drafts <= step) continue;
        // Draft `step` (0-based) came from the previous pass; it is this pass's token.
        f.start_pos = q.start_pos + rows - 1 + step;
        f.tokens = std::span<const int32_t>(result.drafts[s]).subspan(static_cast<size_t>(step - 1), 1);
        f.num_logits = 1;
        source.push_back(static_cast<int64_t>(std::find(carried_seq.begin(), carried_seq.end(), s) - carried_seq.begin()));
      }
      in.push_back(f);
      who.push_back(s);
    }
    if (in.empty()) break;
    Layout layout;
    std::vector<int32_t> ids, pos, pos3;
    std::vector<int64_t> logit_rows;
    std::vector<ArgmaxWant> row_argmax;  // unused: the drafts' argmax is taken below
    make_layout(in, /*with_images=*/false, layout, ids, pos, pos3, logit_rows, row_argmax);
    upload_positions(layout, pos, pos3);
    const auto R = static_cast<int64_t>(ids.size());
    Buffer tok = buffer({R}, DType::kI32);
    backend_.upload(tok, ids.data());
    Buffer h_in = buffer({R, H}), out = buffer({R, H});
    backend_.gather_rows(h_in, step == 0 ? hidden : carried.tensor(), source);
    mtp_layer(out, tok, h_in, layout, state);
    if (logit_rows.empty()) break;
    Buffer rows_h = buffer({static_cast<int64_t>(logit_rows.size()), H});
    backend_.gather_rows(rows_h, out, logit_rows);
    Buffer logits = buffer({rows_h.tensor().dim(0), c.vocab_size});
    backend_.linear(logits, rows_h, w_.lm_head);
    // A non-finite draft row still names a token: the verify step samples the target, never the draft.
    std::vector<int32_t> best;
    for (const RowArgmax& a : backend_.argmax(logits, c.vocab_size, {})) best.push_back(a.id);
    bool any_all = false;
    for (size_t i = 0; i < in.size(); ++i) any_all = any_all || seqs[who[i]].all_logits;
    Logits host;
    if (any_all) host = download_logits(logits);
    // The logits rows of each sequence are consecutive, in batch order; the last one drafts.
    std::vector<int64_t> next_rows;
    std::vector<size_t> next_seq;
    size_t at = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const size_t s = who[i];
      const auto n = static_cast<size_t>(in[i].num_logits);
      if (seqs[s].all_logits)
        kept[s].insert(kept[s].end(), host.row(static_cast<int64_t>(at)),
                       host.row(static_cast<int64_t>(at + n - 1)) + c.vocab_size);
      if (n > 0 && seqs[s].num_drafts > step) {
        result.drafts[s].push_back(best[at + n - 1]);
        next_rows.push_back(logit_rows[at + n - 1]);
        next_seq.push_back(s);
      }
      at += n;
    }
    if (next_rows.empty()) break;
    carried = buffer({static_cast<int64_t>(next_rows.size()), H});
    backend_.gather_rows(carried, out, next_rows);
    carried_seq = std::move(next_seq);
  }
  for (const auto& k : kept) {
    result.logits.data.insert(result.logits.data.end(), k.begin(), k.end());
    result.logits.rows += static_cast<int64_t>(k.size()) / c.vocab_size;
  }
  return result;
}

}  // namespace sparkserve
