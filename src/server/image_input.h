// Images in API requests, read once for every route: OpenAI chat `image_url` content parts
// (a data: URL with base64 bytes, or a file:// path inside --allowed-local-media-path, as vLLM
// allows; never a network fetch) and Anthropic image blocks (base64 sources, turned into the same
// data: URL part). The images are decoded and preprocessed for the model's vision tower, and the
// tokenized prompt's image placeholders are expanded to one token per merged patch block.
// Every failure is a 400 naming the content part: no vision tower, a URL scheme that is not
// allowed, bad base64, an undecodable, truncated, too large or unsupported image, more images than
// --limit-mm-per-prompt allows.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "loader/vision_config.h"
#include "media/preprocess.h"
#include "model/multimodal.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace sparkserve {

// What serve allows, and what the model's tower takes.
struct ImageInputOptions {
  bool model_has_vision = false;
  VisionConfig vision;                     // config.json's vision_config (token ids, patch sizes)
  media::PreprocessorConfig preprocessor;  // preprocessor_config.json, --mm-processor-kwargs applied
  std::filesystem::path allowed_local_media_path;  // canonical folder; empty: file:// URLs are refused
  int64_t max_images_per_prompt = 999;             // --limit-mm-per-prompt '{"image": N}' (vLLM's default)
  // --max-image-pixels: decoded size above which an image is refused before its pixels are decoded
  // (PIL's decompression-bomb threshold by default).
  int64_t max_image_pixels = 89478485;
  int64_t max_file_bytes = int64_t{64} << 20;  // a file:// image's size at most
};

// --limit-mm-per-prompt's JSON (vLLM's syntax, e.g. '{"image": 4}'): the image count. Other
// modalities may only be given as 0 (this server takes images only).
Expected<int64_t> parse_limit_mm_per_prompt(const std::string& json_text);
// --mm-processor-kwargs' JSON: min_pixels / max_pixels override the preprocessor's resize bounds.
Status apply_mm_processor_kwargs(const std::string& json_text, media::PreprocessorConfig& p);

// The bytes of the image an `image_url` URL names. `param` is where the URL sits in the request
// (e.g. "messages[0].content[1].image_url.url"), for the error.
ApiResult<std::string> image_url_bytes(std::string_view url, const ImageInputOptions& opt, const std::string& param);

// An Anthropic image block ({"type": "image", "source": {"type": "base64", "media_type", "data"}})
// as the OpenAI content part the chat path reads ({"type": "image_url", "image_url": {"url":
// "data:<media_type>;base64,<data>"}}). URL sources are refused (no network fetches). Checks the
// block's shape and media type only: the bytes are decoded with the other images of the request.
ApiResult<RequestJson> anthropic_image_block_to_chat_part(const RequestJson& block, const std::string& path);

// A Responses API input_image part ({"type": "input_image", "image_url": "data:...", "detail"?})
// as the same chat part. file_id references are refused (this server stores no files); the URL is
// read with the request's other images.
ApiResult<RequestJson> responses_image_part_to_chat_part(const RequestJson& part, const std::string& path);

// Decodes (EXIF orientation, alpha over white) and preprocesses one image's bytes.
ApiResult<media::PatchedImage> load_image(std::string_view bytes, const ImageInputOptions& opt,
                                          const std::string& param);

// The images of normalized chat messages in the order the chat template emits their placeholders
// (messages in order, parts in order). Empty without image parts.
ApiResult<std::vector<media::PatchedImage>> load_chat_images(const RequestJson& messages,
                                                             const ImageInputOptions& opt);

// ids: the tokenized prompt, one vision.image_token_id per image (in), expanded (out). Null when
// there are no images.
ApiResult<std::shared_ptr<MultimodalPrompt>> expand_image_tokens(std::vector<int32_t>& ids,
                                                                 std::vector<media::PatchedImage> images,
                                                                 const ImageInputOptions& opt);

}  // namespace sparkserve
