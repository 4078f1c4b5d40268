#include "loader/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <system_error>
#include <utility>

#include "core/tensor.h"

namespace sparkserve {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The reference implementation's limit (safetensors MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kIndexFileName = "model.safetensors.index.json";

std::string errno_text(int err) { return std::error_code(err, std::generic_category()).message(); }

// A safetensors header is {name: {"dtype", "shape": [...], "data_offsets": [...]}} plus
// "__metadata__": {str: str}: three levels of brackets. The JSON parser would build a node per
// bracket (99 MB of '[' took 30 s and 7 GiB), so the nesting is checked first, in one pass over
// the bytes and chunk by chunk as they are read, which refuses such a file after its first bytes.
constexpr int kMaxHeaderDepth = 8;

class NestingScan {
 public:
  // False once the bytes so far nest deeper than kMaxHeaderDepth; `where` is then set.
  bool feed(std::string_view bytes, uint64_t offset, std::string& where) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      const char c = bytes[i];
      if (in_string_) {
        if (escape_) escape_ = false;
        else if (c == '\\') escape_ = true;
        else if (c == '"') in_string_ = false;
      } else if (c == '"') {
        in_string_ = true;
      } else if (c == '[' || c == '{') {
        if (++depth_ > kMaxHeaderDepth) {
          where = "bad header: JSON nested deeper than " + std::to_string(kMaxHeaderDepth) + " levels at byte " +
                  std::to_string(offset + i) + " (a safetensors header is 3 deep)";
          return false;
        }
      } else if ((c == ']' || c == '}') && depth_ > 0) {
        --depth_;
      }
    }
    return true;
  }

 private:
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
};

Error file_error(const fs::path& path, const std::string& what) {
  return make_error(path.string() + ": " + what);
}
Error tensor_error(const fs::path& path, const std::string& name, const std::string& what) {
  return make_error(path.string() + ": tensor '" + name + "': " + what);
}

std::string known_dtype_names() {
  std::string s;
  for (int i = 0; i <= static_cast<int>(DType::kBool); ++i) {
    if (i) s += ", ";
    s += dtype_name(static_cast<DType>(i));
  }
  return s;
}

// A short description of a JSON value's type for messages (never dumps attacker-sized content).
std::string json_kind(const json& v) { return v.type_name(); }

uint64_t read_u64_le(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Owns a POSIX file descriptor.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

Expected<Fd> open_for_read(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return file_error(path, "file not found");
    return file_error(path, "cannot open: " + errno_text(err));
  }
  Fd owned(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) return file_error(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(st.st_mode)) return file_error(path, "not a regular file");
  return owned;
}

Expected<uint64_t> file_size(const Fd& fd, const fs::path& path) {
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return file_error(path, "cannot stat: " + errno_text(errno));
  return static_cast<uint64_t>(st.st_size);
}

// Reads exactly n bytes at `offset`; `what` describes the bytes for the truncation message.
Status pread_exact(const Fd& fd, const fs::path& path, void* dst, uint64_t n, uint64_t offset,
                   const std::string& what) {
  auto* out = static_cast<unsigned char*>(dst);
  uint64_t done = 0;
  while (done < n) {
    // Linux transfers at most ~2 GiB per call.
    size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, 1ull << 30));
    ssize_t got = ::pread(fd.get(), out + done, want, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return file_error(path, "read error in " + what + ": " + errno_text(errno));
    }
    if (got == 0) {
      return file_error(path, "file is truncated: " + what + " needs bytes [" +
                                  std::to_string(offset) + ", " + std::to_string(offset + n) +
                                  ") but the file ends at byte " + std::to_string(offset + done));
    }
    done += static_cast<uint64_t>(got);
  }
  return Status::Ok();
}

// Drops bytes [begin, begin + n) of the file from the page cache. Linux drops only pages wholly
// inside the range: widen it to page boundaries (a neighbour's page dropped early costs one re-read
// of that page; a page kept per piece would pile up: one per expert tensor of a 122B checkpoint is
// ~1 GB). Advisory: a failure changes nothing.
void drop_range(const Fd& fd, uint64_t begin, uint64_t n) {
  static const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t lo = begin / page * page, hi = (begin + n + page - 1) / page * page;
  (void)::posix_fadvise(fd.get(), static_cast<off_t>(lo), static_cast<off_t>(hi - lo), POSIX_FADV_DONTNEED);
}

