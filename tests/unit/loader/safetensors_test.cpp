#include "loader/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "temp_dir.h"

namespace sparkserve {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::safetensors_image;
using testing::TempDir;
using testing::write_text;

// Writes `header` (plus data_bytes of zeros) as a one-file safetensors image and returns open()'s error.
std::string open_error(const TempDir& dir, const std::string& header, uint64_t data_bytes,
                       int64_t declared_len = -1) {
  auto path = dir / "bad.safetensors";
  write_text(path, safetensors_image(header, data_bytes, declared_len));
  auto f = SafetensorsFile::open(path);
  EXPECT_FALSE(f.ok()) << header;
  return f.ok() ? std::string() : f.message();
}

TEST(SafetensorsWrite, RoundTripsEveryDtypeAndMetadata) {
  TempDir dir;
  auto path = dir / "all.safetensors";
  // One tensor per dtype with distinct byte patterns so a wrong offset shows up as wrong bytes.
  std::vector<std::vector<unsigned char>> payloads;
  std::vector<TensorToWrite> tensors;
  for (int d = 0; d <= static_cast<int>(DType::kBool); ++d) {
    DType t = static_cast<DType>(d);
    std::vector<int64_t> shape = {2, 3};
    std::vector<unsigned char> bytes(6 * dtype_size(t));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(d * 16 + i);
    if (t == DType::kBool)
      for (auto& b : bytes) b &= 1;
    payloads.push_back(bytes);
    tensors.push_back({"t." + std::string(dtype_name(t)), t, shape, nullptr});
  }
  for (size_t i = 0; i < tensors.size(); ++i) tensors[i].data = payloads[i].data();
  ASSERT_TRUE(write_safetensors(path, tensors, {{"format", "pt"}}).ok());

  // The header length is a multiple of 8 (space padded), as in the reference writer.
  std::string raw = testing::read_text(path);
  uint64_t n = 0;
  std::memcpy(&n, raw.data(), 8);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw[8], '{');

  auto file = SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.message();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  ASSERT_EQ(file->tensors().size(), tensors.size());

  auto ckpt = Checkpoint::open(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  EXPECT_EQ(ckpt->dir(), dir.path());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo* info = ckpt->find(tensors[i].name);
    ASSERT_NE(info, nullptr) << tensors[i].name;
    EXPECT_EQ(info->dtype, tensors[i].dtype);
    EXPECT_EQ(info->shape, tensors[i].shape);
    EXPECT_EQ(info->numel(), 6);
    EXPECT_EQ(info->nbytes, payloads[i].size());
    EXPECT_EQ(info->file, path);
    std::vector<unsigned char> got(info->nbytes);
    ASSERT_TRUE(ckpt->read(*info, got.data()).ok());
    EXPECT_EQ(got, payloads[i]) << tensors[i].name;
  }
  EXPECT_EQ(ckpt->find("absent"), nullptr);
}

TEST(SafetensorsWrite, ScalarAndEmptyTensors) {
  TempDir dir;
  auto path = dir / "x.safetensors";
  float scalar = 3.5f;
  float row[2] = {1.0f, 2.0f};
  ASSERT_TRUE(write_safetensors(path, {{"scalar", DType::kF32, {}, &scalar},
                                       {"empty", DType::kBF16, {0, 4}, nullptr},
                                       {"row", DType::kF32, {2}, row}})
                  .ok());
  auto ckpt = Checkpoint::open(path);
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  auto s = ckpt->read_f32(*ckpt->find("scalar"));
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, std::vector<float>{3.5f});
  EXPECT_EQ(ckpt->find("empty")->nbytes, 0u);
  EXPECT_TRUE(ckpt->read_f32(*ckpt->find("empty"))->empty());
  EXPECT_EQ(*ckpt->read_f32(*ckpt->find("row")), (std::vector<float>{1.0f, 2.0f}));
}

