#include "model/vision.h"

#include <cmath>

namespace sparkserve {

VisionPositions vision_positions(const std::vector<const media::PatchedImage*>& images, int merge, int side) {
  VisionPositions p;
  // transformers' _interpolation_axis_taps_weights (bilinear, align_corners=True), in fp32.
  auto taps = [side](int64_t index, int64_t size, int32_t t[2], float w[2]) {
    const float src = static_cast<float>(index) * static_cast<float>(side - 1) /
                      static_cast<float>(std::max<int64_t>(size - 1, 1));
    const float fl = std::floor(src);
    for (int o = 0; o < 2; ++o) {
      t[o] = std::clamp(static_cast<int32_t>(fl) + o, 0, side - 1);
      const float distance = std::abs(src - fl - static_cast<float>(o));
      w[o] = std::max(1.0f - distance, 0.0f);
    }
  };
  for (const media::PatchedImage* img : images) {
    const int64_t H = img->grid_h, W = img->grid_w;
    for (int64_t t = 0; t < img->grid_t; ++t) {
      p.segments.push_back(H * W);
      for (int64_t bh = 0; bh < H / merge; ++bh)
        for (int64_t bw = 0; bw < W / merge; ++bw)
          for (int64_t mh = 0; mh < merge; ++mh)
            for (int64_t mw = 0; mw < merge; ++mw) {
              const int64_t row = bh * merge + mh, col = bw * merge + mw;
              p.rowcol.push_back(static_cast<int32_t>(row));
              p.rowcol.push_back(static_cast<int32_t>(col));
              int32_t th[2], tw[2];
              float wh[2], ww[2];
              taps(row, H, th, wh);
              taps(col, W, tw, ww);
              for (int a = 0; a < 2; ++a)
                for (int b = 0; b < 2; ++b) {
                  p.interp_ids.push_back(th[a] * side + tw[b]);
                  p.interp_w.push_back(wh[a] * ww[b]);
                }
            }
    }
  }
  return p;
}

VisionTower::VisionTower(Backend& backend, const VisionConfig& config, const VisionWeights& weights)
    : backend_(backend), c_(config), w_(weights) {
  // transformers' axial rope: inv_freq = 1 / theta^(arange(0, hd/2, 2) / (hd/2)) in fp32, angles of
  // the first hd/4 pairs from the patch row, the next hd/4 from its column.
  const int64_t hd = c_.head_dim(), quarter = hd / 4, half = hd / 2;
  std::vector<int32_t> axis(static_cast<size_t>(half));
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    const int64_t j = i % quarter;
    axis[static_cast<size_t>(i)] = i < quarter ? 0 : 1;
    const float e = static_cast<float>(2 * j) / static_cast<float>(half);
    inv[static_cast<size_t>(i)] = 1.0f / std::pow(static_cast<float>(c_.rope_theta), e);
  }
  rope_axis_ = buffer({half}, DType::kI32);
  rope_inv_freq_ = buffer({half});
  backend_.upload(rope_axis_, axis.data());
  backend_.upload(rope_inv_freq_, inv.data());
}

Expected<Buffer> VisionTower::encode(const std::vector<const media::PatchedImage*>& images) {
  const int64_t h = c_.hidden_size, nh = c_.num_heads, hd = c_.head_dim(), I = c_.intermediate_size;
  const int merge = c_.spatial_merge_size;
  int64_t N = 0;
  for (const media::PatchedImage* img : images) {
    if (img->patch_dim != c_.patch_dim() || img->grid_h % merge != 0 || img->grid_w % merge != 0 ||
        img->grid_t <= 0 || static_cast<int64_t>(img->pixels.size()) != img->num_patches() * img->patch_dim)
      return make_error("image patches do not fit the vision tower (patch_dim " + std::to_string(img->patch_dim) +
                        ", expected " + std::to_string(c_.patch_dim()) + "; grid must be a multiple of " +
                        std::to_string(merge) + ")");
    N += img->num_patches();
  }
  if (N == 0) return make_error("no image patches to encode");
  const int side = static_cast<int>(std::lround(std::sqrt(static_cast<double>(c_.num_position_embeddings))));
  const VisionPositions pos = vision_positions(images, merge, side);

  Buffer x = buffer({N, h});
  {
    Buffer pixels = buffer({N, c_.patch_dim()});
    int64_t row = 0;
    for (const media::PatchedImage* img : images) {
      backend_.upload(pixels.tensor().rows(row, img->num_patches()), img->pixels.data());
      row += img->num_patches();
    }
    backend_.linear_bias(x, pixels, w_.patch_embed, w_.patch_b, /*accumulate=*/false);
  }
  {
    Buffer ids = buffer({N, 4}, DType::kI32), wts = buffer({N, 4}), pe = buffer({N, h});
    backend_.upload(ids, pos.interp_ids.data());
    backend_.upload(wts, pos.interp_w.data());
    backend_.embedding_mix(pe, ids, wts, w_.pos_embed);
    backend_.add(x, x, pe);
  }
  Buffer rowcol = buffer({N, 2}, DType::kI32);
  backend_.upload(rowcol, pos.rowcol.data());

  const float scale = static_cast<float>(std::pow(static_cast<double>(hd), -0.5));
  Buffer t = buffer({N, h}), q = buffer({N, nh, hd}), k = buffer({N, nh, hd}), v = buffer({N, nh, hd});
  Buffer o = buffer({N, nh, hd}), f = buffer({N, I});
  const Tensor q2 = q.tensor().view({N, h}), k2 = k.tensor().view({N, h}), v2 = v.tensor().view({N, h});
  for (const VisionBlockWeights& b : w_.blocks) {
    backend_.layernorm(t, x, b.norm1_w, b.norm1_b, 1e-6f);
    backend_.linear_bias(q2, t, b.q, b.q_b, /*accumulate=*/false);
    backend_.linear_bias(k2, t, b.k, b.k_b, /*accumulate=*/false);
    backend_.linear_bias(v2, t, b.v, b.v_b, /*accumulate=*/false);
    backend_.rope_axes(q, rowcol, rope_axis_, rope_inv_freq_);
    backend_.rope_axes(k, rowcol, rope_axis_, rope_inv_freq_);
    backend_.attention_segments(o, q, k, v, pos.segments, scale);
    backend_.linear_bias(x, o.tensor().view({N, h}), b.proj, b.proj_b, /*accumulate=*/true);
    backend_.layernorm(t, x, b.norm2_w, b.norm2_b, 1e-6f);
    backend_.linear_bias(f, t, b.fc1, b.fc1_b, /*accumulate=*/false);
    backend_.gelu(f, f, c_.gelu_tanh);
    backend_.linear_bias(x, f, b.fc2, b.fc2_b, /*accumulate=*/true);
  }
  // Merger: LayerNorm per patch, then each merge block's patches side by side (they are consecutive
  // rows in merge-block order), fc1, exact GELU, fc2.
  const int64_t M = N / c_.merge_unit(), mh = h * c_.merge_unit();
  backend_.layernorm(t, x, w_.merger_norm_w, w_.merger_norm_b, 1e-6f);
  Buffer m1 = buffer({M, mh});
  backend_.linear_bias(m1, t.tensor().view({M, mh}), w_.merger_fc1, w_.merger_fc1_b, /*accumulate=*/false);
  backend_.gelu(m1, m1, /*tanh_approx=*/false);
  Buffer out = buffer({M, c_.out_hidden_size});
  backend_.linear_bias(out, m1, w_.merger_fc2, w_.merger_fc2_b, /*accumulate=*/false);
  return out;
}

}  // namespace sparkserve