// numel of a validated shape, or nullopt on int64 overflow.
std::optional<int64_t> checked_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

// Parses one header entry into `info` (name already set).
Status parse_entry(const fs::path& path, const std::string& name, const json& entry,
                   uint64_t data_start, uint64_t data_size, TensorInfo& info) {
  if (!entry.is_object())
    return tensor_error(path, name, "header entry must be an object, got " + json_kind(entry));
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) return tensor_error(path, name, std::string("header entry lacks \"") + key + "\"");
  }
  const json& dt = entry.at("dtype");
  if (!dt.is_string()) return tensor_error(path, name, "\"dtype\" must be a string, got " + json_kind(dt));
  const std::string dtype_str = dt.get<std::string>();
  auto dtype = parse_dtype(dtype_str);
  if (!dtype) {
    return tensor_error(path, name,
                        "unknown dtype \"" + dtype_str + "\" (supported: " + known_dtype_names() + ")");
  }
  info.dtype = *dtype;

  const json& shape = entry.at("shape");
  if (!shape.is_array()) return tensor_error(path, name, "\"shape\" must be an array, got " + json_kind(shape));
  info.shape.clear();
  for (const json& d : shape) {
    // JSON integers >= 0 that fit int64; nlohmann stores non-negative literals as unsigned.
    if (d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)) {
      info.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
    } else if (d.is_number_integer() && !d.is_number_unsigned()) {
      return tensor_error(path, name, "\"shape\" has a negative dimension " + std::to_string(d.get<int64_t>()));
    } else {
      return tensor_error(path, name, "\"shape\" entries must be non-negative integers, got " +
                                          (d.is_number() ? d.dump() : json_kind(d)));
    }
  }
  auto numel = checked_numel(info.shape);
  uint64_t expected_bytes = 0;
  if (!numel || __builtin_mul_overflow(static_cast<uint64_t>(*numel), dtype_size(info.dtype), &expected_bytes)) {
    return tensor_error(path, name, "shape " + shape_to_string(info.shape) + " overflows 64-bit byte counts");
  }

  const json& offs = entry.at("data_offsets");
  if (!offs.is_array() || offs.size() != 2 || !offs[0].is_number_unsigned() || !offs[1].is_number_unsigned()) {
    return tensor_error(path, name, "\"data_offsets\" must be [begin, end] with non-negative integers");
  }
  uint64_t begin = offs[0].get<uint64_t>(), end = offs[1].get<uint64_t>();
  std::string range = "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
  if (end < begin) return tensor_error(path, name, "data_offsets " + range + " end before they begin");
  if (end - begin != expected_bytes) {
    return tensor_error(path, name,
                        "size mismatch: shape " + shape_to_string(info.shape) + " of " + dtype_str + " needs " +
                            std::to_string(expected_bytes) + " bytes but data_offsets " + range + " span " +
                            std::to_string(end - begin));
  }
  if (end > data_size) {
    return tensor_error(path, name,
                        "data_offsets " + range + " run past the end of the data buffer (" +
                            std::to_string(data_size) + " bytes; file truncated?)");
  }
  info.offset = data_start + begin;
  info.nbytes = expected_bytes;
  return Status::Ok();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated against overflow when the header was parsed
  return n;
}

