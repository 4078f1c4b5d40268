// Reading safetensors checkpoints: one file, or a folder of shards. Every *.safetensors file in
// the folder is indexed (model.safetensors.index.json is only a cross-check), so extra shards
// such as separately stored MTP weights are found. Headers are validated on open; tensor bytes are
// read on demand with pread (no mmap, so the page cache does not double memory use).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace sparkserve {

struct TensorInfo {
  std::string name;
  std::filesystem::path file;  // the shard holding it
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;  // absolute byte offset of the data in `file`
  uint64_t nbytes = 0;
  int64_t numel() const;
};

// One validated safetensors file.
class SafetensorsFile {
 public:
  // Parses and validates the header: well-formed JSON, known dtypes, byte size = dtype x shape,
  // offsets inside the file, non-overlapping. Errors name the file (and tensor).
  static Expected<SafetensorsFile> open(const std::filesystem::path& path);
  // The same validation on a whole file image held in memory (tests, fuzzing); `path` only names
  // the file in messages and in TensorInfo::file.
  static Expected<SafetensorsFile> from_bytes(const std::filesystem::path& path, std::string_view bytes);
  // Validates a header given its JSON text and the total size of the file it came from (the data
  // buffer is file_size - 8 - header_json.size() bytes).
  static Expected<SafetensorsFile> parse_header(const std::filesystem::path& path,
                                                std::string_view header_json, uint64_t file_size);

  const std::filesystem::path& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::filesystem::path path_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint folder (or a single .safetensors file). Reads are thread-safe (each
// call uses its own file descriptor), so weights may be loaded from several threads.
class Checkpoint {
 public:
  // Indexes every *.safetensors in `dir` (or the single file `dir` names). A tensor name present in
  // two files is an error naming both; an index.json that names a missing file or a tensor that is
  // not where it says is an error too.
  static Expected<Checkpoint> open(const std::filesystem::path& dir);

  // The folder holding the checkpoint (for a single file: its parent), where config.json lives.
  const std::filesystem::path& dir() const { return dir_; }
  // nullptr when absent.
  const TensorInfo* find(const std::string& name) const;
  // The tensor a model needs, with exactly `shape`: errors say "<dir>: tensor 'x' is missing" or
  // "<file>: tensor 'x' has shape [..] but <why> needs [..]" (`why` e.g. "config.json").
  Expected<const TensorInfo*> require(const std::string& name, const std::vector<int64_t>& shape,
                                      const std::string& why = "config.json") const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::vector<std::filesystem::path>& files() const { return files_; }

  // Reads the tensor's bytes into dst (info.nbytes bytes) with pread; errors name file and tensor
  // (e.g. a file truncated after its header was read).
  Status read(const TensorInfo& info, void* dst) const;
  // kDrop: the pages read are dropped from the page cache afterwards (posix_fadvise DONTNEED, range
  // widened to whole pages so no page at a piece boundary is left behind), for loads that must not
  // leave a second copy of the checkpoint in memory.
  enum class PageCache { kKeep, kDrop };
  // Reads bytes [byte_begin, byte_begin + nbytes) of the tensor's data (e.g. one expert of a fused
  // [E, ...] tensor); the range must lie inside the tensor.
  Status read_bytes(const TensorInfo& info, uint64_t byte_begin, uint64_t nbytes, void* dst,
                    PageCache cache = PageCache::kKeep) const;
  // posix_fadvise(DONTNEED) over the whole tensor (widened to pages) / over every file of the
  // checkpoint. A page-cache folio is dropped only when it lies wholly inside the range, and folios
  // can be larger than one piece read (up to 2 MiB: e.g. pages cached when the file was written), so
  // the loader also drops each tensor once it is read, and every file at the end. Advisory.
  void drop_cached(const TensorInfo& info) const;
  void drop_cached_files() const;
  // Reads and converts a float tensor (F32/F16/BF16/F8_E4M3/F8_E5M2/F64) to f32, streaming through a
  // small buffer (no second full-size copy).
  Expected<std::vector<float>> read_f32(const TensorInfo& info) const;

 private:
  std::filesystem::path dir_;
  std::vector<std::filesystem::path> files_;
  std::map<std::string, TensorInfo> tensors_;
};

// Writes a safetensors file (used by tests, fixtures and `sparkserve synth`). Tensors are written in
// the order given, header padded with spaces to a multiple of 8 as the reference writer does.
struct TensorToWrite {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  const void* data;  // nbytes = numel * dtype_size
};
Status write_safetensors(const std::filesystem::path& path, const std::vector<TensorToWrite>& tensors,
                         const std::map<std::string, std::string>& metadata = {});

// Streaming writer for files too large to hold in memory (`sparkserve synth`): the header is written
// from the specs up front, then the data section is appended in order, in pieces of any size.
// A writer destroyed before finish() succeeded removes its partial file.
struct TensorSpec {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};
class SafetensorsWriter {
 public:
  // Validates the specs (unique non-empty names, non-negative dims, no size overflow) and writes the
  // header. Tensor i's data is expected right after tensor i-1's.
  static Expected<SafetensorsWriter> create(const std::filesystem::path& path,
                                            const std::vector<TensorSpec>& specs,
                                            const std::map<std::string, std::string>& metadata = {});
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;
  ~SafetensorsWriter();

  // Appends the next nbytes of the data section; writing past the declared total is an error.
  Status append(const void* data, uint64_t nbytes);
  // Checks that exactly the declared number of bytes was written and closes the file.
  Status finish();
  uint64_t data_bytes_total() const { return total_; }
  uint64_t data_bytes_written() const { return written_; }

 private:
  SafetensorsWriter() = default;
  void abandon();
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t total_ = 0;
  uint64_t written_ = 0;
};

}  // namespace sparkserve
