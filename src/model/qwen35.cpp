#include "model/qwen35.h"

#include "model/qwen35_layout.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

namespace sparkserve {

// One recorded step of a batch of decode and verify spans (StepKey: B spans, Bv of them verify spans,
// T rows, the longest span). Its inputs live in one device buffer refreshed by a single host->device
// copy per step: token ids [T] | positions [T] | the packed layouts (all spans; and, when the batch
// mixes both kinds, the decode spans and the verify spans), each with room for max_blocks KV blocks
// per sequence (a longer sequence means recording again).
struct Qwen35Model::StepGraph {
  int64_t max_blocks = 0;
  Buffer inputs;  // i32 [2T + layout words]
  std::vector<int32_t> staging;
  std::unique_ptr<Recording> recording;  // null: the shape was seen once, ran op by op
};

Qwen35Model::Qwen35Model(Backend& backend, ModelConfig config, ModelWeights weights)
    : backend_(backend), config_(std::move(config)), w_(std::move(weights)) {
  int gdn = 0, attn = 0;
  for (LayerType t : config_.layer_types) layer_slot_.push_back(t == LayerType::kLinearAttention ? gdn++ : attn++);
  if (config_.vision.present && w_.vision.present) {
    vision_ = std::make_unique<VisionTower>(backend_, config_.vision, w_.vision);
    // The text M-RoPE as rope_axes tables: pair i takes its angle from the temporal, height or width
    // position (interleaved: H at i % 3 == 1 below 3*section[1], W at i % 3 == 2 below 3*section[2],
    // as transformers' recomposition_frequencies; otherwise consecutive sections T | H | W).
    const int64_t half = config_.rotary_dim() / 2;
    std::vector<int> sec = config_.mrope_section;
    if (sec.size() != 3) sec = {11, 11, 10};  // transformers' default mrope_section
    std::vector<int32_t> axis(static_cast<size_t>(half), 0);
    std::vector<float> inv(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      if (config_.mrope_interleaved) {
        if (i % 3 == 1 && i < 3 * sec[1]) axis[static_cast<size_t>(i)] = 1;
        if (i % 3 == 2 && i < 3 * sec[2]) axis[static_cast<size_t>(i)] = 2;
      } else {
        axis[static_cast<size_t>(i)] = i < sec[0] ? 0 : i < sec[0] + sec[1] ? 1 : 2;
      }
      // As the rope op computes it (backend/cpu/attention.cpp): fp32 theta^(2i / rotary_dim).
      inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(config_.rope_theta),
                                                    static_cast<float>(2 * i) / static_cast<float>(config_.rotary_dim()));
    }
    mrope_axis_ = buffer({half}, DType::kI32);
    mrope_inv_freq_ = buffer({half});
    backend_.upload(mrope_axis_, axis.data());
    backend_.upload(mrope_inv_freq_, inv.data());
  }
}

Status Qwen35Model::encode_images(MultimodalPrompt& mm) {
  if (mm.encoded() || mm.images.empty()) return Status::Ok();
  if (!vision_) return make_error("this model has no vision tower: images cannot be used");
  std::vector<const media::PatchedImage*> imgs;
  for (const auto& img : mm.images) imgs.push_back(&img);
  SS_ASSIGN_OR_RETURN(mm.embeddings, vision_->encode(imgs));
  if (mm.embeddings.tensor().dim(0) != static_cast<int64_t>(std::count_if(
                                           mm.embed_row.begin(), mm.embed_row.end(), [](int64_t r) { return r >= 0; })))
    return make_error("the vision tower's token count differs from the prompt's image tokens");
  mm.images.clear();
  mm.images.shrink_to_fit();
  return Status::Ok();
}

Qwen35Model::~Qwen35Model() = default;

void Qwen35Model::set_graphs_enabled(bool on) {
  graphs_enabled_ = on;
  if (!on) drop_graphs();
}

void Qwen35Model::drop_graphs() {
  graphs_.clear();  // each recording waits for its queued replays
  commit_graphs_.clear();
  draft_graphs_.clear();
  storage_ = StepStorage();
  graph_state_key_.clear();
}

GdnDims gdn_dims(const ModelConfig& c) {
  GdnDims d;
  d.num_k_heads = c.linear_num_key_heads;
  d.num_v_heads = c.linear_num_value_heads;
  d.k_head_dim = c.linear_key_head_dim;
  d.v_head_dim = c.linear_value_head_dim;
  d.conv_kernel = c.linear_conv_kernel_dim;
  return d;
}

int count_layers(const ModelConfig& c, LayerType type) {
  int n = 0;
  for (LayerType t : c.layer_types) n += t == type;
  return n;
}