Expected<SafetensorsFile> SafetensorsFile::parse_header(const fs::path& path, std::string_view header_json,
                                                        uint64_t file_size) {
  const uint64_t header_len = header_json.size();
  if (header_len > kMaxHeaderBytes) {
    return file_error(path, "header length " + std::to_string(header_len) + " exceeds the " +
                                std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (file_size < 8 || header_len > file_size - 8) {
    return file_error(path, "file is truncated: header length " + std::to_string(header_len) + " needs " +
                                std::to_string(header_len + 8) + " bytes but the file has " +
                                std::to_string(file_size));
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = file_size - data_start;

  std::string too_deep;
  if (!NestingScan().feed(header_json, 8, too_deep)) return file_error(path, too_deep);
  json header = json::parse(header_json.begin(), header_json.end(), nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return file_error(path, "bad header: not well-formed JSON");
  if (!header.is_object()) return file_error(path, "bad header: expected a JSON object, got " + json_kind(header));

  SafetensorsFile file;
  file.path_ = path;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return file_error(path, "bad header: __metadata__ must be an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string())
          return file_error(path, "bad header: __metadata__ value for '" + k + "' must be a string");
        file.metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    TensorInfo info;
    info.name = name;
    info.file = path;
    SS_RETURN_IF_ERROR(parse_entry(path, name, entry, data_start, data_size, info));
    file.tensors_.push_back(std::move(info));
  }

  // Overlap check over data ranges sorted by start; empty tensors occupy no bytes.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : file.tensors_)
    if (t.nbytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->offset != b->offset ? a->offset < b->offset : a->name < b->name;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1];
    const TensorInfo& cur = *by_offset[i];
    if (cur.offset < prev.offset + prev.nbytes) {
      auto rel = [&](const TensorInfo& t) {
        std::string s = "[";  // built piecewise: GCC 12 warns (-Wrestrict) on "[" + std::to_string(...)
        s += std::to_string(t.offset - data_start);
        s += ", ";
        s += std::to_string(t.offset - data_start + t.nbytes);
        s += ")";
        return s;
      };
      return file_error(path, "tensors '" + prev.name + "' " + rel(prev) + " and '" + cur.name + "' " + rel(cur) +
                                  " overlap");
    }
  }
  // Keep tensors in file order: readers of one file then stream sequentially.
  std::sort(file.tensors_.begin(), file.tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return a.offset != b.offset ? a.offset < b.offset : a.name < b.name;
            });
  return file;
}

Expected<SafetensorsFile> SafetensorsFile::from_bytes(const fs::path& path, std::string_view bytes) {
  if (bytes.size() < 8) {
    return file_error(path, "file is truncated: " + std::to_string(bytes.size()) +
                                " bytes, shorter than the 8-byte header length");
  }
  uint64_t n = read_u64_le(reinterpret_cast<const unsigned char*>(bytes.data()));
  if (n > kMaxHeaderBytes) {
    return file_error(path, "header length " + std::to_string(n) + " exceeds the " +
                                std::to_string(kMaxHeaderBytes) + "-byte limit");
  }
  if (n > bytes.size() - 8) {
    return file_error(path, "file is truncated: header length " + std::to_string(n) + " needs " +
                                std::to_string(n + 8) + " bytes but the file has " + std::to_string(bytes.size()));
  }
  return parse_header(path, bytes.substr(8, n), bytes.size());
}

Expected<SafetensorsFile> SafetensorsFile::open(const fs::path& path) {
  SS_ASSIGN_OR_RETURN(Fd fd, open_for_read(path));
  SS_ASSIGN_OR_RETURN(uint64_t size, file_size(fd, path));
  if (size < 8) {
    return file_error(path, "file is truncated: " + std::to_string(size) +
                                " bytes, shorter than the 8-byte header length");
  }
  unsigned char len_bytes[8];
  SS_RETURN_IF_ERROR(pread_exact(fd, path, len_bytes, 8, 0, "the header length"));
  uint64_t n = read_u64_le(len_bytes);
  if (n > kMaxHeaderBytes) {
    return file_error(path, "header length " + std::to_string(n) + " exceeds the " +
                                std::to_string(kMaxHeaderBytes) + "-byte limit (not a safetensors file?)");
  }
  if (n > size - 8) {
    return file_error(path, "file is truncated: header length " + std::to_string(n) + " needs " +
                                std::to_string(n + 8) + " bytes but the file has " + std::to_string(size));
  }
  // Read in chunks, checking the nesting as it comes: a hostile header is refused after its first
  // chunk, never read (or held in memory) whole.
  std::string header;  // grows with what was read, so a refused header never costs its full size
  NestingScan scan;
  std::string too_deep;
  constexpr uint64_t kChunk = 1 << 20;
  for (uint64_t at = 0; at < n; at += kChunk) {
    const uint64_t len = std::min(kChunk, n - at);
    const size_t old = header.size();
    header.resize(old + static_cast<size_t>(len));
    SS_RETURN_IF_ERROR(pread_exact(fd, path, header.data() + old, len, 8 + at, "the header"));
    if (!scan.feed(std::string_view(header).substr(old), 8 + at, too_deep)) return file_error(path, too_deep);
  }
  return parse_header(path, header, size);
}

// ---------------------------------------------------------------------------------------------
// Checkpoint

namespace {

Status cross_check_index(const fs::path& dir, const fs::path& index_path,
                         const std::map<std::string, TensorInfo>& tensors,
                         const std::vector<fs::path>& files) {
  const std::string idx = index_path.string();
  Expected<Fd> fd = open_for_read(index_path);
  if (!fd.ok()) return fd.error();
  SS_ASSIGN_OR_RETURN(uint64_t size, file_size(*fd, index_path));
  if (size > 1'000'000'000) return make_error(idx + ": implausibly large (" + std::to_string(size) + " bytes)");
  std::string text(size, '\0');
  SS_RETURN_IF_ERROR(pread_exact(*fd, index_path, text.data(), size, 0, "the index"));
  json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded()) return make_error(idx + ": not well-formed JSON");
  if (!index.is_object() || !index.contains("weight_map") || !index.at("weight_map").is_object())
    return make_error(idx + ": expected an object with a \"weight_map\" object");

  for (const auto& [name, file_value] : index.at("weight_map").items()) {
    if (!file_value.is_string())
      return make_error(idx + ": weight_map entry for tensor '" + name + "' must be a file name string");
    const std::string file_name = file_value.get<std::string>();
    const fs::path listed = (dir / file_name).lexically_normal();
    bool present = std::any_of(files.begin(), files.end(),
                               [&](const fs::path& f) { return f.lexically_normal() == listed; });
    if (!present) {
      return make_error(idx + ": tensor '" + name + "' is mapped to " + listed.string() +
                        ", which is not a *.safetensors file in the checkpoint folder (missing file?)");
    }
    auto it = tensors.find(name);
    if (it == tensors.end()) {
      return make_error(idx + ": tensor '" + name + "' is mapped to " + listed.string() +
                        ", but that file does not contain it (no file does)");
    }
    if (it->second.file.lexically_normal() != listed) {
      return make_error(idx + ": tensor '" + name + "' is mapped to " + listed.string() +
                        ", but it is stored in " + it->second.file.string());
    }
  }
  return Status::Ok();
}

}  // namespace

Expected<Checkpoint> Checkpoint::open(const fs::path& dir) {
  Checkpoint ckpt;
  std::error_code ec;
  fs::file_status st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) return make_error(dir.string() + ": checkpoint path not found");

  if (fs::is_regular_file(st)) {
    ckpt.dir_ = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
    ckpt.files_.push_back(dir);
  } else if (fs::is_directory(st)) {
    ckpt.dir_ = dir;
    fs::directory_iterator it(dir, ec), end;
    if (ec) return make_error(dir.string() + ": cannot list folder: " + ec.message());
    for (; it != end; it.increment(ec)) {
      if (ec) return make_error(dir.string() + ": cannot list folder: " + ec.message());
      const fs::path& p = it->path();
      std::error_code file_ec;
      if (p.extension() == ".safetensors" && fs::is_regular_file(p, file_ec)) ckpt.files_.push_back(p);
    }
    if (ec) return make_error(dir.string() + ": cannot list folder: " + ec.message());
    std::sort(ckpt.files_.begin(), ckpt.files_.end());
    if (ckpt.files_.empty()) return make_error(dir.string() + ": no *.safetensors files in the checkpoint folder");
  } else {
    return make_error(dir.string() + ": not a folder or a .safetensors file");
  }

  for (const fs::path& f : ckpt.files_) {
    SS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(f));
    for (const TensorInfo& t : file.tensors()) {
      auto [pos, inserted] = ckpt.tensors_.emplace(t.name, t);
      if (!inserted) {
        return make_error("tensor '" + t.name + "' is stored twice: in " + pos->second.file.string() + " and in " +
                          f.string());
      }
    }
  }

  const fs::path index_path = ckpt.dir_ / kIndexFileName;
  if (fs::is_directory(st) && fs::exists(index_path, ec)) {
    SS_RETURN_IF_ERROR(cross_check_index(ckpt.dir_, index_path, ckpt.tensors_, ckpt.files_));
  }
  return ckpt;
}

