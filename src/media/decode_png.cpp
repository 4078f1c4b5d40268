// PNG through libpng's progressive-free row API, converted as Pillow converts: palettes and low bit
// depths expanded, 16-bit samples reduced to their high byte, gray replicated to RGB, transparency
// (tRNS) turned into alpha; gAMA / iCCP / sRGB chunks are not applied. libpng reports errors through
// a longjmp to the setjmp below; everything the jump crosses lives in the job struct.
#include <png.h>

#include <cstring>
#include <memory>

#include "media/image.h"

namespace sparkserve::media {

namespace {
struct PngJob {
  const uint8_t* data = nullptr;
  size_t size = 0;
  size_t pos = 0;
  char message[256] = {0};
  std::string limit_error;
  std::vector<png_bytep> rows;
  RgbaImage* out = nullptr;
  int orientation = 1;
};

void read_fn(png_structp png, png_bytep dst, png_size_t n) {
  auto* job = static_cast<PngJob*>(png_get_io_ptr(png));
  if (job->size - job->pos < n) png_error(png, "the data ends before the image does");
  std::memcpy(dst, job->data + job->pos, n);
  job->pos += n;
}

void error_fn(png_structp png, png_const_charp msg) {
  auto* job = static_cast<PngJob*>(png_get_error_ptr(png));
  std::snprintf(job->message, sizeof(job->message), "%s", msg);
  png_longjmp(png, 1);
}
void warning_fn(png_structp, png_const_charp) {}

bool run(PngJob& job, const DecodeLimits& limits) {
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &job, error_fn, warning_fn);
  if (!png) return false;
  png_infop info = png_create_info_struct(png);
  if (!info) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &job, read_fn);
  // Our own limit is checked below; libpng's own (1M x 1M by default) only bounds the header.
  png_set_user_limits(png, 0x7fffffff, 0x7fffffff);
  png_read_info(png, info);
  const png_uint_32 W = png_get_image_width(png, info), H = png_get_image_height(png, info);
  Status dims = check_dimensions("PNG", W, H, limits);
  if (!dims.ok()) {
    job.limit_error = dims.message();
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
#ifdef PNG_eXIf_SUPPORTED
  png_uint_32 exif_len = 0;
  png_bytep exif = nullptr;
  if (png_get_eXIf_1(png, info, &exif_len, &exif) && exif) job.orientation = exif_orientation(exif, exif_len);
#endif
  const int color = png_get_color_type(png, info);
  png_set_expand(png);  // palette -> RGB, gray < 8 bits -> 8 bits, tRNS -> alpha
  png_set_strip_16(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_add_alpha(png, 0xFF, PNG_FILLER_AFTER);  // no-op where alpha exists
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<size_t>(W) * 4) png_error(png, "unexpected row layout");
  job.out->width = static_cast<int>(W);
  job.out->height = static_cast<int>(H);
  job.out->rgba.resize(static_cast<size_t>(W) * H * 4);
  job.rows.resize(H);
  for (png_uint_32 y = 0; y < H; ++y) job.rows[y] = job.out->rgba.data() + static_cast<size_t>(y) * W * 4;
  png_read_image(png, job.rows.data());
  png_read_end(png, nullptr);
#ifdef PNG_eXIf_SUPPORTED
  // eXIf may follow the image data.
  if (job.orientation == 1 && png_get_eXIf_1(png, info, &exif_len, &exif) && exif)
    job.orientation = exif_orientation(exif, exif_len);
#endif
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}
}  // namespace

Expected<RgbaImage> decode_png(const uint8_t* data, size_t size, const DecodeLimits& limits, int& orientation) {
  RgbaImage out;
  auto job = std::make_unique<PngJob>();
  job->data = data;
  job->size = size;
  job->out = &out;
  if (!run(*job, limits)) {
    if (!job->limit_error.empty()) return make_error(job->limit_error);
    return make_error(std::string("corrupt or truncated PNG: ") + (job->message[0] ? job->message : "libpng failed"));
  }
  orientation = job->orientation;
  return out;
}

}  // namespace sparkserve::media