TEST(SafetensorsWrite, StreamingWriterMatchesOneShotWriter) {
  TempDir dir;
  std::vector<uint16_t> a(1000), b(77);
  std::iota(a.begin(), a.end(), uint16_t{0});
  std::iota(b.begin(), b.end(), uint16_t{5000});
  ASSERT_TRUE(write_safetensors(dir / "one.safetensors", {{"a", DType::kBF16, {10, 100}, a.data()},
                                                           {"b", DType::kI16, {77}, b.data()}})
                  .ok());
  auto w = SafetensorsWriter::create(dir / "stream.safetensors",
                                     {{"a", DType::kBF16, {10, 100}}, {"b", DType::kI16, {77}}});
  ASSERT_TRUE(w.ok()) << w.message();
  EXPECT_EQ(w->data_bytes_total(), 2154u);
  // Pieces that straddle the tensor boundary.
  const auto* pa = reinterpret_cast<const unsigned char*>(a.data());
  ASSERT_TRUE(w->append(pa, 1500).ok());
  std::vector<unsigned char> rest(pa + 1500, pa + 2000);
  rest.insert(rest.end(), reinterpret_cast<unsigned char*>(b.data()), reinterpret_cast<unsigned char*>(b.data()) + 154);
  ASSERT_TRUE(w->append(rest.data(), rest.size()).ok());
  ASSERT_TRUE(w->finish().ok());
  EXPECT_EQ(testing::read_text(dir / "one.safetensors"), testing::read_text(dir / "stream.safetensors"));
}

TEST(SafetensorsWrite, RejectsBadSpecsAndIncompleteData) {
  TempDir dir;
  auto dup = SafetensorsWriter::create(dir / "d.safetensors", {{"a", DType::kF32, {1}}, {"a", DType::kF32, {1}}});
  ASSERT_FALSE(dup.ok());
  EXPECT_THAT(dup.message(), AllOf(HasSubstr("d.safetensors"), HasSubstr("'a'"), HasSubstr("twice")));
  auto neg = SafetensorsWriter::create(dir / "n.safetensors", {{"a", DType::kF32, {-1}}});
  ASSERT_FALSE(neg.ok());
  EXPECT_THAT(neg.message(), HasSubstr("negative"));
  auto huge = SafetensorsWriter::create(dir / "h.safetensors", {{"a", DType::kF64, {1LL << 40, 1LL << 30}}});
  ASSERT_FALSE(huge.ok());
  EXPECT_THAT(huge.message(), HasSubstr("overflow"));

  {
    auto w = SafetensorsWriter::create(dir / "short.safetensors", {{"a", DType::kF32, {4}}});
    ASSERT_TRUE(w.ok());
    float x[5] = {};
    auto too_much = w->append(x, 20);
    EXPECT_FALSE(too_much.ok());
    EXPECT_THAT(too_much.message(), HasSubstr("more data"));
    ASSERT_TRUE(w->append(x, 8).ok());
    auto fin = w->finish();
    ASSERT_FALSE(fin.ok());
    EXPECT_THAT(fin.message(), HasSubstr("only 8 of 16"));
  }
  // An unfinished file is removed so it can never be mistaken for a checkpoint.
  EXPECT_FALSE(std::filesystem::exists(dir / "short.safetensors"));
  {
    auto w = SafetensorsWriter::create(dir / "abandoned.safetensors", {{"a", DType::kF32, {4}}});
    ASSERT_TRUE(w.ok());
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "abandoned.safetensors"));
}

