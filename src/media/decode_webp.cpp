// WebP through libwebp: still images with WebPDecodeRGBA, animations through WebPAnimDecoder (the
// first frame, composited on its canvas as libwebp defines it); the EXIF chunk through the demuxer.
#include <webp/decode.h>
#include <webp/demux.h>

#include <cstring>

#include "media/image.h"

namespace sparkserve::media {

Expected<RgbaImage> decode_webp(const uint8_t* data, size_t size, const DecodeLimits& limits, int& orientation) {
  WebPBitstreamFeatures features;
  if (WebPGetFeatures(data, size, &features) != VP8_STATUS_OK)
    return make_error("corrupt or truncated WebP: cannot read the header");
  SS_RETURN_IF_ERROR(check_dimensions("WebP", features.width, features.height, limits));

  WebPData wd{data, size};
  if (WebPDemuxer* demux = WebPDemux(&wd)) {
    WebPChunkIterator it;
    if (WebPDemuxGetChunk(demux, "EXIF", 1, &it)) {
      const uint8_t* p = it.chunk.bytes;
      size_t n = it.chunk.size;
      if (n > 6 && std::memcmp(p, "Exif\0\0", 6) == 0) {  // some writers keep JPEG's prefix
        p += 6;
        n -= 6;
      }
      orientation = exif_orientation(p, n);
      WebPDemuxReleaseChunkIterator(&it);
    }
    WebPDemuxDelete(demux);
  }

  RgbaImage out;
  if (features.has_animation) {
    WebPAnimDecoderOptions opts;
    if (!WebPAnimDecoderOptionsInit(&opts)) return make_error("WebP: decoder initialisation failed");
    opts.color_mode = MODE_RGBA;
    opts.use_threads = 0;
    WebPAnimDecoder* dec = WebPAnimDecoderNew(&wd, &opts);
    if (!dec) return make_error("corrupt or truncated WebP: cannot read the animation");
    WebPAnimInfo info;
    uint8_t* frame = nullptr;
    int timestamp = 0;
    if (!WebPAnimDecoderGetInfo(dec, &info) || !check_dimensions("WebP", info.canvas_width, info.canvas_height, limits).ok() ||
        !WebPAnimDecoderGetNext(dec, &frame, &timestamp)) {
      WebPAnimDecoderDelete(dec);
      return make_error("corrupt or truncated WebP: cannot decode the first frame");
    }
    out.width = static_cast<int>(info.canvas_width);
    out.height = static_cast<int>(info.canvas_height);
    out.rgba.assign(frame, frame + static_cast<size_t>(out.width) * out.height * 4);
    WebPAnimDecoderDelete(dec);
    return out;
  }
  int w = 0, h = 0;
  uint8_t* px = WebPDecodeRGBA(data, size, &w, &h);
  if (!px) return make_error("corrupt or truncated WebP: the image data does not decode");
  out.width = w;
  out.height = h;
  out.rgba.assign(px, px + static_cast<size_t>(w) * h * 4);
  WebPFree(px);
  return out;
}

}  // namespace sparkserve::media
