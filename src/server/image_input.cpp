#include "server/image_input.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>

#include "core/base64.h"
#include "media/image.h"

namespace sparkserve {
namespace {

namespace fs = std::filesystem;

bool starts_with_nocase(std::string_view s, std::string_view prefix) {
  if (s.size() < prefix.size()) return false;
  for (size_t i = 0; i < prefix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(s[i])) != prefix[i]) return false;
  return true;
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// The four formats the decoders take, by the MIME type a client declares. The bytes decide in the
// end (media::sniff_format): a declared type is only checked to be an image type we could read.
bool supported_image_mime(std::string_view mime) {
  const std::string m = lower(mime);
  return m == "image/jpeg" || m == "image/jpg" || m == "image/png" || m == "image/webp" || m == "image/gif";
}

// data:[<media type>][;base64],<data>: only base64 payloads (what the OpenAI SDK and vLLM send).
ApiResult<std::string> data_url_bytes(std::string_view url, const std::string& param) {
  const size_t comma = url.find(',');
  if (comma == std::string_view::npos)
    return bad_request("`" + param + "` is a data: URL without the ',' that starts its data.", param);
  const std::string_view header = url.substr(5, comma - 5);  // after "data:"
  const size_t semi = header.find(';');
  const std::string_view mime = header.substr(0, semi);
  bool base64 = false;
  for (size_t at = semi; at != std::string_view::npos;) {
    const size_t next = header.find(';', at + 1);
    const std::string_view p = header.substr(at + 1, next == std::string_view::npos ? std::string_view::npos : next - at - 1);
    if (lower(p) == "base64") base64 = true;
    at = next;
  }
  if (!base64)
    return bad_request("`" + param + "`: only base64 data: URLs are supported (data:image/png;base64,...).", param);
  if (!mime.empty() && !starts_with_nocase(mime, "image/"))
    return bad_request("`" + param + "`: the data: URL's media type is \"" + std::string(mime) +
                           "\"; an image type (image/jpeg, image/png, image/webp, image/gif) is required.",
                       param);
  auto bytes = base64_decode(url.substr(comma + 1));
  if (!bytes.ok()) return bad_request("`" + param + "`: " + bytes.message() + ".", param);
  if (bytes->empty()) return bad_request("`" + param + "`: the data: URL holds no data.", param);
  return std::move(*bytes);
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// file://[localhost]/abs/path with %XX escapes -> the file's bytes, if it lies inside the allowed
// folder after every symlink and ".." is resolved.
ApiResult<std::string> file_url_bytes(std::string_view url, const ImageInputOptions& opt, const std::string& param) {
  if (opt.allowed_local_media_path.empty())
    return bad_request("`" + param + "`: file:// URLs are refused unless the server runs with "
                       "--allowed-local-media-path DIR (send the image as a base64 data: URL instead).", param);
  std::string_view rest = url.substr(7);  // after "file://"
  if (starts_with_nocase(rest, "localhost/")) rest.remove_prefix(9);
  if (rest.empty() || rest[0] != '/')
    return bad_request("`" + param + "`: a file:// URL must name an absolute path on this host (file:///path).", param);
  std::string path;
  for (size_t i = 0; i < rest.size(); ++i) {
    if (rest[i] == '%') {
      const int hi = i + 2 < rest.size() ? hex_value(rest[i + 1]) : -1;
      const int lo = i + 2 < rest.size() ? hex_value(rest[i + 2]) : -1;
      if (hi < 0 || lo < 0) return bad_request("`" + param + "`: a bad %-escape in the file:// URL.", param);
      path.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (rest[i] == '?' || rest[i] == '#') {
      break;
    } else {
      path.push_back(rest[i]);
    }
  }
  if (path.find('\0') != std::string::npos) return bad_request("`" + param + "`: the path contains a NUL byte.", param);
  std::error_code ec;
  const fs::path real = fs::canonical(fs::path(path), ec);
  if (ec) return bad_request("`" + param + "`: cannot open " + path + " (" + ec.message() + ").", param);
  const fs::path rel = real.lexically_relative(opt.allowed_local_media_path);
  if (rel.empty() || *rel.begin() == "..")
    return bad_request("`" + param + "`: " + path + " is outside the folder --allowed-local-media-path allows.", param);
  const int fd = ::open(real.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return bad_request("`" + param + "`: cannot open " + path + ".", param);
  struct stat st {};
  std::string bytes;
  std::optional<ApiError> err;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    err = bad_request("`" + param + "`: " + path + " is not a regular file.", param);
  } else if (st.st_size > opt.max_file_bytes) {
    err = bad_request("`" + param + "`: " + path + " has " + std::to_string(st.st_size) + " bytes, more than the " +
                          std::to_string(opt.max_file_bytes) + " an image file may have.", param);
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t got = 0;
    while (got < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
      if (n <= 0) break;
      got += static_cast<size_t>(n);
    }
    bytes.resize(got);
    if (bytes.empty()) err = bad_request("`" + param + "`: " + path + " is empty.", param);
  }
  ::close(fd);
  if (err) return *err;
  return bytes;
}

std::string at(const std::string& base, size_t i) { return base + "[" + std::to_string(i) + "]"; }

}  // namespace

Expected<int64_t> parse_limit_mm_per_prompt(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return make_error("--limit-mm-per-prompt must be a JSON object such as '{\"image\": 4}'");
  int64_t images = 999;
  for (const auto& [key, v] : j.items()) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return make_error("--limit-mm-per-prompt: \"" + key + "\" must be a non-negative integer");
    if (key == "image") images = v.get<int64_t>();
    else if (v.get<int64_t>() != 0)
      return make_error("--limit-mm-per-prompt: \"" + key + "\" inputs are not supported (images only); give 0 or leave it out");
  }
  return images;
}

Status apply_mm_processor_kwargs(const std::string& text, media::PreprocessorConfig& p) {
  auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    return make_error("--mm-processor-kwargs must be a JSON object such as '{\"max_pixels\": 1003520}'");
  for (const auto& [key, v] : j.items()) {
    if (key != "min_pixels" && key != "max_pixels")
      return make_error("--mm-processor-kwargs: \"" + key + "\" is not supported (min_pixels, max_pixels)");
    if (!v.is_number_integer() || v.get<int64_t>() <= 0)
      return make_error("--mm-processor-kwargs: \"" + key + "\" must be a positive integer");
    (key == "min_pixels" ? p.min_pixels : p.max_pixels) = v.get<int64_t>();
  }
  if (p.min_pixels > p.max_pixels)
    return make_error("--mm-processor-kwargs: min_pixels " + std::to_string(p.min_pixels) + " exceeds max_pixels " +
                      std::to_string(p.max_pixels));
  return Status::Ok();
}

ApiResult<std::string> image_url_bytes(std::string_view url, const ImageInputOptions& opt, const std::string& param) {
  if (starts_with_nocase(url, "data:")) return data_url_bytes(url, param);
  if (starts_with_nocase(url, "file://")) return file_url_bytes(url, opt, param);
  if (starts_with_nocase(url, "http://") || starts_with_nocase(url, "https://"))
    return bad_request("`" + param + "`: this server does not fetch images over the network; send the image as a "
                       "base64 data: URL (data:image/png;base64,...).", param);
  return bad_request("`" + param + "` must be a data: URL (data:image/png;base64,...) or, where the server allows "
                     "it, a file:// URL.", param);
}

ApiResult<RequestJson> anthropic_image_block_to_chat_part(const RequestJson& block, const std::string& path) {
  auto src = block.find("source");
  if (src == block.end() || !src->is_object())
    return bad_request(path + ".source: must be an object such as {\"type\": \"base64\", \"media_type\": "
                       "\"image/png\", \"data\": \"...\"}", path + ".source");
  auto type = src->find("type");
  const std::string t = type != src->end() && type->is_string() ? type->get<std::string>() : "";
  if (t == "url")
    return bad_request(path + ".source: this server does not fetch images over the network; send a base64 source",
                       path + ".source.type");
  if (t != "base64") return bad_request(path + ".source.type: must be \"base64\"", path + ".source.type");
  auto mime = src->find("media_type");
  if (mime == src->end() || !mime->is_string() || !supported_image_mime(mime->get_ref<const std::string&>()))
    return bad_request(path + ".source.media_type: must be one of image/jpeg, image/png, image/gif, image/webp",
                       path + ".source.media_type");
  auto data = src->find("data");
  if (data == src->end() || !data->is_string())
    return bad_request(path + ".source.data: must be a base64 string", path + ".source.data");
  RequestJson part = RequestJson::object();
  part["type"] = "image_url";
  part["image_url"] = {{"url", "data:" + mime->get<std::string>() + ";base64," + data->get<std::string>()}};
  return part;
}

ApiResult<RequestJson> responses_image_part_to_chat_part(const RequestJson& part, const std::string& path) {
  auto url = part.find("image_url");
  if (url == part.end() || url->is_null()) {
    if (part.contains("file_id"))
      return bad_request(path + ".file_id: this server stores no files; send the image as image_url "
                         "(a data: URL)", path + ".file_id");
    return bad_request(path + ".image_url: is required (a data: URL)", path + ".image_url");
  }
  if (!url->is_string()) return bad_request(path + ".image_url: must be a string (a data: URL)", path + ".image_url");
  RequestJson image_url = {{"url", *url}};
  if (auto d = part.find("detail"); d != part.end() && !d->is_null()) {
    if (!d->is_string() || (*d != "auto" && *d != "low" && *d != "high"))
      return bad_request(path + ".detail: must be \"auto\", \"low\" or \"high\"", path + ".detail");
    image_url["detail"] = *d;
  }
  return RequestJson{{"type", "image_url"}, {"image_url", std::move(image_url)}};
}

ApiResult<media::PatchedImage> load_image(std::string_view bytes, const ImageInputOptions& opt,
                                          const std::string& param) {
  media::DecodeLimits limits;
  limits.max_source_pixels = opt.max_image_pixels;
  auto rgb = media::decode_image(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), limits);
  if (!rgb.ok()) return bad_request("`" + param + "`: cannot use this image: " + rgb.message() + ".", param);
  auto patched = media::preprocess_image(*rgb, opt.preprocessor);
  if (!patched.ok()) return bad_request("`" + param + "`: cannot use this image: " + patched.message() + ".", param);
  return std::move(*patched);
}

ApiResult<std::vector<media::PatchedImage>> load_chat_images(const RequestJson& messages,
                                                             const ImageInputOptions& opt) {
  std::vector<media::PatchedImage> images;
  if (!messages.is_array()) return images;
  for (size_t m = 0; m < messages.size(); ++m) {
    auto content = messages[m].find("content");
    if (content == messages[m].end() || !content->is_array()) continue;
    for (size_t i = 0; i < content->size(); ++i) {
      const RequestJson& part = (*content)[i];
      if (!part.is_object() || part.value("type", "") != "image_url") continue;
      const std::string param = at(at("messages", m) + ".content", i) + ".image_url";
      if (!opt.model_has_vision)
        return bad_request("`" + param + "`: this model has no vision tower (config.json vision_config and its "
                           "weights), so it cannot take images.", param);
      if (static_cast<int64_t>(images.size()) >= opt.max_images_per_prompt)
        return bad_request("At most " + std::to_string(opt.max_images_per_prompt) +
                               " image(s) may be provided in one prompt (--limit-mm-per-prompt).", param);
      const std::string& url = part["image_url"]["url"].get_ref<const std::string&>();  // checked by normalize
      auto bytes = image_url_bytes(url, opt, param + ".url");
      if (!bytes.ok()) return bytes.error();
      auto img = load_image(*bytes, opt, param);
      if (!img.ok()) return img.error();
      images.push_back(std::move(*img));
    }
  }
  return images;
}

ApiResult<std::shared_ptr<MultimodalPrompt>> expand_image_tokens(std::vector<int32_t>& ids,
                                                                 std::vector<media::PatchedImage> images,
                                                                 const ImageInputOptions& opt) {
  if (images.empty()) return std::shared_ptr<MultimodalPrompt>();
  auto mm = build_multimodal_prompt(ids, std::move(images), opt.vision);
  if (!mm.ok())
    return bad_request("the rendered prompt does not match the request's images: " + mm.message() +
                           " (image placeholder text such as <|image_pad|> inside a text part counts as one)",
                       "messages");
  return std::make_shared<MultimodalPrompt>(std::move(*mm));
}

}  // namespace sparkserve