TEST(SafetensorsRead, ReadF32ConvertsEachFloatDtype) {
  TempDir dir;
  // Values exactly representable in every format below, so the conversions must be exact.
  const std::vector<float> values = {1.0f, -2.5f, 0.15625f, 448.0f, 0.0f, -0.0078125f};
  std::vector<uint16_t> bf16, f16;
  std::vector<uint8_t> e4m3;
  std::vector<double> f64;
  for (float v : values) {
    bf16.push_back(f32_to_bf16(v));
    f16.push_back(f32_to_f16(v));
    e4m3.push_back(f32_to_fp8_e4m3(v));
    f64.push_back(v);
  }
  // E5M2 has 2 mantissa bits: 1.0 = 0x3C, -2.5 = 0xC1, 0.15625 = 0x31, 448 = 0x5F, 0, -0.0078125 = 0xA0.
  const std::vector<uint8_t> e5m2 = {0x3C, 0xC1, 0x31, 0x5F, 0x00, 0xA0};
  int32_t ints[6] = {};
  auto path = dir / "f.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"f32", DType::kF32, {2, 3}, values.data()},
                                       {"bf16", DType::kBF16, {2, 3}, bf16.data()},
                                       {"f16", DType::kF16, {6}, f16.data()},
                                       {"e4m3", DType::kF8E4M3, {3, 2}, e4m3.data()},
                                       {"e5m2", DType::kF8E5M2, {6}, e5m2.data()},
                                       {"f64", DType::kF64, {6}, f64.data()},
                                       {"i32", DType::kI32, {6}, ints}})
                  .ok());
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  for (const char* name : {"f32", "bf16", "f16", "e4m3", "e5m2", "f64"}) {
    auto got = ckpt->read_f32(*ckpt->find(name));
    ASSERT_TRUE(got.ok()) << got.message();
    EXPECT_EQ(*got, values) << name;
  }
  auto bad = ckpt->read_f32(*ckpt->find("i32"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), AllOf(HasSubstr("f.safetensors"), HasSubstr("'i32'"), HasSubstr("I32")));
}

TEST(SafetensorsRead, ReadF32AcrossChunkBoundaries) {
  TempDir dir;
  const int64_t n = 600'001;  // more than two internal chunks, not a multiple of the chunk size
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) bits[static_cast<size_t>(i)] = f32_to_bf16(static_cast<float>(i % 251) - 125.0f);
  ASSERT_TRUE(write_safetensors(dir / "big.safetensors", {{"w", DType::kBF16, {n}, bits.data()}}).ok());
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto got = ckpt->read_f32(*ckpt->find("w"));
  ASSERT_TRUE(got.ok());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ((*got)[static_cast<size_t>(i)], static_cast<float>(i % 251) - 125.0f) << i;
}

TEST(SafetensorsRead, ReadBytesReadsASliceAndChecksItsRange) {
  TempDir dir;
  std::vector<int32_t> v(24);
  std::iota(v.begin(), v.end(), 0);
  ASSERT_TRUE(write_safetensors(dir / "s.safetensors", {{"experts", DType::kI32, {4, 6}, v.data()}}).ok());
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  const TensorInfo& info = *ckpt->find("experts");
  int32_t row[6];
  ASSERT_TRUE(ckpt->read_bytes(info, 2 * 6 * 4, sizeof(row), row).ok());
  EXPECT_EQ(row[0], 12);
  EXPECT_EQ(row[5], 17);
  auto out = ckpt->read_bytes(info, 90, 8, row);
  ASSERT_FALSE(out.ok());
  EXPECT_THAT(out.message(), AllOf(HasSubstr("s.safetensors"), HasSubstr("'experts'"), HasSubstr("outside")));
}

// ---- malformed files: every message names the file, and the tensor where there is one ----

TEST(SafetensorsMalformed, MissingFile) {
  TempDir dir;
  auto f = SafetensorsFile::open(dir / "nope.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.message(), AllOf(HasSubstr("nope.safetensors"), HasSubstr("not found")));
}

TEST(SafetensorsMalformed, ShorterThanLengthPrefix) {
  TempDir dir;
  write_text(dir / "tiny.safetensors", "abc");
  auto f = SafetensorsFile::open(dir / "tiny.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.message(), AllOf(HasSubstr("tiny.safetensors"), HasSubstr("truncated")));
}

TEST(SafetensorsMalformed, HeaderLongerThanFile) {
  TempDir dir;
  std::string header = R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_THAT(open_error(dir, header, 4, 5000), AllOf(HasSubstr("bad.safetensors"), HasSubstr("truncated"),
                                                      HasSubstr("5000")));
}

TEST(SafetensorsMalformed, HeaderLengthOverLimit) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, "{}", 0, 200'000'000), AllOf(HasSubstr("bad.safetensors"), HasSubstr("limit")));
  // A length near 2^64 must not wrap around in the size checks.
  write_text(dir / "wrap.safetensors", testing::u64_le(~0ull - 3) + "{}");
  auto f = SafetensorsFile::open(dir / "wrap.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.message(), HasSubstr("limit"));
}

