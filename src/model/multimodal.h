// A prompt with images: the image placeholders expanded to one token per merged patch block, the
// interleaved M-RoPE positions of every prompt token (transformers' get_rope_index,
// model-qwen35.md §5.4), and the images, encoded by the vision tower on first use.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "backend/ops.h"
#include "core/status.h"
#include "loader/vision_config.h"
#include "media/preprocess.h"

namespace sparkserve {

struct MultimodalPrompt {
  int64_t length = 0;              // prompt tokens this covers
  std::vector<int32_t> positions;  // [length, 3]: (t, h, w) rotary positions
  std::vector<int64_t> embed_row;  // [length]: row of `embeddings` for an image token, -1 for text
  int64_t rope_delta = 0;          // tokens after the prompt sit at position index + rope_delta
  std::vector<media::PatchedImage> images;  // pixels; dropped once encoded
  std::vector<uint64_t> image_hashes;       // PatchedImage::content_hash of each image, in order
  std::vector<int64_t> image_begin;         // first prompt token of each image
  std::vector<int64_t> image_end;           // one past its last token
  Buffer embeddings;                        // [image tokens, hidden] in backend memory once encoded
  bool encoded() const { return embeddings.tensor().data != nullptr; }

  // PREFIX-CACHE HOOK: every image token has the same id, so a cache key made of token ids alone
  // would let a prompt with one picture reuse the KV computed for another. The key of a cached
  // span of prompt tokens [begin, end) (e.g. a KV block, chained over the blocks before it) must
  // also cover these: the content hashes of the images with tokens in that span, in order.
  // (content_hash is 64-bit FNV-1a: not collision-resistant, so a shared cache should hash the
  // image with its keyed hash instead; see preprocess_image.)
  std::vector<uint64_t> image_hashes_in(int64_t begin, int64_t end) const;
};

// Expands each occurrence of config.image_token_id in `ids` (one per image, in order) into that
// image's token count and lays out positions. Errors: the number of image tokens differs from the
// number of images, an image that does not fit the tower's patch / merge sizes.
Expected<MultimodalPrompt> build_multimodal_prompt(std::vector<int32_t>& ids, std::vector<media::PatchedImage> images,
                                                   const VisionConfig& config);

// The image preprocessing defaults for a model whose folder has no preprocessor_config.json: the
// Qwen3.5 file's pixel limits with the tower's own patch / merge / temporal sizes.
media::PreprocessorConfig default_preprocessor(const VisionConfig& config);
// Checks that a preprocessor config produces what the tower takes.
Status check_preprocessor(const media::PreprocessorConfig& p, const VisionConfig& config);
// dir/preprocessor_config.json (or default_preprocessor), checked against the tower.
Expected<media::PreprocessorConfig> load_model_preprocessor(const std::filesystem::path& dir,
                                                            const VisionConfig& config);

}  // namespace sparkserve
