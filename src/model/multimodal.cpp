#include "model/multimodal.h"

#include <algorithm>

namespace sparkserve {

media::PreprocessorConfig default_preprocessor(const VisionConfig& c) {
  media::PreprocessorConfig p;
  p.patch_size = c.patch_size;
  p.temporal_patch_size = c.temporal_patch_size;
  p.merge_size = c.spatial_merge_size;
  return p;
}

Status check_preprocessor(const media::PreprocessorConfig& p, const VisionConfig& c) {
  if (p.patch_size != c.patch_size || p.temporal_patch_size != c.temporal_patch_size ||
      p.merge_size != c.spatial_merge_size)
    return make_error("preprocessor_config.json (patch " + std::to_string(p.patch_size) + ", temporal " +
                      std::to_string(p.temporal_patch_size) + ", merge " + std::to_string(p.merge_size) +
                      ") disagrees with config.json's vision_config (patch " + std::to_string(c.patch_size) +
                      ", temporal " + std::to_string(c.temporal_patch_size) + ", merge " +
                      std::to_string(c.spatial_merge_size) + ")");
  return Status::Ok();
}

Expected<media::PreprocessorConfig> load_model_preprocessor(const std::filesystem::path& dir,
                                                            const VisionConfig& config) {
  SS_ASSIGN_OR_RETURN(media::PreprocessorConfig p, media::load_preprocessor_config(dir, default_preprocessor(config)));
  SS_RETURN_IF_ERROR(check_preprocessor(p, config));
  return p;
}

Expected<MultimodalPrompt> build_multimodal_prompt(std::vector<int32_t>& ids, std::vector<media::PatchedImage> images,
                                                   const VisionConfig& c) {
  const int64_t found = std::count(ids.begin(), ids.end(), c.image_token_id);
  if (found != static_cast<int64_t>(images.size()))
    return make_error("the prompt has " + std::to_string(found) + " image token(s) (id " +
                      std::to_string(c.image_token_id) + ") for " + std::to_string(images.size()) + " image(s)");
  const int merge = c.spatial_merge_size;
  for (const auto& img : images)
    if (img.patch_dim != c.patch_dim() || img.grid_h % merge || img.grid_w % merge || img.grid_t < 1)
      return make_error("an image's patches do not fit the vision tower");
  MultimodalPrompt mm;
  std::vector<int32_t> out;
  int64_t cur = 0;  // next position (get_rope_index's current_pos)
  int64_t image = 0, embed = 0;
  for (int32_t id : ids) {
    if (id != c.image_token_id) {
      out.push_back(id);
      mm.positions.insert(mm.positions.end(), {static_cast<int32_t>(cur), static_cast<int32_t>(cur),
                                               static_cast<int32_t>(cur)});
      mm.embed_row.push_back(-1);
      ++cur;
      continue;
    }
    const media::PatchedImage& img = images[static_cast<size_t>(image++)];
    // One token per merge block: temporal index, block row and block column added to `cur`.
    const int64_t gh = img.grid_h / merge, gw = img.grid_w / merge;
    mm.image_begin.push_back(static_cast<int64_t>(out.size()));
    for (int64_t t = 0; t < img.grid_t; ++t)
      for (int64_t r = 0; r < gh; ++r)
        for (int64_t col = 0; col < gw; ++col) {
          out.push_back(c.image_token_id);
          mm.positions.insert(mm.positions.end(), {static_cast<int32_t>(cur + t), static_cast<int32_t>(cur + r),
                                                   static_cast<int32_t>(cur + col)});
          mm.embed_row.push_back(embed++);
        }
    cur += std::max(gh, gw);
    mm.image_end.push_back(static_cast<int64_t>(out.size()));
  }
  mm.length = static_cast<int64_t>(out.size());
  int64_t max_pos = -1;
  for (int32_t p : mm.positions) max_pos = std::max<int64_t>(max_pos, p);
  mm.rope_delta = max_pos + 1 - mm.length;
  for (const auto& img : images) mm.image_hashes.push_back(img.content_hash);
  mm.images = std::move(images);
  ids = std::move(out);
  return mm;
}

std::vector<uint64_t> MultimodalPrompt::image_hashes_in(int64_t begin, int64_t end) const {
  std::vector<uint64_t> out;
  for (size_t i = 0; i < image_hashes.size(); ++i)
    if (image_begin[i] < end && image_end[i] > begin) out.push_back(image_hashes[i]);
  return out;
}

}  // namespace sparkserve