void Qwen35Model::make_layout(std::span<const ForwardSeq> batch, bool with_images, Layout& layout,
                              std::vector<int32_t>& ids, std::vector<int32_t>& pos, std::vector<int32_t>& pos3,
                              std::vector<int64_t>& logit_rows, std::vector<ArgmaxWant>& row_argmax) {
  for (const ForwardSeq& in : batch) {
    const int64_t rope_delta = in.mm ? in.mm->rope_delta : in.rope_delta;
    Layout::ImageRows images{in.mm, {}, {}};
    SeqSpan span;
    span.row_begin = static_cast<int64_t>(ids.size());
    span.num_tokens = static_cast<int64_t>(in.tokens.size());
    span.start_pos = in.start_pos;
    span.gdn_slot = in.gdn_slot;
    span.block_table = in.block_table.data();
    span.num_blocks = static_cast<int64_t>(in.block_table.size());
    for (int64_t i = 0; i < span.num_tokens; ++i) {
      ids.push_back(in.tokens[static_cast<size_t>(i)]);
      const int64_t p = span.start_pos + i;
      if (in.mm && p < in.mm->length) {
        const int32_t* thw = &in.mm->positions[static_cast<size_t>(3 * p)];
        pos3.insert(pos3.end(), thw, thw + 3);
        layout.mrope = layout.mrope || thw[1] != thw[0] || thw[2] != thw[0];
        const int64_t e = in.mm->embed_row[static_cast<size_t>(p)];
        if (e >= 0 && with_images) {
          images.rows.push_back(span.row_begin + i);
          images.embed_rows.push_back(e);
        }
      } else {
        const auto q = static_cast<int32_t>(p + rope_delta);
        pos3.insert(pos3.end(), {q, q, q});
      }
      pos.push_back(pos3.back());
      if (i >= span.num_tokens - in.num_logits) {
        logit_rows.push_back(span.row_begin + i);
        row_argmax.push_back({std::min<int64_t>(in.argmax_vocab, config_.vocab_size), in.argmax_excluded, in.draw});
      }
    }
    if (!images.rows.empty()) layout.images.push_back(std::move(images));
    layout.all.seqs.push_back(span);
    if (in.speculative) {
      layout.verify.seqs.push_back(span);
      for (int64_t i = 0; i < span.num_tokens; ++i) layout.verify_rows.push_back(span.row_begin + i);
    } else {
      // Several tokens take the chunked GDN form, one the recurrent form; the GDN ops write the
      // span's saves.
      span.saves = in.saves.data();
      span.num_saves = static_cast<int64_t>(in.saves.size());
      (span.num_tokens > 1 ? layout.prefill : layout.decode).seqs.push_back(span);
      layout.stateful.seqs.push_back(span);
      layout.saves = layout.saves || !in.saves.empty();
    }
  }
  const int64_t T = static_cast<int64_t>(ids.size());
  for (BatchLayout* b : {&layout.all, &layout.prefill, &layout.decode, &layout.stateful, &layout.verify})
    b->total_rows = T;
}

void Qwen35Model::upload_positions(Layout& layout, const std::vector<int32_t>& pos, const std::vector<int32_t>& pos3) {
  const auto T = static_cast<int64_t>(pos.size());
  layout.positions_storage = buffer({T}, DType::kI32);
  layout.positions = layout.positions_storage.tensor();
  backend_.upload(layout.positions, pos.data());
  if (layout.mrope) {
    layout.positions3_storage = buffer({T, 3}, DType::kI32);
    layout.positions3 = layout.positions3_storage.tensor();
    backend_.upload(layout.positions3, pos3.data());
  }
}

namespace {

// A span's state saves (ForwardSeq::saves) are well formed: inside the span, ascending, into
// distinct rows past the live slots.
Status check_saves(const ForwardSeq& in, const StatePools& state, const std::string& who) {
  if (in.saves.empty()) return Status::Ok();
  if (in.speculative) return make_error(who + " is speculative and saves its state");
  const int64_t rows = state.conv.empty() ? 0 : state.conv[0].dim(0);
  int64_t prev = 0;
  for (const GdnStateSave& v : in.saves) {
    if (v.tokens <= prev || v.tokens > static_cast<int64_t>(in.tokens.size()))
      return make_error(who + " saves its state after " + std::to_string(v.tokens) + " of " +
                        std::to_string(in.tokens.size()) + " tokens (saves must ascend, each after a new token)");
    if (v.row < state.num_slots || v.row >= rows)
      return make_error(who + " saves its state into row " + std::to_string(v.row) + ", not a row in [" +
                        std::to_string(state.num_slots) + ", " + std::to_string(rows) + ")");
    for (const GdnStateSave& u : in.saves)
      if (&u != &v && u.row == v.row) return make_error(who + " saves twice into row " + std::to_string(v.row));
    prev = v.tokens;
  }
  return Status::Ok();
}

}  // namespace