TEST(SafetensorsMalformed, HeaderNotJson) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, R"({"w":{"dtype":"F32",)", 0),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("bad header"), HasSubstr("JSON")));
  EXPECT_THAT(open_error(dir, "", 0), HasSubstr("bad header"));
  EXPECT_THAT(open_error(dir, "[1, 2]", 0), AllOf(HasSubstr("bad header"), HasSubstr("object")));
  EXPECT_THAT(open_error(dir, "{\"w\": 7}", 0), AllOf(HasSubstr("'w'"), HasSubstr("object")));
}

TEST(SafetensorsMalformed, BadMetadata) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, R"({"__metadata__": [1]})", 0), HasSubstr("__metadata__"));
  EXPECT_THAT(open_error(dir, R"({"__metadata__": {"format": 1}})", 0),
              AllOf(HasSubstr("__metadata__"), HasSubstr("format")));
}

TEST(SafetensorsMalformed, MissingOrMistypedFields) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"shape":[1],"data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("'a.weight'"), HasSubstr("dtype")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("shape")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":[1]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("data_offsets")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("dtype"), HasSubstr("string")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("shape"), HasSubstr("array")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("negative")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("non-negative integers")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("non-negative integers")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("data_offsets")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("data_offsets")));
  EXPECT_THAT(open_error(dir, R"({"a.weight":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", 4),
              AllOf(HasSubstr("'a.weight'"), HasSubstr("end before")));
}

TEST(SafetensorsMalformed, UnknownDtype) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, R"({"m.w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", 1),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("'m.w'"), HasSubstr("unknown dtype \"F4\""),
                    HasSubstr("BF16")));
}

TEST(SafetensorsMalformed, SizeMismatch) {
  TempDir dir;
  EXPECT_THAT(open_error(dir, R"({"m.w":{"dtype":"BF16","shape":[3,4],"data_offsets":[0,20]}})", 24),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("'m.w'"), HasSubstr("size mismatch"),
                    HasSubstr("needs 24 bytes"), HasSubstr("span 20")));
}

TEST(SafetensorsMalformed, NumelOverflow) {
  TempDir dir;
  EXPECT_THAT(
      open_error(dir, R"({"m.w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", 0),
      AllOf(HasSubstr("'m.w'"), HasSubstr("overflow")));
  // numel fits in int64 but the byte count does not.
  EXPECT_THAT(open_error(dir, R"({"m.w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0),
              AllOf(HasSubstr("'m.w'"), HasSubstr("overflow")));
  // A dimension above INT64_MAX.
  EXPECT_THAT(open_error(dir, R"({"m.w":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", 0),
              AllOf(HasSubstr("'m.w'"), HasSubstr("non-negative integers")));
}

TEST(SafetensorsMalformed, OffsetsPastTheData) {
  TempDir dir;
  // The header is consistent but the file holds only 8 of the 16 data bytes.
  EXPECT_THAT(open_error(dir, R"({"m.w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("'m.w'"), HasSubstr("past the end"),
                    HasSubstr("truncated")));
}

TEST(SafetensorsMalformed, OverlappingTensors) {
  TempDir dir;
  EXPECT_THAT(open_error(dir,
                         R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                         R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                         24),
              AllOf(HasSubstr("bad.safetensors"), HasSubstr("'a' [0, 16)"), HasSubstr("'b' [8, 24)"),
                    HasSubstr("overlap")));
  // Same start, listed in the other order.
  EXPECT_THAT(open_error(dir,
                         R"({"z":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                         R"("y":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
                         4),
              AllOf(HasSubstr("'y'"), HasSubstr("'z'"), HasSubstr("overlap")));
}

TEST(SafetensorsMalformed, EmptyTensorsDoNotOverlap) {
  TempDir dir;
  auto path = dir / "ok.safetensors";
  write_text(path, safetensors_image(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                     R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}})",
                                     8));
  auto f = SafetensorsFile::open(path);
  EXPECT_TRUE(f.ok()) << f.message();
}