const TensorInfo* Checkpoint::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Expected<const TensorInfo*> Checkpoint::require(const std::string& name, const std::vector<int64_t>& shape,
                                                const std::string& why) const {
  const TensorInfo* info = find(name);
  if (!info) return make_error(dir_.string() + ": tensor '" + name + "' is missing (" + why + " needs it)");
  if (info->shape != shape) {
    return tensor_error(info->file, name,
                        "has shape " + shape_to_string(info->shape) + " but " + why + " needs " + shape_to_string(shape));
  }
  return info;
}

Status Checkpoint::read_bytes(const TensorInfo& info, uint64_t byte_begin, uint64_t nbytes, void* dst,
                              PageCache cache) const {
  if (byte_begin > info.nbytes || nbytes > info.nbytes - byte_begin) {
    return tensor_error(info.file, info.name,
                        "read of bytes [" + std::to_string(byte_begin) + ", +" + std::to_string(nbytes) +
                            ") is outside the tensor's " + std::to_string(info.nbytes) + " bytes");
  }
  if (nbytes == 0) return Status::Ok();
  SS_ASSIGN_OR_RETURN(Fd fd, open_for_read(info.file));
  SS_ASSIGN_OR_RETURN(uint64_t size, file_size(fd, info.file));
  const uint64_t begin = info.offset + byte_begin;
  if (begin + nbytes > size) {
    return tensor_error(info.file, info.name,
                        "file is truncated: the tensor needs bytes [" + std::to_string(begin) + ", " +
                            std::to_string(begin + nbytes) + ") but the file now has " + std::to_string(size) +
                            " bytes");
  }
  SS_RETURN_IF_ERROR(pread_exact(fd, info.file, dst, nbytes, begin, "tensor '" + info.name + "'"));
  if (cache == PageCache::kDrop) drop_range(fd, begin, nbytes);
  return Status::Ok();
}

