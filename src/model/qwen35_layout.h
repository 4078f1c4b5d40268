// Qwen35Model::Layout: the rows, spans and positions of one batch as the model's ops see them; and
// Qwen35Model::CommitGraph.
// Private to the model's own sources (qwen35.cpp, qwen35_mtp.cpp).
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "model/qwen35.h"

namespace sparkserve {

// The batch seen by the state ops: all spans, and the same spans split by which GDN form runs
// them (chunked for prefill spans of several tokens, recurrent for single decode tokens).
struct Qwen35Model::Layout {
  BatchLayout all, prefill, decode;
  // GDN spans split by whether their state advances: `stateful` (prefill and decode spans) or not
  // (`verify`: speculative spans, run by Backend::gdn_verify). verify_rows: the batch rows of verify's
  // tokens in order.
  BatchLayout stateful, verify;
  std::vector<int64_t> verify_rows;
  // Some stateful span saves its state inside the forward (SeqSpan::saves, from ForwardSeq::saves).
  bool saves = false;
  Tensor positions;  // [T] i32, device
  Buffer positions_storage;
  // Prompt chunks with images: M-RoPE positions [T, 3] (t, h, w), needed only when some token's
  // three positions differ (the image tokens); and the rows whose embedding an image provides.
  bool mrope = false;
  Tensor positions3;
  Buffer positions3_storage;
  struct ImageRows {
    MultimodalPrompt* mm = nullptr;
    std::vector<int64_t> rows;        // batch rows
    std::vector<int64_t> embed_rows;  // their rows of mm->embeddings
  };
  std::vector<ImageRows> images;
};

// One recorded commit_speculative (qwen35_mtp.cpp): the GDN conv and delta rule of every GDN layer
// over the stash rows of a recorded verify step; the layout (each span's accepted count) is its input.
struct Qwen35Model::CommitGraph {
  Buffer words;  // i32 [layout words]
  std::vector<int32_t> staging;
  std::unique_ptr<Recording> recording;  // null: the shape was seen once, ran op by op
};

// One recorded MTP pass (qwen35_mtp.cpp): gather of its hidden rows, the MTP layer, lm_head over the
// drafting rows. Its inputs: token ids [R] | positions [R] | hidden source rows [R] | fc interleave
// [2R] | drafting rows [L] | the packed layout (room for max_blocks KV blocks per sequence).
struct Qwen35Model::DraftGraph {
  int64_t max_blocks = 0;
  Buffer inputs;
  std::vector<int32_t> staging;
  std::unique_ptr<Recording> recording;  // null: the shape was seen once, ran op by op
};

}  // namespace sparkserve
