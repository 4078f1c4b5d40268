// Streaming load (issue 4, item 5): sizes parse with clear errors, tensors larger than the staging
// buffer stream in pieces and land bit-identical, a whole model loads bit-identical under a tiny
// budget and under the default, the staging buffer never exceeds the budget, the ranges read are
// dropped from the page cache, and the progress line has the documented shape.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>
#include <fcntl.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <random>
#include <regex>

#include "backend/cpu/cpu_backend.h"
#include "core/dtype.h"
#include "loader/hf_config.h"
#include "loader/load_options.h"
#include "loader/load_progress.h"
#include "loader/safetensors.h"
#include "loader/weight_stream.h"
#include "loader/weights.h"
#include "temp_dir.h"

namespace sparkserve {
namespace {

using ::testing::HasSubstr;
using testing::TempDir;

std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures" / name;
}

TEST(LoadBuffer, ParsesSizesWithUnits) {
  EXPECT_EQ(*parse_byte_size("65536", "--x"), 65536u);
  EXPECT_EQ(*parse_byte_size("4GiB", "--x"), 4ull << 30);
  EXPECT_EQ(*parse_byte_size("4g", "--x"), 4ull << 30);
  EXPECT_EQ(*parse_byte_size("512MiB", "--x"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("1.5GB", "--x"), 1500000000ull);
  EXPECT_EQ(*parse_byte_size("64k", "--x"), 65536u);
  EXPECT_EQ(*parse_byte_size("1 MiB", "--x"), 1ull << 20);
  EXPECT_EQ(*parse_load_buffer("1MiB"), 1ull << 20);
}

TEST(LoadBuffer, MalformedOrTooSmallIsAClearError) {
  for (const char* bad : {"", "abc", "12XB", "-5", "1..2G", "MiB", "0.5"}) {
    auto r = parse_load_buffer(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_THAT(r.message(), HasSubstr("--load-buffer")) << bad;
  }
  EXPECT_THAT(parse_load_buffer("12XB").message(), HasSubstr("unknown unit 'XB'"));
  EXPECT_THAT(parse_load_buffer("abc").message(), HasSubstr("is not a size"));
  auto small = parse_load_buffer("1KiB");
  ASSERT_FALSE(small.ok());
  EXPECT_THAT(small.message(), HasSubstr("below the minimum of 64.00 KiB"));
  EXPECT_THAT(parse_load_buffer("2048TiB").message(), HasSubstr("above the maximum"));
  EXPECT_THAT(parse_load_buffer("99999999999999999999999").message(), HasSubstr("--load-buffer"));
}

// A checkpoint with one BF16 tensor of `n` values (3 MiB for n = 1.5M: three times a 1 MiB budget).
struct BigTensor {
  TempDir dir;
  std::vector<uint16_t> bf16;
  std::filesystem::path file;
  explicit BigTensor(int64_t n) {
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(-2.0f, 2.0f);
    bf16.resize(static_cast<size_t>(n));
    for (auto& v : bf16) v = f32_to_bf16(u(rng));
    file = dir / "model.safetensors";
    Status st = write_safetensors(file, {{"w", DType::kBF16, {n}, bf16.data()}});
    EXPECT_TRUE(st.ok()) << st.message();
  }
};

TEST(WeightStream, TensorLargerThanTheBufferStreamsInPiecesBitIdentical) {
  BigTensor t(1'500'001);  // odd count: the last piece is partial
  auto ckpt = Checkpoint::open(t.dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  const TensorInfo* info = ckpt->find("w");
  ASSERT_NE(info, nullptr);
  auto backend = make_cpu_backend(1);
  LoadOptions o;
  o.buffer_bytes = kMinLoadBuffer;  // 64 KiB: ~46 pieces for the raw copy
  WeightStream s(*ckpt, *backend, o);
  Buffer raw(backend.get(), DType::kBF16, {1'500'001 + 8});
  ASSERT_TRUE(s.copy(*info, raw, 16).ok());  // at a byte offset, as a later part of a stacked weight
  EXPECT_EQ(std::memcmp(static_cast<char*>(raw.tensor().data) + 16, t.bf16.data(), info->nbytes), 0);
  Buffer f32(backend.get(), DType::kF32, {1'500'001 + 3});
  int pieces = 0;
  ASSERT_TRUE(s.convert_f32(*info, f32, 3, [&](const float*, uint64_t, uint64_t) {
                 ++pieces;
                 return Status::Ok();
               }).ok());
  EXPECT_GT(pieces, 20);
  for (size_t i = 0; i < t.bf16.size(); ++i)
    ASSERT_EQ(f32.tensor().ptr<float>()[i + 3], bf16_to_f32(t.bf16[i])) << i;
  EXPECT_LE(s.peak_staging_bytes(), kMinLoadBuffer);
  EXPECT_EQ(s.bytes_read(), 2 * info->nbytes);
  // A piece check that fails stops the copy with its message.
  Status st = s.copy(*info, raw, 0, [](const uint8_t*, uint64_t, uint64_t off) -> Status {
    if (off > 0) return make_error("bad piece");
    return Status::Ok();
  });
  EXPECT_EQ(st.message(), "bad piece");
  // A tensor that does not fit its destination is an error naming it, never a write past the end.
  Buffer tiny(backend.get(), DType::kBF16, {10});
  EXPECT_THAT(s.copy(*info, tiny, 0).message(), HasSubstr("tensor 'w'"));
}

TEST(WeightStream, StagingIsCappedAt64MiBUnderALargeBudget) {
  BigTensor t(1000);
  auto ckpt = Checkpoint::open(t.dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto backend = make_cpu_backend(1);
  LoadOptions o;  // 4 GiB default
  WeightStream s(*ckpt, *backend, o);
  EXPECT_EQ(s.staging_limit(), kMaxStagingBytes);
  Buffer raw(backend.get(), DType::kBF16, {1000});
  ASSERT_TRUE(s.copy(*ckpt->find("w"), raw, 0).ok());
  EXPECT_LE(s.peak_staging_bytes(), 2000u + 64u);  // grows to what the tensors need, no more
}

// Every weight buffer of a model loaded under a 64 KiB budget equals the one loaded under the
// default, byte for byte (BF16 fixture, per-expert BF16, and the four quantized layouts).
TEST(WeightStream, ModelLoadsBitIdenticalUnderATinyBudget) {
  for (const char* name : {"qwen35-moe-tiny", "qwen35-moe-tiny-per-expert", "qwen35-dense-tiny", "qwen35-quant-nvfp4",
                           "qwen35-quant-nvfp4-fp8dense", "qwen35-quant-fp8", "qwen35-quant-modelopt-nvfp4"}) {
    SCOPED_TRACE(name);
    auto config = load_model_config(fixture(name));
    ASSERT_TRUE(config.ok()) << config.message();
    auto ckpt = Checkpoint::open(fixture(name));
    ASSERT_TRUE(ckpt.ok()) << ckpt.message();
    auto backend = make_cpu_backend(1);
    LoadOptions small;
    small.buffer_bytes = kMinLoadBuffer;
    auto a = load_weights(*ckpt, *config, *backend);
    auto b = load_weights(*ckpt, *config, *backend, small);
    ASSERT_TRUE(a.ok()) << a.message();
    ASSERT_TRUE(b.ok()) << b.message();
    ASSERT_EQ(a->storage.size(), b->storage.size());
    for (size_t i = 0; i < a->storage.size(); ++i) {
      const Tensor& x = a->storage[i].tensor();
      const Tensor& y = b->storage[i].tensor();
      ASSERT_EQ(x.shape, y.shape) << i;
      ASSERT_EQ(x.dtype, y.dtype) << i;
      ASSERT_EQ(std::memcmp(x.data, y.data, x.nbytes()), 0) << "buffer " << i;
    }
    EXPECT_LE(b->report.peak_staging_bytes, kMinLoadBuffer);
    EXPECT_EQ(a->report.bytes_read, b->report.bytes_read);
    EXPECT_GT(b->report.bytes_read, 0u);
  }
}

TEST(WeightStream, BudgetBelowTheMinimumIsALoadError) {
  auto config = load_model_config(fixture("qwen35-moe-tiny"));
  auto ckpt = Checkpoint::open(fixture("qwen35-moe-tiny"));
  ASSERT_TRUE(config.ok() && ckpt.ok());
  auto backend = make_cpu_backend(1);
  LoadOptions o;
  o.buffer_bytes = 1000;
  auto w = load_weights(*ckpt, *config, *backend, o);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.message(), HasSubstr("below the minimum"));
}

// Fraction of the file's pages in the page cache (mincore on a mapping that is never touched).
double resident_fraction(const std::filesystem::path& file) {
  int fd = ::open(file.c_str(), O_RDONLY);
  EXPECT_GE(fd, 0);
  const size_t size = std::filesystem::file_size(file);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
  EXPECT_NE(map, MAP_FAILED);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> vec((size + page - 1) / page);
  EXPECT_EQ(::mincore(map, size, vec.data()), 0);
  size_t resident = 0;
  for (unsigned char v : vec) resident += v & 1;
  ::munmap(map, size);
  ::close(fd);
  return static_cast<double>(resident) / static_cast<double>(vec.size());
}

TEST(WeightStream, RangesReadAreDroppedFromThePageCache) {
  BigTensor t(4 << 20);  // 8 MiB
  {
    int fd = ::open(t.file.c_str(), O_RDONLY);
    ASSERT_EQ(::fsync(fd), 0);  // dirty pages cannot be dropped: write them back first
    ::close(fd);
  }
  auto ckpt = Checkpoint::open(t.dir.path());
  ASSERT_TRUE(ckpt.ok());
  const TensorInfo* info = ckpt->find("w");
  std::vector<uint8_t> dst(info->nbytes);
  ASSERT_TRUE(ckpt->read(*info, dst.data()).ok());  // kKeep: the pages stay cached
  const double kept = resident_fraction(t.file);
  if (kept < 0.5) GTEST_SKIP() << "this filesystem keeps no page cache for the file (" << kept << ")";
  auto backend = make_cpu_backend(1);
  LoadOptions o;
  o.buffer_bytes = 1 << 20;  // pieces of 1 MiB: every piece boundary must be dropped too
  WeightStream s(*ckpt, *backend, o);
  Buffer raw(backend.get(), DType::kBF16, {4 << 20});
  ASSERT_TRUE(s.copy(*info, raw, 0).ok());
  EXPECT_LT(resident_fraction(t.file), 0.01) << "kept before: " << kept;
  // And with drop_page_cache off, the pages stay.
  o.drop_page_cache = false;
  WeightStream keep(*ckpt, *backend, o);
  ASSERT_TRUE(keep.copy(*info, raw, 0).ok());
  EXPECT_GT(resident_fraction(t.file), 0.5);
}

class RecordingProgress : public LoadProgress {
 public:
  void start(uint64_t total) override { total_ = total; }
  void advance(uint64_t b) override { done_ += b; ++calls_; }
  void finish(bool ok) override { finished_ = true; ok_ = ok; }
  uint64_t total_ = 0, done_ = 0;
  int calls_ = 0;
  bool finished_ = false, ok_ = false;
};

TEST(LoadProgress, LoaderReportsEveryByteItReads) {
  auto config = load_model_config(fixture("qwen35-quant-nvfp4"));
  auto ckpt = Checkpoint::open(fixture("qwen35-quant-nvfp4"));
  ASSERT_TRUE(config.ok() && ckpt.ok());
  auto backend = make_cpu_backend(1);
  RecordingProgress p;
  LoadOptions o;
  o.progress = &p;
  auto w = load_weights(*ckpt, *config, *backend, o);
  ASSERT_TRUE(w.ok()) << w.message();
  EXPECT_TRUE(p.finished_ && p.ok_);
  EXPECT_EQ(p.total_, text_model_bytes(*ckpt, config->vision.present));
  EXPECT_EQ(p.done_, w->report.bytes_read);
  // Every text tensor is read exactly once (this fixture has no unused text tensor).
  EXPECT_EQ(p.done_, p.total_);
}

TEST(LoadProgress, LineShape) {
  const std::regex line(R"(loading weights: (\d+\.\d)/(\d+\.\d) MB \((\d+)%\), (\d+\.\d|\?) MB/s, ETA (\d+|\?) s)");
  std::smatch m;
  std::string s = format_load_progress(250'000'000, 1'000'000'000, 2.0);
  ASSERT_TRUE(std::regex_match(s, m, line)) << s;
  EXPECT_EQ(m[1], "250.0");
  EXPECT_EQ(m[2], "1000.0");
  EXPECT_EQ(m[3], "25");
  EXPECT_EQ(m[4], "125.0");
  EXPECT_EQ(m[5], "6");
  s = format_load_progress(0, 10, 0.0);
  EXPECT_TRUE(std::regex_match(s, m, line)) << s;
  EXPECT_EQ(format_load_done(45'600'000, 0.5), "loaded weights: 45.6 MB in 0.5 s (91.2 MB/s)");
}

TEST(LoadProgress, PlainLinesAtQuartersThenADoneLine) {
  char* buf = nullptr;
  size_t len = 0;
  std::FILE* f = open_memstream(&buf, &len);
  {
    StreamLoadProgress p(f, StreamLoadProgress::Mode::kLines);
    p.start(1000);
    for (int i = 0; i < 100; ++i) p.advance(10);
    p.finish(true);
  }
  std::fclose(f);
  std::string out(buf, len);
  std::free(buf);
  EXPECT_EQ(std::count(out.begin(), out.end(), '\n'), 4) << out;  // 25, 50, 75 % and the end
  EXPECT_THAT(out, HasSubstr("(25%)"));
  EXPECT_THAT(out, HasSubstr("(75%)"));
  EXPECT_THAT(out, HasSubstr("loaded weights: 0.0 MB in"));
  EXPECT_EQ(out.find('\r'), std::string::npos);
}

}  // namespace
}  // namespace sparkserve