void Checkpoint::drop_cached(const TensorInfo& info) const {
  auto fd = open_for_read(info.file);
  if (fd.ok()) drop_range(*fd, info.offset, info.nbytes);
}

void Checkpoint::drop_cached_files() const {
  for (const auto& file : files_) {
    auto fd = open_for_read(file);
    if (fd.ok()) (void)::posix_fadvise(fd->get(), 0, 0, POSIX_FADV_DONTNEED);  // 0 length: to the end
  }
}

Status Checkpoint::read(const TensorInfo& info, void* dst) const { return read_bytes(info, 0, info.nbytes, dst); }

Expected<std::vector<float>> Checkpoint::read_f32(const TensorInfo& info) const {
  const size_t esize = dtype_size(info.dtype);
  float (*convert)(const unsigned char*) = nullptr;
  switch (info.dtype) {
    case DType::kF32:
      convert = [](const unsigned char* p) { float f; std::memcpy(&f, p, 4); return f; };
      break;
    case DType::kF64:
      convert = [](const unsigned char* p) { double d; std::memcpy(&d, p, 8); return static_cast<float>(d); };
      break;
    case DType::kF16:
      convert = [](const unsigned char* p) { uint16_t h; std::memcpy(&h, p, 2); return f16_to_f32(h); };
      break;
    case DType::kBF16:
      convert = [](const unsigned char* p) { uint16_t h; std::memcpy(&h, p, 2); return bf16_to_f32(h); };
      break;
    case DType::kF8E4M3:
      convert = [](const unsigned char* p) { return fp8_e4m3_to_f32(*p); };
      break;
    case DType::kF8E5M2:
      convert = [](const unsigned char* p) { return fp8_e5m2_to_f32(*p); };
      break;
    default:
      return tensor_error(info.file, info.name,
                          "dtype " + std::string(dtype_name(info.dtype)) + " is not a float type; cannot read as f32");
  }
  const uint64_t n = static_cast<uint64_t>(info.numel());
  std::vector<float> out(n);
  constexpr uint64_t kChunkElems = 1 << 18;
  std::vector<unsigned char> buf(std::min<uint64_t>(n, kChunkElems) * esize);
  for (uint64_t i = 0; i < n; i += kChunkElems) {
    const uint64_t m = std::min<uint64_t>(kChunkElems, n - i);
    SS_RETURN_IF_ERROR(read_bytes(info, i * esize, m * esize, buf.data()));
    for (uint64_t j = 0; j < m; ++j) out[i + j] = convert(buf.data() + j * esize);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      total_(o.total_),
      written_(o.written_) {}

SafetensorsWriter& SafetensorsWriter::operator=(SafetensorsWriter&& o) noexcept {
  if (this != &o) {
    abandon();
    path_ = std::move(o.path_);
    fd_ = std::exchange(o.fd_, -1);
    total_ = o.total_;
    written_ = o.written_;
  }
  return *this;
}

SafetensorsWriter::~SafetensorsWriter() { abandon(); }

void SafetensorsWriter::abandon() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  std::error_code ec;
  fs::remove(path_, ec);  // a partial file must not look like a checkpoint
}

namespace {
Status write_all(int fd, const fs::path& path, const void* data, uint64_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  while (n > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    ssize_t w = ::write(fd, p, want);
    if (w < 0) {
      if (errno == EINTR) continue;
      return file_error(path, "write failed: " + errno_text(errno));
    }
    p += w;
    n -= static_cast<uint64_t>(w);
  }
  return Status::Ok();
}
}  // namespace

Expected<SafetensorsWriter> SafetensorsWriter::create(const fs::path& path, const std::vector<TensorSpec>& specs,
                                                      const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorSpec& s : specs) {
    if (s.name.empty() || s.name == "__metadata__")
      return file_error(path, "cannot write a tensor named '" + s.name + "'");
    if (header.contains(s.name)) return tensor_error(path, s.name, "tensor name given twice");
    for (int64_t d : s.shape)
      if (d < 0) return tensor_error(path, s.name, "negative dimension in shape " + shape_to_string(s.shape));
    auto numel = checked_numel(s.shape);
    uint64_t nbytes = 0;
    if (!numel || __builtin_mul_overflow(static_cast<uint64_t>(*numel), dtype_size(s.dtype), &nbytes) ||
        __builtin_add_overflow(offset, nbytes, &nbytes)) {
      return tensor_error(path, s.name, "size overflows 64 bits");
    }
    header[s.name] = {{"dtype", std::string(dtype_name(s.dtype))},
                      {"shape", s.shape},
                      {"data_offsets", {offset, nbytes}}};
    offset = nbytes;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not valid UTF-8
    return file_error(path, std::string("cannot encode header: ") + e.what());
  }
  // Pad so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kMaxHeaderBytes) return file_error(path, "header would exceed the 100 MB limit");

  SafetensorsWriter w;
  w.path_ = path;
  w.total_ = offset;
  w.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return file_error(path, "cannot create: " + errno_text(errno));
  unsigned char len[8];
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  SS_RETURN_IF_ERROR(write_all(w.fd_, path, len, 8));
  SS_RETURN_IF_ERROR(write_all(w.fd_, path, text.data(), text.size()));
  return w;
}

