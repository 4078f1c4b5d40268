// tests/fixtures/safetensors-ref/reference.safetensors was written by the reference safetensors
// library 0.8.0 (make_reference.py next to it): every dtype name, shape, offset and value here is
// the reference's, not ours.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>

#include "loader/safetensors.h"

namespace sparkserve {
namespace {

using ::testing::ElementsAre;

const std::vector<float> kValues = {1.0f, -2.5f, 0.15625f, 448.0f, 0.0f, -0.0078125f};

class ReferenceFile : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Checkpoint::open(std::filesystem::path(SPARKSERVE_SOURCE_DIR) / "tests" / "fixtures" / "safetensors-ref" /
                              "reference.safetensors");
    ASSERT_TRUE(c.ok()) << c.message();
    ckpt_ = std::make_unique<Checkpoint>(std::move(c).value());
  }
  const TensorInfo& info(const std::string& name) {
    const TensorInfo* t = ckpt_->find(name);
    EXPECT_NE(t, nullptr) << name;
    static const TensorInfo kNone;
    return t ? *t : kNone;
  }
  template <class T>
  std::vector<T> raw(const std::string& name) {
    const TensorInfo& t = info(name);
    EXPECT_EQ(t.nbytes % sizeof(T), 0u);
    std::vector<T> out(t.nbytes / sizeof(T));
    EXPECT_TRUE(ckpt_->read(t, out.data()).ok());
    return out;
  }
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_F(ReferenceFile, FloatDtypesDecodeExactly) {
  struct Case {
    const char* name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  for (const Case& c : {Case{"floats.f32", DType::kF32, {2, 3}}, Case{"floats.f64", DType::kF64, {3, 2}},
                        Case{"floats.f16", DType::kF16, {6}}, Case{"floats.bf16", DType::kBF16, {6}},
                        Case{"floats.f8_e4m3", DType::kF8E4M3, {2, 3}}, Case{"floats.f8_e5m2", DType::kF8E5M2, {6}}}) {
    SCOPED_TRACE(c.name);
    const TensorInfo& t = info(c.name);
    EXPECT_EQ(t.dtype, c.dtype);
    EXPECT_EQ(t.shape, c.shape);
    auto v = ckpt_->read_f32(t);
    ASSERT_TRUE(v.ok()) << v.message();
    EXPECT_EQ(*v, kValues);
  }
}

TEST_F(ReferenceFile, IntegerAndBoolDtypes) {
  EXPECT_EQ(info("ints.i64").dtype, DType::kI64);
  EXPECT_THAT(raw<int64_t>("ints.i64"), ElementsAre(-1, int64_t{1} << 40, 7));
  EXPECT_EQ(info("ints.u64").dtype, DType::kU64);
  EXPECT_THAT(raw<uint64_t>("ints.u64"), ElementsAre(uint64_t{1} << 63, 5u));
  EXPECT_EQ(info("ints.i32").dtype, DType::kI32);
  EXPECT_THAT(raw<int32_t>("ints.i32"), ElementsAre(-7, 1 << 30));
  EXPECT_EQ(info("ints.u32").dtype, DType::kU32);
  EXPECT_THAT(raw<uint32_t>("ints.u32"), ElementsAre(1u << 31));
  EXPECT_EQ(info("ints.i16").dtype, DType::kI16);
  EXPECT_THAT(raw<int16_t>("ints.i16"), ElementsAre(-300, 300));
  EXPECT_EQ(info("ints.u16").dtype, DType::kU16);
  EXPECT_THAT(raw<uint16_t>("ints.u16"), ElementsAre(65535));
  EXPECT_EQ(info("ints.i8").dtype, DType::kI8);
  EXPECT_THAT(raw<int8_t>("ints.i8"), ElementsAre(-128, 127));
  EXPECT_EQ(info("ints.u8").dtype, DType::kU8);
  EXPECT_EQ(info("ints.u8").shape, (std::vector<int64_t>{2, 2}));
  EXPECT_THAT(raw<uint8_t>("ints.u8"), ElementsAre(1, 2, 3, 255));
  EXPECT_EQ(info("mask.bool").dtype, DType::kBool);
  EXPECT_THAT(raw<uint8_t>("mask.bool"), ElementsAre(1, 0, 1));
}

TEST_F(ReferenceFile, ScalarEmptyAndMetadata) {
  EXPECT_TRUE(info("scalar.f32").shape.empty());
  EXPECT_EQ(info("scalar.f32").numel(), 1);
  EXPECT_EQ(*ckpt_->read_f32(info("scalar.f32")), std::vector<float>{3.5f});
  EXPECT_EQ(info("empty.f32").shape, (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(info("empty.f32").nbytes, 0u);
  auto file = SafetensorsFile::open(ckpt_->files().at(0));
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->metadata().at("format"), "np");
  EXPECT_EQ(file->metadata().at("note"), "sparkserve loader reference");
  EXPECT_EQ(file->tensors().size(), 17u);
}

// Our writer, given the same tensors, produces a file whose header describes them identically
// (names, dtypes, shapes) and whose bytes per tensor are identical.
TEST_F(ReferenceFile, OurWriterRoundTripsTheSameTensors) {
  std::vector<std::vector<unsigned char>> data;
  std::vector<TensorToWrite> tensors;
  for (const auto& [name, t] : ckpt_->tensors()) {
    std::vector<unsigned char> bytes(t.nbytes);
    ASSERT_TRUE(ckpt_->read(t, bytes.data()).ok());
    data.push_back(std::move(bytes));
  }
  size_t i = 0;
  for (const auto& [name, t] : ckpt_->tensors()) tensors.push_back({name, t.dtype, t.shape, data[i++].data()});
  auto path = std::filesystem::temp_directory_path() / ("sparkserve_loader_ref_" + std::to_string(::getpid()) +
                                                        ".safetensors");
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
  auto back = Checkpoint::open(path);
  ASSERT_TRUE(back.ok()) << back.message();
  i = 0;
  for (const auto& [name, t] : ckpt_->tensors()) {
    const TensorInfo* u = back->find(name);
    ASSERT_NE(u, nullptr) << name;
    EXPECT_EQ(u->dtype, t.dtype);
    EXPECT_EQ(u->shape, t.shape);
    std::vector<unsigned char> bytes(u->nbytes);
    ASSERT_TRUE(back->read(*u, bytes.data()).ok());
    EXPECT_EQ(bytes, data[i++]) << name;
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sparkserve