TEST(SafetensorsMalformed, TruncatedAfterOpen) {
  TempDir dir;
  std::vector<float> w(64, 1.0f);
  auto path = dir / "model.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"a", DType::kF32, {64}, w.data()}, {"b.weight", DType::kF32, {64}, w.data()}})
                  .ok());
  auto ckpt = Checkpoint::open(dir.path());
  ASSERT_TRUE(ckpt.ok());
  std::filesystem::resize_file(path, std::filesystem::file_size(path) - 10);
  std::vector<float> dst(64);
  EXPECT_TRUE(ckpt->read(*ckpt->find("a"), dst.data()).ok());
  auto st = ckpt->read(*ckpt->find("b.weight"), dst.data());
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), AllOf(HasSubstr("model.safetensors"), HasSubstr("'b.weight'"), HasSubstr("truncated")));
  auto f32 = ckpt->read_f32(*ckpt->find("b.weight"));
  ASSERT_FALSE(f32.ok());
  EXPECT_THAT(f32.message(), AllOf(HasSubstr("'b.weight'"), HasSubstr("truncated")));
  // Removed entirely: the read names the file.
  std::filesystem::remove(path);
  auto gone = ckpt->read(*ckpt->find("a"), dst.data());
  ASSERT_FALSE(gone.ok());
  EXPECT_THAT(gone.message(), AllOf(HasSubstr("model.safetensors"), HasSubstr("not found")));
}

TEST(SafetensorsMalformed, FromBytesAgreesWithOpen) {
  std::string img = safetensors_image(R"({"m.w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 16);
  auto ok = SafetensorsFile::from_bytes("mem.safetensors", img);
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ(ok->tensors().at(0).offset, 8 + img.size() - 8 - 16);
  auto bad = SafetensorsFile::from_bytes("mem.safetensors", img.substr(0, img.size() - 1));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.message(), AllOf(HasSubstr("mem.safetensors"), HasSubstr("'m.w'"), HasSubstr("past the end")));
  EXPECT_FALSE(SafetensorsFile::from_bytes("mem.safetensors", "1234").ok());
}

// ---- checkpoints: folders of shards ----

struct ShardedCheckpoint {
  TempDir dir;
  std::vector<float> a{1, 2, 3, 4}, b{5, 6}, c{7};
  ShardedCheckpoint() {
    EXPECT_TRUE(write_safetensors(dir / "model-00001-of-00002.safetensors", {{"model.a", DType::kF32, {2, 2}, a.data()}})
                    .ok());
    EXPECT_TRUE(write_safetensors(dir / "model-00002-of-00002.safetensors", {{"model.b", DType::kF32, {2}, b.data()}})
                    .ok());
  }
  void write_index(const std::string& weight_map) {
    write_text(dir / "model.safetensors.index.json",
               R"({"metadata": {"total_size": 24}, "weight_map": )" + weight_map + "}");
  }
  void write_standard_index() {
    write_index(R"({"model.a": "model-00001-of-00002.safetensors", "model.b": "model-00002-of-00002.safetensors"})");
  }
};

TEST(Checkpoint, ShardedWithIndexAndUnindexedExtraShard) {
  ShardedCheckpoint s;
  s.write_standard_index();
  // An MTP shard the index does not list is still indexed.
  ASSERT_TRUE(write_safetensors(s.dir / "model_mtp.safetensors", {{"mtp.fc.weight", DType::kF32, {1}, s.c.data()}}).ok());
  testing::write_text(s.dir / "config.json", "{}");  // other files are ignored
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  EXPECT_EQ(ckpt->tensors().size(), 3u);
  ASSERT_EQ(ckpt->files().size(), 3u);
  EXPECT_EQ(ckpt->files()[0].filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(ckpt->files()[2].filename(), "model_mtp.safetensors");
  EXPECT_EQ(ckpt->find("model.b")->file.filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(*ckpt->read_f32(*ckpt->find("model.a")), s.a);
  EXPECT_EQ(*ckpt->read_f32(*ckpt->find("model.b")), s.b);
  EXPECT_EQ(*ckpt->read_f32(*ckpt->find("mtp.fc.weight")), s.c);
}

TEST(Checkpoint, RequireNamesMissingTensorsAndWrongShapes) {
  ShardedCheckpoint s;
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_TRUE(ckpt.ok());
  auto ok = ckpt->require("model.a", {2, 2});
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_EQ((*ok)->name, "model.a");
  auto missing = ckpt->require("model.layers.0.mlp.gate_proj.weight", {4, 2});
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), AllOf(HasSubstr(s.dir.path().string()), HasSubstr("'model.layers.0.mlp.gate_proj.weight'"),
                                       HasSubstr("missing")));
  auto wrong = ckpt->require("model.b", {3}, "config.json (hidden_size 3)");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.message(), AllOf(HasSubstr("model-00002-of-00002.safetensors"), HasSubstr("'model.b'"),
                                     HasSubstr("has shape [2]"), HasSubstr("hidden_size 3) needs [3]")));
}

