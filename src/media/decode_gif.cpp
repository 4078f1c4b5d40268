// GIF through giflib: the first image of the file only (later frames are never read), drawn on the
// logical screen. Pixels outside the first image's rectangle get the background colour (or are
// transparent when the frame declares a transparent index); transparent pixels become alpha 0.
#include <gif_lib.h>

#include <cstring>
#include <memory>

#include "media/image.h"

namespace sparkserve::media {

namespace {
struct MemReader {
  const uint8_t* data;
  size_t size;
  size_t pos;
};

int read_fn(GifFileType* gif, GifByteType* dst, int n) {
  auto* r = static_cast<MemReader*>(gif->UserData);
  const size_t take = std::min(static_cast<size_t>(std::max(n, 0)), r->size - r->pos);
  std::memcpy(dst, r->data + r->pos, take);
  r->pos += take;
  return static_cast<int>(take);
}

struct GifCloser {
  void operator()(GifFileType* g) const {
    int err = 0;
    DGifCloseFile(g, &err);
  }
};

std::string gif_error(const char* what, int code) {
  const char* msg = GifErrorString(code);
  return std::string("corrupt or truncated GIF: ") + what + (msg ? std::string(" (") + msg + ")" : "");
}
}  // namespace

Expected<RgbaImage> decode_gif(const uint8_t* data, size_t size, const DecodeLimits& limits) {
  MemReader reader{data, size, 0};
  int err = 0;
  std::unique_ptr<GifFileType, GifCloser> gif(DGifOpen(&reader, read_fn, &err));
  if (!gif) return make_error(gif_error("cannot read the header", err));
  const int W = gif->SWidth, H = gif->SHeight;
  SS_RETURN_IF_ERROR(check_dimensions("GIF", W, H, limits));

  int transparent = -1;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif.get(), &type) == GIF_ERROR) return make_error(gif_error("bad record", gif->Error));
    if (type == TERMINATE_RECORD_TYPE) return make_error("GIF holds no image");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif.get(), &code, &ext) == GIF_ERROR)
        return make_error(gif_error("bad extension", gif->Error));
      if (code == GRAPHICS_EXT_FUNC_CODE && ext && ext[0] >= 4 && (ext[1] & 1)) transparent = ext[4];
      while (ext) {
        if (DGifGetExtensionNext(gif.get(), &ext) == GIF_ERROR)
          return make_error(gif_error("bad extension", gif->Error));
      }
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif.get()) == GIF_ERROR) return make_error(gif_error("bad image descriptor", gif->Error));
    const GifImageDesc& d = gif->Image;
    const ColorMapObject* map = d.ColorMap ? d.ColorMap : gif->SColorMap;
    if (!map || map->ColorCount <= 0) return make_error("GIF image has no colour table");
    if (d.Width <= 0 || d.Height <= 0 || static_cast<int64_t>(d.Width) * d.Height > limits.max_source_pixels)
      return make_error("GIF image rectangle of " + std::to_string(d.Width) + "x" + std::to_string(d.Height) +
                        " is invalid or too large");
    std::vector<GifPixelType> idx(static_cast<size_t>(d.Width) * d.Height);
    if (d.Interlace) {
      static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
      for (int pass = 0; pass < 4; ++pass)
        for (int y = kStart[pass]; y < d.Height; y += kStep[pass])
          if (DGifGetLine(gif.get(), &idx[static_cast<size_t>(y) * d.Width], d.Width) == GIF_ERROR)
            return make_error(gif_error("the image data ends early", gif->Error));
    } else {
      for (int y = 0; y < d.Height; ++y)
        if (DGifGetLine(gif.get(), &idx[static_cast<size_t>(y) * d.Width], d.Width) == GIF_ERROR)
          return make_error(gif_error("the image data ends early", gif->Error));
    }
    auto put = [&](uint8_t* o, int i) {
      if (i == transparent) {
        o[0] = o[1] = o[2] = 0;
        o[3] = 0;
        return;
      }
      const GifColorType& c = map->Colors[i < map->ColorCount ? i : 0];
      o[0] = c.Red;
      o[1] = c.Green;
      o[2] = c.Blue;
      o[3] = 255;
    };
    RgbaImage out;
    out.width = W;
    out.height = H;
    out.rgba.resize(static_cast<size_t>(W) * H * 4);
    const int background = transparent >= 0 ? transparent : gif->SBackGroundColor;
    for (size_t p = 0; p < static_cast<size_t>(W) * H; ++p) put(&out.rgba[p * 4], background);
    for (int y = 0; y < d.Height; ++y) {
      const int cy = d.Top + y;
      if (cy < 0 || cy >= H) continue;
      for (int x = 0; x < d.Width; ++x) {
        const int cx = d.Left + x;
        if (cx < 0 || cx >= W) continue;
        put(&out.rgba[(static_cast<size_t>(cy) * W + cx) * 4], idx[static_cast<size_t>(y) * d.Width + x]);
      }
    }
    return out;
  }
}

}  // namespace sparkserve::media