Expected<Logits> Qwen35Model::forward(std::span<const ForwardSeq> batch, const StatePools& state,
                                      SpecCapture* capture) {
  const ModelConfig& c = config_;
  // Validate everything before touching any state.
  int64_t T = 0;
  for (size_t s = 0; s < batch.size(); ++s) {
    const ForwardSeq& in = batch[s];
    if (in.gdn_slot < 0 || in.gdn_slot >= state.num_slots)
      return make_error("sequence " + std::to_string(s) + " has no state slot");
    if (in.tokens.empty()) return make_error("sequence " + std::to_string(s) + " has no new tokens");
    if (in.num_logits < 0 || in.num_logits > static_cast<int64_t>(in.tokens.size()))
      return make_error("sequence " + std::to_string(s) + " asks for " + std::to_string(in.num_logits) +
                        " logits rows of " + std::to_string(in.tokens.size()) + " tokens");
    if (in.speculative && !capture)
      return make_error("sequence " + std::to_string(s) + " is speculative but the forward captures nothing");
    if (in.argmax_vocab < 0)
      return make_error("sequence " + std::to_string(s) + " asks for an argmax over " +
                        std::to_string(in.argmax_vocab) + " columns");
    const int64_t end = in.start_pos + static_cast<int64_t>(in.tokens.size());
    if (static_cast<int64_t>(in.block_table.size()) * state.block_size < end)
      return make_error("sequence " + std::to_string(s) + ": its " + std::to_string(in.block_table.size()) +
                        " KV blocks do not cover position " + std::to_string(end - 1));
    for (int32_t id : in.tokens)
      if (id < 0 || id >= c.vocab_size)
        return make_error("token id " + std::to_string(id) + " is out of range [0, " +
                          std::to_string(c.vocab_size) + ")");
    SS_RETURN_IF_ERROR(check_saves(in, state, "sequence " + std::to_string(s)));
    T += static_cast<int64_t>(in.tokens.size());
    if (in.mm) SS_RETURN_IF_ERROR(encode_images(*in.mm));
  }
  if (T == 0) return make_error("empty batch");
  for (size_t s = 0; s < batch.size(); ++s)
    for (size_t r = 0; r < s; ++r) {
      if (batch[s].gdn_slot == batch[r].gdn_slot)
        return make_error("sequences " + std::to_string(r) + " and " + std::to_string(s) + " share one state");
      for (const GdnStateSave& a : batch[s].saves)
        for (const GdnStateSave& b : batch[r].saves)
          if (a.row == b.row)
            return make_error("sequences " + std::to_string(r) + " and " + std::to_string(s) + " save into one row");
    }

  Layout layout;
  std::vector<int32_t> ids, pos, pos3;
  std::vector<int64_t> logit_rows;
  std::vector<ArgmaxWant> row_argmax;
  make_layout(batch, /*with_images=*/true, layout, ids, pos, pos3, logit_rows, row_argmax);
  // Decode and verify spans (every token a logits row; no prefill chunk, no images) can be recorded.
  bool recordable = graphs_enabled_ && backend_.can_record() && layout.prefill.seqs.empty() && !layout.mrope &&
                    layout.images.empty();
  for (const ForwardSeq& in : batch)
    recordable = recordable && in.num_logits == static_cast<int64_t>(in.tokens.size()) && in.saves.empty();
  if (recordable) {
    std::optional<Logits> out = forward_recorded(batch, layout, ids, pos, state, row_argmax, capture);
    if (out) return std::move(*out);
  }

  upload_positions(layout, pos, pos3);
  Buffer tok = buffer({T}, DType::kI32);
  backend_.upload(tok, ids.data());
  Buffer h = buffer({T, c.hidden_size});
  if (capture) {
    *capture = SpecCapture();
    // The stash holds the verify spans' rows only (a prefill chunk in the batch may be long).
    const int64_t Ts = static_cast<int64_t>(layout.verify_rows.size());
    int64_t row = 0;
    for (size_t s = 0; s < batch.size(); ++s) {
      if (!batch[s].speculative) continue;
      SeqSpan span = layout.all.seqs[s];
      span.row_begin = row;
      row += span.num_tokens;
      capture->spans.push_back(span);
      capture->seq.push_back(static_cast<int64_t>(s));
    }
    if (Ts > 0) {
      const GdnDims dims = gdn_dims(c);
      for (int l = 0; l < count_layers(c, LayerType::kLinearAttention); ++l) {
        for (auto [list, width] : {std::pair{&capture->mixed, dims.conv_dim()}, std::pair{&capture->g, dims.num_v_heads},
                                   std::pair{&capture->beta, dims.num_v_heads}}) {
          capture->storage.push_back(buffer({Ts, width}));
          list->push_back(capture->storage.back().tensor());
        }
      }
    }
  }
  capture_ = capture;
  trunk(h, tok, layout, state);
  capture_ = nullptr;
  Logits out{0, c.vocab_size, {}};
  if (!logit_rows.empty()) {
    Buffer last = buffer({static_cast<int64_t>(logit_rows.size()), c.hidden_size});
    backend_.gather_rows(last, h, logit_rows);
    out = lm_head(last, row_argmax);
  }
  if (capture) {
    capture->hidden = h.tensor();
    capture->storage.push_back(std::move(h));
  }
  return out;
}