TEST(Checkpoint, ShardedWithoutIndex) {
  ShardedCheckpoint s;
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_TRUE(ckpt.ok()) << ckpt.message();
  EXPECT_EQ(ckpt->tensors().size(), 2u);
}

TEST(Checkpoint, DuplicateTensorNamesBothFiles) {
  ShardedCheckpoint s;
  ASSERT_TRUE(write_safetensors(s.dir / "extra.safetensors", {{"model.b", DType::kF32, {1}, s.c.data()}}).ok());
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(ckpt.message(), AllOf(HasSubstr("'model.b'"), HasSubstr("extra.safetensors"),
                                    HasSubstr("model-00002-of-00002.safetensors")));
}

TEST(Checkpoint, IndexNamesMissingFile) {
  ShardedCheckpoint s;
  s.write_index(R"({"model.a": "model-00001-of-00002.safetensors", "model.b": "model-00003-of-00003.safetensors"})");
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(ckpt.message(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("'model.b'"),
                                    HasSubstr("model-00003-of-00003.safetensors"), HasSubstr("missing")));
}

TEST(Checkpoint, IndexTensorNotInNamedFile) {
  ShardedCheckpoint s;
  s.write_index(R"({"model.a": "model-00002-of-00002.safetensors"})");
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(ckpt.message(), AllOf(HasSubstr("index.json"), HasSubstr("'model.a'"),
                                    HasSubstr("model-00002-of-00002.safetensors"),
                                    HasSubstr("stored in"), HasSubstr("model-00001-of-00002.safetensors")));
  s.write_index(R"({"model.zzz": "model-00002-of-00002.safetensors"})");
  auto none = Checkpoint::open(s.dir.path());
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.message(), AllOf(HasSubstr("'model.zzz'"), HasSubstr("does not contain")));
}

TEST(Checkpoint, BadIndexJson) {
  ShardedCheckpoint s;
  testing::write_text(s.dir / "model.safetensors.index.json", "{\"weight_map\": [");
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(ckpt.message(), AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("JSON")));
  s.write_index(R"({"model.a": 3})");
  auto typed = Checkpoint::open(s.dir.path());
  ASSERT_FALSE(typed.ok());
  EXPECT_THAT(typed.message(), AllOf(HasSubstr("'model.a'"), HasSubstr("string")));
  s.write_index("[]");
  EXPECT_FALSE(Checkpoint::open(s.dir.path()).ok());
}

TEST(Checkpoint, BadShardIsNamed) {
  ShardedCheckpoint s;
  testing::write_text(s.dir / "model-00003.safetensors",
                      safetensors_image(R"({"x":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}})", 1));
  auto ckpt = Checkpoint::open(s.dir.path());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_THAT(ckpt.message(), AllOf(HasSubstr("model-00003.safetensors"), HasSubstr("'x'"), HasSubstr("Q4")));
}

TEST(Checkpoint, EmptyFolderAndMissingPath) {
  TempDir dir;
  testing::write_text(dir / "config.json", "{}");
  auto empty = Checkpoint::open(dir.path());
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.message(), AllOf(HasSubstr(dir.path().string()), HasSubstr("no *.safetensors")));
  auto missing = Checkpoint::open(dir / "does-not-exist");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.message(), AllOf(HasSubstr("does-not-exist"), HasSubstr("not found")));
}

}  // namespace
}  // namespace sparkserve
