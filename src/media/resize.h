// Antialiased bicubic resize of 8-bit RGB images, computing what torch's uint8 CPU path
// (torchvision.transforms.v2.functional.resize(antialias=True, BICUBIC), which transformers' Qwen2-VL
// image processor calls) computes, bit for bit: Pillow's separable filter (Keys cubic a = -0.5,
// support scaled by the downscale factor, weights normalised per output sample), weights rounded to
// int16 at the largest precision where the axis's largest weight fits, each sample an integer dot
// product plus half an LSB, shifted and clamped; the width pass first into an 8-bit intermediate.
#pragma once

#include "media/image.h"

namespace sparkserve::media {

// in: [h, w, 3] u8 -> [out_height, out_width, 3] u8. Returns `in` unchanged when the size is the same.
RgbImage resize_bicubic_aa(const RgbImage& in, int out_width, int out_height);

}  // namespace sparkserve::media