Status SafetensorsWriter::append(const void* data, uint64_t nbytes) {
  if (fd_ < 0) return file_error(path_, "writer is closed");
  if (nbytes > total_ - written_) {
    return file_error(path_, "more data appended (" + std::to_string(written_ + nbytes) +
                                 " bytes) than the header declares (" + std::to_string(total_) + ")");
  }
  Status s = write_all(fd_, path_, data, nbytes);
  if (!s.ok()) {
    abandon();
    return s;
  }
  written_ += nbytes;
  return Status::Ok();
}

Status SafetensorsWriter::finish() {
  if (fd_ < 0) return file_error(path_, "writer is closed");
  if (written_ != total_) {
    abandon();
    return file_error(path_, "only " + std::to_string(written_) + " of " + std::to_string(total_) +
                                 " data bytes were written");
  }
  int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) {
    std::error_code ec;
    int err = errno;
    fs::remove(path_, ec);
    return file_error(path_, "close failed: " + errno_text(err));
  }
  return Status::Ok();
}

Status write_safetensors(const fs::path& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& t : tensors) specs.push_back({t.name, t.dtype, t.shape});
  SS_ASSIGN_OR_RETURN(SafetensorsWriter writer, SafetensorsWriter::create(path, specs, metadata));
  for (const auto& t : tensors) {
    uint64_t nbytes = static_cast<uint64_t>(*checked_numel(t.shape)) * dtype_size(t.dtype);  // validated by create
    if (nbytes > 0 && t.data == nullptr) return tensor_error(path, t.name, "no data given");
    SS_RETURN_IF_ERROR(writer.append(t.data, nbytes));
  }
  return writer.finish();
}

}  // namespace sparkserve
