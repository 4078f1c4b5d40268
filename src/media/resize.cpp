#include "media/resize.h"

#include <algorithm>
#include <cmath>

namespace sparkserve::media {

namespace {
double cubic(double x) {
  const double a = -0.5;
  x = std::abs(x);
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
  if (x < 2.0) return ((a * x - 5.0 * a) * x + 8.0 * a) * x - 4.0 * a;
  return 0.0;
}

// One axis of the resample: per output sample, its first input sample and its int16 weights.
struct Taps {
  int taps = 0;                  // weights per output sample (row length of `weights`)
  int precision = 0;             // fixed-point bits of the weights
  std::vector<int64_t> first;    // [out]
  std::vector<int64_t> count;    // [out]
  std::vector<int32_t> weights;  // [out, taps], int16 values
};

Taps make_taps(int64_t in_size, int64_t out_size) {
  Taps t;
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double support = scale >= 1.0 ? 2.0 * scale : 2.0;
  const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
  t.taps = static_cast<int>(std::ceil(support)) * 2 + 1;
  std::vector<double> w(static_cast<size_t>(out_size * t.taps), 0.0);
  t.first.resize(static_cast<size_t>(out_size));
  t.count.resize(static_cast<size_t>(out_size));
  double wt_max = 0.0;
  for (int64_t i = 0; i < out_size; ++i) {
    const double center = scale * (static_cast<double>(i) + 0.5);
    // Truncating casts, as the reference does (center - support + 0.5 may be negative).
    const int64_t xmin = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    int64_t xsize = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size) - xmin;
    xsize = std::clamp<int64_t>(xsize, 0, t.taps);
    double* wi = &w[static_cast<size_t>(i * t.taps)];
    double total = 0.0;
    for (int64_t j = 0; j < xsize; ++j) {
      wi[j] = cubic((static_cast<double>(j + xmin) - center + 0.5) * invscale);
      total += wi[j];
    }
    if (total != 0.0)
      for (int64_t j = 0; j < xsize; ++j) {
        wi[j] /= total;
        wt_max = std::max(wt_max, wi[j]);
      }
    t.first[static_cast<size_t>(i)] = xmin;
    t.count[static_cast<size_t>(i)] = xsize;
  }
  int p = 0;
  for (; p < 22; ++p)
    if (static_cast<int>(0.5 + wt_max * static_cast<double>(1 << (p + 1))) >= (1 << 15)) break;
  t.precision = p;
  t.weights.resize(w.size());
  for (size_t k = 0; k < w.size(); ++k) {
    const double v = w[k] * static_cast<double>(1 << p);
    t.weights[k] = static_cast<int16_t>(v < 0 ? static_cast<int>(-0.5 + v) : static_cast<int>(0.5 + v));
  }
  return t;
}

uint8_t clamp8(int64_t acc, int precision) {
  const int64_t v = acc >> precision;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Resamples along one axis. The image is seen as `lines` lines of `len` samples spaced `step`
// pixels apart, lines `line_step` pixels apart; out has the same layout with taps.first.size()
// samples per line.
void resample(const uint8_t* in, int64_t in_line_step, int64_t in_step, uint8_t* out, int64_t out_line_step,
              int64_t out_step, int64_t lines, const Taps& t) {
  const int64_t out_len = static_cast<int64_t>(t.first.size());
  const int64_t half = t.precision > 0 ? int64_t{1} << (t.precision - 1) : 0;
  for (int64_t l = 0; l < lines; ++l) {
    for (int64_t o = 0; o < out_len; ++o) {
      const int32_t* w = &t.weights[static_cast<size_t>(o * t.taps)];
      const uint8_t* src = in + l * in_line_step + t.first[static_cast<size_t>(o)] * in_step;
      int64_t acc[3] = {half, half, half};
      for (int64_t j = 0; j < t.count[static_cast<size_t>(o)]; ++j)
        for (int c = 0; c < 3; ++c) acc[c] += static_cast<int64_t>(src[j * in_step + c]) * w[j];
      uint8_t* dst = out + l * out_line_step + o * out_step;
      for (int c = 0; c < 3; ++c) dst[c] = clamp8(acc[c], t.precision);
    }
  }
}
}  // namespace

RgbImage resize_bicubic_aa(const RgbImage& in, int out_width, int out_height) {
  if (out_width == in.width && out_height == in.height) return in;
  RgbImage cur = in;
  if (out_width != in.width) {
    const Taps t = make_taps(in.width, out_width);
    RgbImage mid;
    mid.width = out_width;
    mid.height = in.height;
    mid.rgb.resize(static_cast<size_t>(out_width) * in.height * 3);
    resample(in.rgb.data(), int64_t{in.width} * 3, 3, mid.rgb.data(), int64_t{out_width} * 3, 3, in.height, t);
    cur = std::move(mid);
  }
  if (out_height != cur.height) {
    const Taps t = make_taps(cur.height, out_height);
    RgbImage out;
    out.width = cur.width;
    out.height = out_height;
    out.rgb.resize(static_cast<size_t>(cur.width) * out_height * 3);
    // Columns as lines: samples one row apart, lines one pixel apart.
    resample(cur.rgb.data(), 3, int64_t{cur.width} * 3, out.rgb.data(), 3, int64_t{cur.width} * 3, cur.width, t);
    cur = std::move(out);
  }
  return cur;
}

}  // namespace sparkserve::media
