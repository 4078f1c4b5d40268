// JPEG through libjpeg-turbo (Debian's libjpeg62-turbo), with libjpeg's defaults as Pillow uses them
// (islow IDCT, fancy upsampling). libjpeg reports fatal errors through a longjmp out of error_exit:
// everything the jump crosses lives in a heap-free struct reached through a pointer.
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>

#include <jpeglib.h>
#include <jerror.h>

#include "media/image.h"

namespace sparkserve::media {

namespace {
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX] = {0};
  bool truncated = false;
};

void on_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Warnings are ignored (Pillow ignores them too), except the one libjpeg gives when the data ends
// early: it then pads the image with grey, which Pillow refuses as "image file is truncated".
void on_message(j_common_ptr cinfo, int level) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  if (level < 0 && cinfo->err->msg_code == JWRN_JPEG_EOF) err->truncated = true;
}

struct JpegJob {
  jpeg_decompress_struct cinfo;
  JpegError err;
  RgbaImage* out = nullptr;
  int orientation = 1;
  const DecodeLimits* limits = nullptr;
  std::string limit_error;
  std::vector<uint8_t> row;  // one scanline; in the job so that a longjmp leaks nothing
};

// Returns false after a libjpeg error (message in job.err) or a refused size (job.limit_error).
bool run(JpegJob& job, const uint8_t* data, size_t size) {
  jpeg_decompress_struct& cinfo = job.cinfo;
  cinfo.err = jpeg_std_error(&job.err.mgr);
  job.err.mgr.error_exit = on_error;
  job.err.mgr.emit_message = on_message;
  if (setjmp(job.err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&cinfo, TRUE);
  for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
    if (m->marker == JPEG_APP0 + 1 && m->data_length > 6 && std::memcmp(m->data, "Exif\0\0", 6) == 0) {
      job.orientation = exif_orientation(m->data + 6, m->data_length - 6);
      break;
    }
  }
  Status dims = check_dimensions("JPEG", cinfo.image_width, cinfo.image_height, *job.limits);
  if (!dims.ok()) {
    job.limit_error = dims.message();
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;
  jpeg_start_decompress(&cinfo);
  const int W = static_cast<int>(cinfo.output_width), H = static_cast<int>(cinfo.output_height);
  const int comps = cinfo.output_components;
  job.out->width = W;
  job.out->height = H;
  job.out->rgba.assign(static_cast<size_t>(W) * H * 4, 255);
  std::vector<uint8_t>& row = job.row;
  row.resize(static_cast<size_t>(W) * comps);
  uint8_t* dst = job.out->rgba.data();
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW rp = row.data();
    const int y = static_cast<int>(cinfo.output_scanline);
    if (jpeg_read_scanlines(&cinfo, &rp, 1) != 1) break;
    uint8_t* o = dst + static_cast<size_t>(y) * W * 4;
    for (int x = 0; x < W; ++x) {
      if (cmyk) {
        // Adobe writes CMYK inverted (0 = full ink), which is what every CMYK JPEG in practice
        // holds (Pillow reads it as "CMYK;I"); RGB = (255 - C)(255 - K) / 255 on the ink values.
        const int c = row[x * 4], m = row[x * 4 + 1], yy = row[x * 4 + 2], k = row[x * 4 + 3];
        const bool inv = cinfo.saw_Adobe_marker;
        const int C = inv ? 255 - c : c, M = inv ? 255 - m : m, Y = inv ? 255 - yy : yy, K = inv ? 255 - k : k;
        o[x * 4 + 0] = static_cast<uint8_t>(((255 - C) * (255 - K) + 127) / 255);
        o[x * 4 + 1] = static_cast<uint8_t>(((255 - M) * (255 - K) + 127) / 255);
        o[x * 4 + 2] = static_cast<uint8_t>(((255 - Y) * (255 - K) + 127) / 255);
      } else {
        std::memcpy(o + x * 4, &row[x * 3], 3);
      }
    }
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return true;
}
}  // namespace

Expected<RgbaImage> decode_jpeg(const uint8_t* data, size_t size, const DecodeLimits& limits, int& orientation) {
  RgbaImage out;
  auto job = std::make_unique<JpegJob>();
  job->out = &out;
  job->limits = &limits;
  if (!run(*job, data, size)) {
    if (!job->limit_error.empty()) return make_error(job->limit_error);
    return make_error(std::string("corrupt or truncated JPEG: ") + job->err.message);
  }
  if (job->err.truncated) return make_error("truncated JPEG: the data ends before the image does");
  orientation = job->orientation;
  return out;
}

}  // namespace sparkserve::media