void Qwen35Model::trunk(const Tensor& h, const Tensor& tok, const Layout& layout, const StatePools& state) {
  const ModelConfig& c = config_;
  const int64_t T = tok.numel(), H = c.hidden_size;
  // Residual stream x, normalised hidden h, block output d.
  Buffer x = buffer({T, H}), d = buffer({T, H});
  if (layout.images.empty()) {
    backend_.embedding(x, tok, w_.embed);
  } else {
    // Image tokens take the vision tower's rows: token embeddings and those rows side by side in one
    // buffer, then one gather puts each row in its place.
    int64_t n = 0;
    for (const auto& im : layout.images) n += static_cast<int64_t>(im.rows.size());
    Buffer both = buffer({T + n, H});
    backend_.embedding(both.tensor().rows(0, T), tok, w_.embed);
    std::vector<int64_t> source(static_cast<size_t>(T));
    for (int64_t t = 0; t < T; ++t) source[static_cast<size_t>(t)] = t;
    int64_t at = T;
    for (const auto& im : layout.images) {
      const auto m = static_cast<int64_t>(im.rows.size());
      backend_.gather_rows(both.tensor().rows(at, m), im.mm->embeddings, im.embed_rows);
      for (int64_t j = 0; j < m; ++j) source[static_cast<size_t>(im.rows[static_cast<size_t>(j)])] = at + j;
      at += m;
    }
    backend_.gather_rows(x, both, source);
  }
  backend_.rmsnorm(h, x, w_.layers[0].input_norm, c.rms_norm_eps);
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    const LayerWeights& lw = w_.layers[l];
    const ResidualStep post{x, h, lw.post_attention_norm};
    if (lw.type == LayerType::kLinearAttention) {
      gdn_layer(d, h, lw, layer_slot_[l], layout, state, &post);
    } else {
      const auto a = static_cast<size_t>(layer_slot_[l]);
      attention_layer(d, h, lw, layout, state.kv[a], state.block_size, &post);
    }
    // h = final norm after the last layer
    const Tensor& next_norm = l + 1 < w_.layers.size() ? w_.layers[l + 1].input_norm : w_.final_norm;
    if (c.is_moe) {
      moe(d, h, lw.moe, x, next_norm);
    } else {
      mlp(d, h, lw.mlp);
      backend_.add_rmsnorm(x, h, d, next_norm, c.rms_norm_eps);
    }
  }
}

std::vector<uintptr_t> Qwen35Model::state_key(const StatePools& state) const {
  const ModelConfig& c = config_;
  std::vector<uintptr_t> key;
  key.push_back(static_cast<uintptr_t>(state.block_size));
  for (size_t l = 0; l < c.layer_types.size(); ++l) {
    const size_t i = static_cast<size_t>(layer_slot_[l]);
    if (c.layer_types[l] == LayerType::kLinearAttention) {
      key.push_back(reinterpret_cast<uintptr_t>(state.conv[i].data));
      key.push_back(reinterpret_cast<uintptr_t>(state.recurrent[i].data));
    } else {
      key.push_back(reinterpret_cast<uintptr_t>(state.kv[i].k.data));
      key.push_back(reinterpret_cast<uintptr_t>(state.kv[i].v.data));
    }
  }
  key.push_back(reinterpret_cast<uintptr_t>(state.mtp_kv.k.data));  // the MTP passes'
  key.push_back(reinterpret_cast<uintptr_t>(state.mtp_kv.v.data));
  return key;
}

void Qwen35Model::reserve_step_storage(int64_t rows, bool stash, int64_t min_rows) {
  const ModelConfig& c = config_;
  const bool grow = storage_.rows < rows, grow_stash = stash && storage_.stash_rows < rows;
  if (!grow && !grow_stash) return;
  // Every recording reads these buffers at fixed addresses.
  graphs_.clear();
  commit_graphs_.clear();
  draft_graphs_.clear();
  if (grow) {
    // At least one row per state slot (any decode batch), doubling so that growing batches record
    // again only a few times.
    storage_.rows = std::max({rows, min_rows, 2 * storage_.rows});
    storage_.logits = buffer({storage_.rows, c.vocab_size});
    storage_.hidden = buffer({storage_.rows, c.hidden_size});
    storage_.carried = buffer({storage_.rows, c.hidden_size});
  }
  if (grow_stash) {
    storage_.stash_rows = std::max(rows, 2 * storage_.stash_rows);
    storage_.mixed.clear();
    storage_.g.clear();
    storage_.beta.clear();
    const GdnDims dims = gdn_dims(c);
    for (int l = 0; l < count_layers(c, LayerType::kLinearAttention); ++l) {
      storage_.mixed.push_back(buffer({storage_.stash_rows, dims.conv_dim()}));
      storage_.g.push_back(buffer({storage_.stash_rows, dims.num_v_heads}));
      storage_.beta.push_back(buffer({storage_.stash_rows, dims.num_v_heads}));
    }
  }
}

void Qwen35Model::stash_views(SpecCapture& c, int64_t rows) const {
  for (size_t i = 0; i < storage_.mixed.size(); ++i) {
    c.mixed.push_back(storage_.mixed[i].tensor().rows(0, rows));
    c.g.push_back(storage_.g[i].tensor().rows(0, rows));
    c.beta.push_back(storage_.beta[i].tensor().rows(0, rows));
  }
}

