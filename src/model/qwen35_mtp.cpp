// Speculative decoding on the Qwen3.5 model: the multi-token-prediction (MTP) layer's forward and the
// GDN commit after a verify step (model-qwen35.md §2.9). Written against the backend ops like the rest
// of the model; Qwen35Model::forward (qwen35.cpp) runs the verify step itself.
#include <algorithm>
#include <chrono>
#include <string>

#include "model/qwen35.h"
#include "model/qwen35_layout.h"

namespace sparkserve {

Status Qwen35Model::commit_speculative(const SpecCapture& capture, std::span<const int64_t> accepted,
                                       const StatePools& state) {
  // The accepted prefix of each captured span, as a decode-form layout over the stash rows (a span
  // accepting nothing stays, with no tokens: its state is left as it is).
  BatchLayout commit;
  bool any = false;
  for (size_t i = 0; i < capture.spans.size(); ++i) {
    const auto s = static_cast<size_t>(capture.seq[i]);
    if (s >= accepted.size()) return make_error("commit_speculative: no accepted count for sequence " + std::to_string(s));
    const int64_t m = accepted[s];
    if (m < 0 || m > capture.spans[i].num_tokens)
      return make_error("commit_speculative: sequence " + std::to_string(s) + " accepts " + std::to_string(m) +
                        " of " + std::to_string(capture.spans[i].num_tokens) + " tokens");
    SeqSpan span = capture.spans[i];
    span.num_tokens = m;
    span.block_table = nullptr;  // the GDN ops read no KV blocks (and the table may have moved since)
    span.num_blocks = 0;
    commit.seqs.push_back(span);
    any = any || m > 0;
  }
  if (!any || capture.mixed.empty()) return Status::Ok();
  const GdnDims dims = gdn_dims(config_);
  const int64_t Ts = capture.mixed[0].dim(0), S = static_cast<int64_t>(commit.seqs.size());
  commit.total_rows = Ts;
  // The same ops, on the same rows, as decoding the accepted tokens one by one: gdn_conv folds their
  // conv inputs into the conv state, gdn_recurrent their delta steps into the recurrent state.
  auto run = [&] {
    Buffer qkv = buffer({Ts, dims.conv_dim()}), core = buffer({Ts, dims.num_v_heads, dims.v_head_dim});
    int gdn = 0;
    for (size_t l = 0; l < w_.layers.size(); ++l) {
      if (w_.layers[l].type != LayerType::kLinearAttention) continue;
      const auto i = static_cast<size_t>(gdn++);
      backend_.gdn_conv(qkv, capture.mixed[i], w_.layers[l].gdn.conv, state.conv[i], commit);
      backend_.gdn_recurrent(core, qkv, capture.g[i], capture.beta[i], state.recurrent[i], commit, dims);
    }
  };
  // The stash of a recorded verify step (the model's own buffers) is at fixed addresses: record the
  // commit too, per span count and stash rows.
  const bool recorded_stash = graphs_enabled_ && backend_.can_record() && !storage_.mixed.empty() &&
                              capture.mixed[0].data == storage_.mixed[0].tensor().data &&
                              state_key(state) == graph_state_key_;
  if (!recorded_stash) {
    run();
    return Status::Ok();
  }
  std::unique_ptr<CommitGraph>& g = commit_graphs_[{S, Ts}];
  if (!g) {
    g = std::make_unique<CommitGraph>();  // first sight: op by op
    run();
    return Status::Ok();
  }
  const int64_t n = backend_.layout_words(S, Ts, 0);
  const bool record = !g->recording;
  if (record) {
    g->words = buffer({n}, DType::kI32);
    g->staging.assign(static_cast<size_t>(n), 0);
  }
  backend_.pack_layout(commit, 0, g->staging.data());
  backend_.upload(g->words, g->staging.data());
  if (record) {
    backend_.set_fixed_layout(g->words, commit, 0, 0);
    g->recording = record_step(run, "commit spans=" + std::to_string(S) + " rows=" + std::to_string(Ts));
    if (!g->recording) {
      run();  // recording failed: graphs are off now; the stash is freed after this commit's ops
      drop_graphs();
      return Status::Ok();
    }
  }
  g->recording->replay();
  ++graph_stats_.replayed;
  return Status::Ok();
}

void Qwen35Model::mtp_layer(const Tensor& out, const Tensor& tok, const Tensor& hidden, const Tensor& interleave,
                            const Layout& layout, const StatePools& state) {
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
  Buffer cat = buffer({R, 2 * H});
  backend_.gather_rows_at(cat.tensor().view({2 * R, H}), both, interleave);
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
  const int64_t H = c.hidden_size, V = c.vocab_size;
  if (!w_.mtp.present) return make_error("the model was loaded without its multi-token-prediction layer");
  if (!state.mtp_kv.k.data) return make_error("the state has no KV pool for the multi-token-prediction layer");
  // Validate everything before touching any state.
  std::vector<int64_t> draft_row(seqs.size());
  for (size_t s = 0; s < seqs.size(); ++s) {
    const DraftSeq& q = seqs[s];
    const auto rows = static_cast<int64_t>(q.next_tokens.size());
    if (rows == 0) return make_error("draft sequence " + std::to_string(s) + " has no rows");
    if (q.num_drafts < 0) return make_error("draft sequence " + std::to_string(s) + ": negative draft count");
    if (q.draft_row < -1 || q.draft_row >= rows)
      return make_error("draft sequence " + std::to_string(s) + ": draft row " + std::to_string(q.draft_row) +
                        " is not one of its " + std::to_string(rows) + " rows");
    draft_row[s] = q.draft_row < 0 ? rows - 1 : q.draft_row;
    if (q.hidden_row < 0 || q.hidden_row + rows > hidden.dim(0))
      return make_error("draft sequence " + std::to_string(s) + ": hidden rows out of range");
    const int64_t end = q.start_pos + std::max(rows, draft_row[s] + q.num_drafts);
    if (static_cast<int64_t>(q.block_table.size()) * state.block_size < end)
      return make_error("draft sequence " + std::to_string(s) + ": its " + std::to_string(q.block_table.size()) +
                        " KV blocks do not cover position " + std::to_string(end - 1));
    for (int32_t id : q.next_tokens)
      if (id < 0 || id >= c.vocab_size)
        return make_error("token id " + std::to_string(id) + " is out of range [0, " + std::to_string(c.vocab_size) + ")");
  }
  DraftResult result;
  result.drafts.resize(seqs.size());
  result.logits.vocab = V;
  if (seqs.empty()) return result;
  // Passes are recorded against the state pools (and shared buffers) of the recorded steps.
  const bool can_record = graphs_enabled_ && backend_.can_record() && state_key(state) == graph_state_key_;

  // Each pass: rows of `in` (one ForwardSeq per sequence taking part) with their hidden rows, and the
  // drafting rows: a sequence's draft row (or all its rows, with all_logits); their MTP output is
  // what the next pass continues (`carried`, in drafting-row order).
  std::vector<std::vector<float>> kept(seqs.size());  // all_logits rows per sequence
  std::vector<int64_t> carried_row(seqs.size(), -1);   // each sequence's row of `carried`
  Buffer carried_own, logits_own;                      // when the shared buffers are too small
  Tensor carried;
  // A gather source in the shared buffers is taken whole, so that a recording's bound on its rows
  // holds for every replay.
  auto whole = [&](const Tensor& t, const Buffer& shared) { return t.data == shared.tensor().data ? shared.tensor() : t; };
  for (int64_t step = 0;; ++step) {
    const auto pass_start = std::chrono::steady_clock::now();
    std::vector<ForwardSeq> in;
    std::vector<size_t> who;
    std::vector<int32_t> source, drafting;  // per row: its hidden row; rows whose output drafts
    std::vector<int64_t> draft_of;          // per sequence of `in`: its drafting row's index in `drafting`
    int32_t first = 0;                      // the sequence's first row
    for (size_t s = 0; s < seqs.size(); ++s) {
      const DraftSeq& q = seqs[s];
      const auto rows = static_cast<int64_t>(q.next_tokens.size());
      ForwardSeq f;
      f.gdn_slot = 0;  // the MTP layer has no GDN state
      f.block_table = q.block_table;
      f.mm = q.mm;
      f.rope_delta = q.rope_delta;
      f.num_logits = 0;  // drafting rows are picked below
      if (step == 0) {
        f.start_pos = q.start_pos;
        f.tokens = q.next_tokens;
        for (int64_t r = 0; r < rows; ++r) source.push_back(static_cast<int32_t>(q.hidden_row + r));
        if (q.all_logits) {
          for (int64_t r = 0; r < rows; ++r) drafting.push_back(first + static_cast<int32_t>(r));
          draft_of.push_back(static_cast<int64_t>(drafting.size()) - rows + draft_row[s]);
        } else if (q.num_drafts > 0) {
          drafting.push_back(first + static_cast<int32_t>(draft_row[s]));
          draft_of.push_back(static_cast<int64_t>(drafting.size()) - 1);
        } else {
          draft_of.push_back(-1);
        }
      } else {
        if (q.num_drafts <= step) continue;
        // Draft `step` (0-based) came from the previous pass; it is this pass's token.
        f.start_pos = q.start_pos + draft_row[s] + step;
        f.tokens = std::span<const int32_t>(result.drafts[s]).subspan(static_cast<size_t>(step - 1), 1);
        source.push_back(static_cast<int32_t>(carried_row[s]));
        drafting.push_back(first);
        draft_of.push_back(static_cast<int64_t>(drafting.size()) - 1);
      }
      in.push_back(f);
      who.push_back(s);
      first += static_cast<int32_t>(f.tokens.size());
    }
    if (in.empty()) break;
    Layout layout;
    std::vector<int32_t> ids, pos, pos3;
    std::vector<int64_t> logit_rows;
    std::vector<ArgmaxWant> row_argmax;  // unused: num_logits is 0 (drafting rows above)
    make_layout(in, /*with_images=*/false, layout, ids, pos, pos3, logit_rows, row_argmax);
    const auto R = static_cast<int64_t>(ids.size()), L = static_cast<int64_t>(drafting.size());
    const Tensor src = step == 0 ? whole(hidden, storage_.hidden) : whole(carried, storage_.carried);
    // Shared buffers when they are big enough (then a pass can be recorded), else the pass's own.
    const bool shared = storage_.rows >= std::max(R, L) && storage_.carried.tensor().data;
    if (!shared && !carried_own.tensor().data) {
      int64_t most = 0;
      for (const DraftSeq& q : seqs) most += std::max<int64_t>(static_cast<int64_t>(q.next_tokens.size()), 1);
      carried_own = buffer({most, H});
      logits_own = buffer({most, V});
    }
    const Tensor out_rows = (shared ? storage_.carried : carried_own).tensor().rows(0, L);
    const Tensor logits = (shared ? storage_.logits : logits_own).tensor().rows(0, L);
    // The inputs as one i32 array: ids | positions | source rows | fc interleave | drafting rows.
    std::vector<int32_t> words(ids);
    words.insert(words.end(), pos.begin(), pos.end());
    words.insert(words.end(), source.begin(), source.end());
    for (int64_t r = 0; r < R; ++r) words.insert(words.end(), {static_cast<int32_t>(r), static_cast<int32_t>(R + r)});
    words.insert(words.end(), drafting.begin(), drafting.end());
    const int64_t n_in = static_cast<int64_t>(words.size());
    auto body = [&](const Tensor& inputs, const Layout& lay) {
      const Tensor tok = inputs.rows(0, R), src_rows = inputs.rows(2 * R, R), interleave = inputs.rows(3 * R, 2 * R);
      const Tensor drafting_rows = inputs.rows(5 * R, L);
      Buffer h_in = buffer({R, H}), out = buffer({R, H});
      backend_.gather_rows_at(h_in, src, src_rows);
      mtp_layer(out, tok, h_in, interleave, lay, state);
      if (L == 0) return;
      backend_.gather_rows_at(out_rows, out, drafting_rows);
      backend_.linear(logits, out_rows, w_.lm_head);
    };
    // A pass continuing a recorded step's hidden rows, or the previous pass's shared rows, replays a
    // recording of its shape.
    const int64_t source_kind = step == 0 ? 0 : 1;
    const bool recordable = shared && can_record && !layout.mrope &&
                            src.data == (step == 0 ? storage_.hidden : storage_.carried).tensor().data;
    DraftGraph* g = nullptr;
    if (recordable) {
      int64_t longest = 0;
      for (const SeqSpan& sp : layout.all.seqs) longest = std::max(longest, sp.num_tokens);
      std::unique_ptr<DraftGraph>& slot = draft_graphs_[{source_kind, static_cast<int64_t>(in.size()), R, L, longest}];
      if (slot) g = slot.get();
      else slot = std::make_unique<DraftGraph>();  // first sight: op by op
    }
    if (g) {
      int64_t need_blocks = 1;
      for (const SeqSpan& sp : layout.all.seqs) need_blocks = std::max(need_blocks, sp.num_blocks);
      const int64_t spans = static_cast<int64_t>(layout.all.seqs.size());
      const bool record = !g->recording || need_blocks > g->max_blocks;
      if (record) {
        int64_t cap = 16;
        while (cap < need_blocks) cap *= 2;
        g->recording.reset();
        g->max_blocks = cap;
        g->inputs = buffer({n_in + backend_.layout_words(spans, R, cap)}, DType::kI32);
        g->staging.assign(static_cast<size_t>(g->inputs.tensor().numel()), 0);
      }
      std::copy(words.begin(), words.end(), g->staging.begin());
      backend_.pack_layout(layout.all, g->max_blocks, g->staging.data() + n_in);
      backend_.upload(g->inputs, g->staging.data());
      if (record) {
        const Tensor& inputs = g->inputs.tensor();
        Layout fixed;
        fixed.all = layout.all;
        fixed.positions = inputs.rows(R, R);
        const Tensor packed = inputs.rows(n_in, inputs.numel() - n_in);
        backend_.set_fixed_layout(packed, layout.all, g->max_blocks, g->max_blocks * state.block_size);
        g->recording = record_step([&] { body(inputs, fixed); },
                                   "MTP pass spans=" + std::to_string(in.size()) + " rows=" + std::to_string(R));
      }
      if (g->recording) {
        g->recording->replay();
        ++graph_stats_.replayed;
      } else {
        g = nullptr;  // recording failed (graphs are off now): this pass op by op
      }
    }
    if (!g) {
      Buffer inputs = buffer({n_in}, DType::kI32);
      backend_.upload(inputs, words.data());
      layout.positions = inputs.tensor().rows(R, R);
      if (layout.mrope) upload_positions(layout, pos, pos3);
      body(inputs, layout);
    }
    auto pass_done = [&] {
      result.pass_ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pass_start).count());
    };
    if (L == 0) {
      pass_done();
      break;
    }
    // A non-finite draft row still names a token: the verify step samples the target, never the draft.
    std::vector<RowArgmax> best = backend_.argmax(logits, V, {});
    bool any_all = false;
    for (size_t i = 0; i < in.size(); ++i) any_all = any_all || seqs[who[i]].all_logits;
    Logits host;
    if (any_all) host = download_logits(logits);
    bool more = false;
    for (size_t i = 0; i < in.size(); ++i) {
      const size_t s = who[i];
      if (seqs[s].all_logits) {
        // This sequence's drafting rows: all its rows at step 0, one after.
        const int64_t n = step == 0 ? static_cast<int64_t>(in[i].tokens.size()) : 1;
        const int64_t at = step == 0 ? draft_of[i] - draft_row[s] : draft_of[i];
        kept[s].insert(kept[s].end(), host.row(at), host.row(at + n - 1) + V);
      }
      if (draft_of[i] < 0 || seqs[s].num_drafts <= step) continue;
      result.drafts[s].push_back(best[static_cast<size_t>(draft_of[i])].id);
      carried_row[s] = draft_of[i];
      more = more || seqs[s].num_drafts > step + 1;
    }
    pass_done();
    if (!more) break;
    // The next pass gathers its hidden rows from these before it writes its own over them.
    carried = out_rows;
  }
  for (const auto& k : kept) {
    result.logits.data.insert(result.logits.data.end(), k.begin(), k.end());
    result.logits.rows += static_cast<int64_t>(k.size()) / V;
  }
  return result;
}

}  // namespace sparkserve