std::unique_ptr<Recording> Qwen35Model::record_step(const std::function<void()>& body, const std::string& what) {
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<Recording> r = backend_.record(body);
  backend_.clear_fixed_layout();
  if (!r) {
    // The backend could not record (it said why): op by op from now on (the caller drops the
    // recordings once nothing of theirs is in use).
    graphs_enabled_ = false;
    return nullptr;
  }
  ++graph_stats_.recorded;
  graph_stats_.kernels = r->kernel_nodes();
  if (const char* v = std::getenv("SPARKSERVE_GRAPH_STATS"); v && std::strcmp(v, "1") == 0)
    std::fprintf(stderr, "sparkserve: recorded %s: %lld kernels, fused chains %s\n", what.c_str(),
                 static_cast<long long>(graph_stats_.kernels), fused_ ? "on" : "off");
  graph_stats_.record_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

std::optional<Logits> Qwen35Model::forward_recorded(std::span<const ForwardSeq> batch, const Layout& layout,
                                                    const std::vector<int32_t>& ids, const std::vector<int32_t>& pos,
                                                    const StatePools& state, const std::vector<ArgmaxWant>& row_argmax,
                                                    SpecCapture* capture) {
  const int64_t B = static_cast<int64_t>(layout.all.seqs.size()), T = static_cast<int64_t>(ids.size());
  const int64_t Bv = static_cast<int64_t>(layout.verify.seqs.size()), Bd = B - Bv;
  int64_t longest = 0;
  for (const SeqSpan& s : layout.all.seqs) longest = std::max(longest, s.num_tokens);

  // A recording writes the state pools it was recorded with: other pools mean recording again.
  std::vector<uintptr_t> key = state_key(state);
  if (key != graph_state_key_) {
    drop_graphs();
    graph_state_key_ = std::move(key);
  }
  reserve_step_storage(T, Bv > 0, state.num_slots);

  std::unique_ptr<StepGraph>& g = graphs_[StepKey{B, Bv, T, longest}];
  if (!g) {
    // First sight of this shape: run it op by op, which also loads every kernel this shape uses and
    // fills the backend's host-computed tables before anything is recorded.
    g = std::make_unique<StepGraph>();
    return std::nullopt;
  }
  int64_t need_blocks = 1;
  for (const SeqSpan& s : layout.all.seqs) need_blocks = std::max(need_blocks, s.num_blocks);
  const bool record = !g->recording || need_blocks > g->max_blocks;
  // The layouts the state ops read: all spans; the decode and the verify spans apart only when the
  // batch has both (else each equals the whole batch's).
  const bool mixed = Bd > 0 && Bv > 0;
  std::vector<const BatchLayout*> packed = {&layout.all};
  if (mixed) packed.insert(packed.end(), {&layout.decode, &layout.verify});
  if (record) {
    // Room for twice the current need (at least 16 blocks), so a growing sequence records again
    // only at each doubling.
    int64_t cap = 16;
    while (cap < need_blocks) cap *= 2;
    g->recording.reset();
    g->max_blocks = cap;
    int64_t words = 2 * T;
    for (const BatchLayout* l : packed) words += backend_.layout_words(static_cast<int64_t>(l->seqs.size()), T, cap);
    g->inputs = buffer({words}, DType::kI32);
    g->staging.assign(static_cast<size_t>(words), 0);
  }
  int32_t* words = g->staging.data();
  std::copy(ids.begin(), ids.end(), words);
  std::copy(pos.begin(), pos.end(), words + T);
  std::vector<int64_t> offset;  // of each packed layout in the inputs
  int64_t at = 2 * T;
  for (const BatchLayout* l : packed) {
    offset.push_back(at);
    backend_.pack_layout(*l, g->max_blocks, words + at);
    at += backend_.layout_words(static_cast<int64_t>(l->seqs.size()), T, g->max_blocks);
  }
  backend_.upload(g->inputs, words);

  const Tensor logits = storage_.logits.tensor().rows(0, T), hidden = storage_.hidden.tensor().rows(0, T);
  if (record) {
    const Tensor& in = g->inputs.tensor();
    const Tensor tok(in.ptr<int32_t>(), DType::kI32, {T}, in.device);
    Layout fixed;
    fixed.all = layout.all;
    fixed.decode = layout.decode;
    fixed.stateful = layout.stateful;
    fixed.verify = layout.verify;
    fixed.prefill.total_rows = T;
    fixed.positions = Tensor(in.ptr<int32_t>() + T, DType::kI32, {T}, in.device);
    for (size_t i = 0; i < packed.size(); ++i) {
      const Tensor w(in.ptr<int32_t>() + offset[i], DType::kI32, {in.numel() - offset[i]}, in.device);
      backend_.set_fixed_layout(w, *packed[i], g->max_blocks, g->max_blocks * state.block_size);
    }
    // The verify spans' GDN inputs go straight into the stash (every row of it is a batch row).
    SpecCapture stash;
    stash_views(stash, T);
    capture_ = Bv > 0 ? &stash : nullptr;
    g->recording = record_step(
        [&] {
          trunk(hidden, tok, fixed, state);
          backend_.linear(logits, hidden, w_.lm_head);  // every row is a logits row
        },
        "step B=" + std::to_string(B) + " verify=" + std::to_string(Bv) + " T=" + std::to_string(T));
    capture_ = nullptr;
    if (!g->recording) {
      drop_graphs();
      return std::nullopt;
    }
  }
  g->recording->replay();
  ++graph_stats_.replayed;
  if (capture) {
    *capture = SpecCapture();
    capture->hidden = hidden;
    for (size_t s = 0; s < batch.size(); ++s) {
      if (!batch[s].speculative) continue;
      capture->spans.push_back(layout.all.seqs[s]);  // stash rows = batch rows
      capture->seq.push_back(static_cast<int64_t>(s));
    }
    if (Bv > 0) stash_views(*capture, T);
  }
  return download_logits(logits, row_argmax);
}

void Qwen35Model::project_out(const Tensor& out, const Tensor& x, const Linear& w, const ResidualStep* then) {
  if (!then) {
    backend_.linear(out, x, w);
  } else if (fused_) {
    backend_.linear_add_rmsnorm(then->residual, then->h, x, w, then->norm, config_.rms_norm_eps);
  } else {
    backend_.linear(out, x, w);
    backend_.add_rmsnorm(then->residual, then->h, out, then->norm, config_.rms_norm_eps);
  }
}

void Qwen35Model::gdn_layer(const Tensor& out, const Tensor& h, const LayerWeights& lw, int gdn_index,
                            const Layout& layout, const StatePools& state, const ResidualStep* then) {
  const GdnWeights& w = lw.gdn;
  const GdnDims dims = gdn_dims(config_);
  const int64_t T = h.dim(0), Hv = dims.num_v_heads, dv = dims.v_head_dim;
  const bool verify = !layout.verify.seqs.empty();
  const auto gi = static_cast<size_t>(gdn_index);
  // Verify spans keep their GDN inputs for commit_speculative: written straight into the stash when
  // every batch row has a stash row (a recorded step, or a batch of verify spans only), else gathered.
  const bool direct = verify && capture_->mixed[gi].dim(0) == T;
  Buffer mixed_own, g_own, beta_own;
  auto stash_or_own = [&](Buffer& own, std::vector<Tensor> SpecCapture::*stash, int64_t width) -> Tensor {
    if (direct) return (capture_->*stash)[gi];
    own = buffer({T, width});
    return own.tensor();
  };
  const Tensor mixed = stash_or_own(mixed_own, &SpecCapture::mixed, dims.conv_dim());
  Buffer z = buffer({T, Hv * dv});
  const bool decode_chain = fused_ && layout.prefill.seqs.empty() && !verify && !layout.saves;
  const bool verify_chain = fused_ && direct && layout.prefill.seqs.empty() && layout.decode.seqs.empty() &&
                            !layout.saves;
  // The projections of h (the chains do the a/b ones themselves).
  Buffer a, b;
  if (decode_chain || verify_chain) {
    backend_.linears({mixed, z}, h, {&w.in_proj_qkv, &w.in_proj_z});
  } else {
    a = buffer({T, Hv});
    b = buffer({T, Hv});
    backend_.linears({mixed, z, b, a}, h, {&w.in_proj_qkv, &w.in_proj_z, &w.in_proj_b, &w.in_proj_a});
  }

  const Tensor& rec = state.recurrent[gi];
  const Tensor& conv = state.conv[gi];
  Buffer normed = buffer({T, Hv * dv});
  if (decode_chain) {
    // Pure decode: one op for the a/b projections, conv, gating, delta step and gated norm.
    backend_.gdn_decode_step(normed, h, mixed, z, w.in_proj_a, w.in_proj_b, w.conv, w.A_log, w.dt_bias, w.norm,
                             config_.rms_norm_eps, conv, rec, layout.decode, dims);
    project_out(out, normed, w.out_proj, then);
    return;
  }
  if (verify_chain) {
    // Verify spans only (every row is a stash row): the same chain from the live state, which it
    // leaves as it is; the gates go to the stash.
    backend_.gdn_verify_step(normed, capture_->g[gi], capture_->beta[gi], h, mixed, z, w.in_proj_a, w.in_proj_b,
                             w.conv, w.A_log, w.dt_bias, w.norm, config_.rms_norm_eps, conv, rec, layout.verify, dims);
    project_out(out, normed, w.out_proj, then);
    return;
  }
  Buffer qkv = buffer({T, dims.conv_dim()});
  if (!layout.stateful.seqs.empty()) backend_.gdn_conv(qkv, mixed, w.conv, conv, layout.stateful);
  const Tensor g = stash_or_own(g_own, &SpecCapture::g, Hv);
  const Tensor beta = stash_or_own(beta_own, &SpecCapture::beta, Hv);
  backend_.gdn_gating(g, beta, a, b, w.A_log, w.dt_bias);

  Buffer core = buffer({T, Hv, dv});
  if (!layout.prefill.seqs.empty()) backend_.gdn_chunked(core, qkv, g, beta, rec, layout.prefill, dims);
  if (!layout.decode.seqs.empty()) backend_.gdn_recurrent(core, qkv, g, beta, rec, layout.decode, dims);
  if (verify) {
    // The decode form from the live state rows, which it leaves as they are.
    backend_.gdn_verify(core, qkv, mixed, w.conv, g, beta, conv, rec, layout.verify, dims);
    if (!direct) {
      backend_.gather_rows(capture_->mixed[gi], mixed, layout.verify_rows);
      backend_.gather_rows(capture_->g[gi], g, layout.verify_rows);
      backend_.gather_rows(capture_->beta[gi], beta, layout.verify_rows);
    }
  }

  if (then && fused_) {  // the gated norm, out_proj and the residual step as one op
    backend_.gated_rmsnorm_linear_add_rmsnorm(then->residual, then->h, core, z, w.norm, w.out_proj, then->norm,
                                              config_.rms_norm_eps);
    return;
  }
  backend_.gated_rmsnorm(normed.tensor().view({T * Hv, dv}), core.tensor().view({T * Hv, dv}),
                         z.tensor().view({T * Hv, dv}), w.norm, config_.rms_norm_eps);
  project_out(out, normed, w.out_proj, then);
}

void Qwen35Model::attention_layer(const Tensor& out, const Tensor& h, const LayerWeights& lw, const Layout& layout,
                                  const KvPool& pool, int64_t block_size, const ResidualStep* then) {
  const AttentionWeights& w = lw.attn;
  const ModelConfig& c = config_;
  const int64_t T = h.dim(0), nh = c.num_attention_heads, kvh = c.num_key_value_heads, hd = c.head_dim;
  Buffer qg = buffer({T, nh, 2 * hd}), k = buffer({T, kvh, hd}), v = buffer({T, kvh, hd});
  backend_.linears({qg, k, v}, h, {&w.q_proj, &w.k_proj, &w.v_proj});
  Buffer q = buffer({T, nh, hd}), gate = buffer({T, nh, hd});
  if (fused_ && !layout.mrope) {
    // The same chain as below in one op (one kernel on CUDA).
    backend_.attention_prep(q, gate, qg, k, v, w.q_norm, w.k_norm, c.rms_norm_eps, layout.positions,
                            c.rotary_dim(), c.rope_theta, pool, layout.all);
  } else {
    unfused_attention_prep(q, gate, qg, k, v, w, layout, pool);
  }
  AttentionDims dims;
  dims.num_heads = nh;
  dims.num_kv_heads = kvh;
  dims.head_dim = hd;
  dims.block_size = block_size;
  dims.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Buffer o = buffer({T, nh, hd});
  if (fused_) {
    backend_.gated_attention(o, q, gate, pool, layout.all, dims);
  } else {
    backend_.attention(o, q, pool, layout.all, dims);
    backend_.sigmoid_mul(o, gate);
  }
  project_out(out, o.tensor().view({T, nh * hd}), w.o_proj, then);
}

void Qwen35Model::unfused_attention_prep(const Tensor& q, const Tensor& gate, const Tensor& qg, const Tensor& k,
                                         const Tensor& v, const AttentionWeights& w, const Layout& layout,
                                         const KvPool& pool) {
  const ModelConfig& c = config_;
  const int64_t T = q.dim(0), nh = q.dim(1), hd = q.dim(2), kvh = k.dim(1);
  backend_.split_query_gate(q, gate, qg);
  // Per-head zero-centred RMSNorm before RoPE.
  backend_.rmsnorm(q.view({T * nh, hd}), q.view({T * nh, hd}), w.q_norm, c.rms_norm_eps);
  backend_.rmsnorm(k.view({T * kvh, hd}), k.view({T * kvh, hd}), w.k_norm, c.rms_norm_eps);
  if (layout.mrope) {
    backend_.rope_axes(q, layout.positions3, mrope_axis_, mrope_inv_freq_);
    backend_.rope_axes(k, layout.positions3, mrope_axis_, mrope_inv_freq_);
  } else {
    // Equal temporal / height / width positions: M-RoPE is 1-D RoPE.
    backend_.rope(q, layout.positions, c.rotary_dim(), c.rope_theta);
    backend_.rope(k, layout.positions, c.rotary_dim(), c.rope_theta);
  }
  backend_.kv_cache_write(pool, k, v, layout.all);
}

void Qwen35Model::moe(const Tensor& out, const Tensor& h, const MoeWeights& w, const Tensor& residual,
                      const Tensor& next_norm) {
  const ModelConfig& c = config_;
  const int64_t T = h.dim(0), E = c.num_experts, k = c.num_experts_per_tok;
  const int64_t Is = c.shared_expert_intermediate_size;
  Buffer shared = buffer({T, c.hidden_size});
  // The routed experts and the shared expert read only h: independent branches.
  backend_.run_branches({[&] {
                           Buffer logits = buffer({T, E});
                           backend_.linear(logits, h, w.router);
                           Buffer topk_w = buffer({T, k}), topk_ids = buffer({T, k}, DType::kI32);
                           if (fused_) {
                             backend_.moe_route_experts(out, topk_w, topk_ids, logits, h, w.experts_gate_up,
                                                        w.experts_down);
                           } else {
                             backend_.moe_route_topk(topk_w, topk_ids, logits);
                             backend_.moe_experts(out, h, topk_ids, topk_w, w.experts_gate_up, w.experts_down);
                           }
                         },
                         [&] {
                           if (fused_) {
                             backend_.gated_mlp(shared, h, w.shared_gate_up, w.shared_down);
                           } else {
                             Buffer gu = buffer({T, 2 * Is}), act = buffer({T, Is});
                             backend_.linear(gu, h, w.shared_gate_up);
                             backend_.silu_mul(act, gu);
                             backend_.linear(shared, act, w.shared_down);
                           }
                         }});
  if (fused_) {
    backend_.add_gated_shared_rmsnorm(residual, h, out, shared, w.shared_gate, next_norm, c.rms_norm_eps);
  } else {
    Buffer gate = buffer({T, 1});
    backend_.linear(gate, h, w.shared_gate);
    backend_.add_sigmoid_scaled(out, shared, gate);
    backend_.add_rmsnorm(residual, h, out, next_norm, c.rms_norm_eps);
  }
}

void Qwen35Model::mlp(const Tensor& out, const Tensor& h, const MlpWeights& w) {
  const int64_t T = h.dim(0), I = config_.intermediate_size;
  if (fused_) {
    backend_.gated_mlp(out, h, w.gate_up, w.down);
    return;
  }
  Buffer gu = buffer({T, 2 * I}), act = buffer({T, I});
  backend_.linear(gu, h, w.gate_up);
  backend_.silu_mul(act, gu);
  backend_.linear(out, act, w.down);
}

Logits Qwen35Model::lm_head(const Tensor& hidden, const std::vector<ArgmaxWant>& row_argmax) {
  const int64_t R = hidden.dim(0), V = config_.vocab_size;
  Buffer logits = buffer({R, V});
  backend_.linear(logits, hidden, w_.lm_head);
  return download_logits(logits, row_argmax);
}

Logits Qwen35Model::download_logits(const Tensor& logits, const std::vector<ArgmaxWant>& row_argmax) {
  Logits out;
  out.rows = logits.dim(0);
  out.vocab = logits.dim(1);
  const auto wants_argmax = [&](int64_t r) { return !row_argmax.empty() && row_argmax[static_cast<size_t>(r)].vocab > 0; };
  int64_t full = 0;
  for (int64_t r = 0; r < out.rows; ++r) full += !wants_argmax(r);
  if (full == out.rows) {
    out.data.resize(static_cast<size_t>(out.rows * out.vocab));
    backend_.download(out.data.data(), logits);
    return out;
  }
  // The argmax (or draw) of every row in one pass (rows asking with the same limit and exclusions
  // share it: greedy rows one argmax, sampled rows one draw, each with its own parameters; a mixed
  // batch, e.g. some rows still under min_tokens, takes a pass per distinct request), then the
  // values of only the rows that need them.
  out.argmax.resize(static_cast<size_t>(out.rows));
  const auto drawn = [&](int64_t r) { return row_argmax[static_cast<size_t>(r)].draw.temperature > 0.0f; };
  const auto same = [&](int64_t a, int64_t b) {
    const ArgmaxWant &x = row_argmax[static_cast<size_t>(a)], &y = row_argmax[static_cast<size_t>(b)];
    return x.vocab == y.vocab && drawn(a) == drawn(b) &&
           std::equal(x.excluded.begin(), x.excluded.end(), y.excluded.begin(), y.excluded.end());
  };
  std::vector<bool> done(static_cast<size_t>(out.rows), false);
  for (int64_t r = 0; r < out.rows; ++r) {
    if (!wants_argmax(r) || done[static_cast<size_t>(r)]) continue;
    const ArgmaxWant& want = row_argmax[static_cast<size_t>(r)];
    const std::vector<int32_t> excluded(want.excluded.begin(), want.excluded.end());
    std::vector<int64_t> group;
    for (int64_t q = r; q < out.rows; ++q)
      if (wants_argmax(q) && same(q, r)) group.push_back(q);
    std::vector<RowArgmax> a;
    if (drawn(r)) {
      std::vector<RowDraw> draws(static_cast<size_t>(out.rows));  // temperature 0: not drawn
      for (int64_t q : group) draws[static_cast<size_t>(q)] = row_argmax[static_cast<size_t>(q)].draw;
      a = backend_.draw(logits, want.vocab, excluded, draws);
    } else {
      a = backend_.argmax(logits, want.vocab, excluded);
    }
    for (int64_t q : group) {
      out.argmax[static_cast<size_t>(q)] = a[static_cast<size_t>(q)];
      done[static_cast<size_t>(q)] = true;
    }
  }
  out.data_row.assign(static_cast<size_t>(out.rows), -1);
  out.data.resize(static_cast<size_t>(full * out.vocab));
  int64_t at = 0;
  for (int64_t r = 0; r < out.rows;) {  // each run of consecutive value rows in one copy
    if (wants_argmax(r)) {
      ++r;
      continue;
    }
    int64_t end = r;
    for (; end < out.rows && !wants_argmax(end); ++end) out.data_row[static_cast<size_t>(end)] = at + (end - r);
    backend_.download(out.data.data() + at * out.vocab, logits.rows(r, end - r));
    at += end - r;
    r = end;
  }
  return out;
}

}  // namespace sparkserve
