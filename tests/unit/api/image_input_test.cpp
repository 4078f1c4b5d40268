// Image inputs of requests: base64 (RFC 4648 §10's test vectors), the serve flags' JSON, the
// Anthropic image block -> chat part mapping, URL schemes, and the prefix-cache hook's ranges.
// Decoding itself is checked against transformers in tests/python/test_vision_reference.py and end
// to end through the server in tests/python/server/test_images.py.
#include <gtest/gtest.h>

#include "core/base64.h"
#include "server/image_input.h"

namespace sparkserve {
namespace {

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""}, {"Zg==", "f"}, {"Zm8=", "fo"}, {"Zm9v", "foo"}, {"Zm9vYg==", "foob"}, {"Zm9vYmE=", "fooba"}, {"Zm9vYmFy", "foobar"}};
  for (auto [enc, dec] : vectors) {
    auto out = base64_decode(enc);
    ASSERT_TRUE(out.ok()) << enc << ": " << out.message();
    EXPECT_EQ(*out, dec) << enc;
  }
}

TEST(Base64, WhitespaceAndMissingPaddingAccepted) {
  EXPECT_EQ(*base64_decode("Zm9v\r\nYmE"), "fooba");
  EXPECT_EQ(*base64_decode("Zg"), "f");
  EXPECT_EQ(*base64_decode(" Zm 9v "), "foo");
}

TEST(Base64, ErrorsNameTheProblem) {
  EXPECT_NE(base64_decode("Zm9v!").message().find("offset 4"), std::string::npos);
  EXPECT_NE(base64_decode("Zg==Zg==").message().find("after '='"), std::string::npos);
  EXPECT_NE(base64_decode("Zm9vY").message().find("truncated"), std::string::npos);
  EXPECT_NE(base64_decode("Zg=").message().find("padding"), std::string::npos);
  EXPECT_FALSE(base64_decode("Zm9v-_").ok());  // the URL-safe alphabet is not base64 here
}

TEST(ServeFlags, LimitMmPerPrompt) {
  EXPECT_EQ(*parse_limit_mm_per_prompt(R"({"image": 4})"), 4);
  EXPECT_EQ(*parse_limit_mm_per_prompt(R"({"image": 0, "video": 0})"), 0);
  EXPECT_EQ(*parse_limit_mm_per_prompt(R"({})"), 999);
  EXPECT_FALSE(parse_limit_mm_per_prompt(R"({"video": 1})").ok());
  EXPECT_FALSE(parse_limit_mm_per_prompt(R"({"image": -1})").ok());
  EXPECT_FALSE(parse_limit_mm_per_prompt("4").ok());
}

TEST(ServeFlags, MmProcessorKwargs) {
  media::PreprocessorConfig p;
  ASSERT_TRUE(apply_mm_processor_kwargs(R"({"max_pixels": 1003520, "min_pixels": 3136})", p).ok());
  EXPECT_EQ(p.max_pixels, 1003520);
  EXPECT_EQ(p.min_pixels, 3136);
  EXPECT_FALSE(apply_mm_processor_kwargs(R"({"max_pixels": 10, "min_pixels": 20})", p).ok());
  EXPECT_FALSE(apply_mm_processor_kwargs(R"({"fps": 2})", p).ok());
}

TEST(ImageUrl, SchemesAndDataUrls) {
  ImageInputOptions opt;
  EXPECT_EQ(*image_url_bytes("data:image/png;base64,Zm9v", opt, "u"), "foo");
  EXPECT_EQ(*image_url_bytes("DATA:;base64,Zm9v", opt, "u"), "foo");  // no media type: the bytes decide
  EXPECT_NE(image_url_bytes("http://host/a.png", opt, "u").error().message.find("network"), std::string::npos);
  EXPECT_NE(image_url_bytes("file:///tmp/a.png", opt, "u").error().message.find("--allowed-local-media-path"),
            std::string::npos);
  EXPECT_NE(image_url_bytes("data:application/pdf;base64,Zm9v", opt, "u").error().message.find("application/pdf"),
            std::string::npos);
  EXPECT_EQ(image_url_bytes("ftp://x", opt, "messages[0].content[0].image_url.url").error().param,
            "messages[0].content[0].image_url.url");
}

TEST(AnthropicImage, Base64SourceBecomesADataUrlPart) {
  RequestJson block = RequestJson::parse(R"({"type": "image", "source": {"type": "base64", "media_type": "image/webp", "data": "UklG"}})");
  auto part = anthropic_image_block_to_chat_part(block, "messages[0].content[2]");
  ASSERT_TRUE(part.ok());
  EXPECT_EQ((*part)["type"], "image_url");
  EXPECT_EQ((*part)["image_url"]["url"], "data:image/webp;base64,UklG");
}

TEST(AnthropicImage, RefusedSources) {
  for (const char* src : {R"({"type": "url", "url": "https://x/a.png"})",
                          R"({"type": "base64", "media_type": "image/tiff", "data": "AA"})",
                          R"({"type": "base64", "media_type": "image/png"})", R"("AA")"}) {
    RequestJson block = {{"type", "image"}, {"source", RequestJson::parse(src)}};
    auto part = anthropic_image_block_to_chat_part(block, "messages[1].content[0]");
    ASSERT_FALSE(part.ok()) << src;
    EXPECT_EQ(part.error().status, 400);
    EXPECT_EQ(part.error().param->rfind("messages[1].content[0].source", 0), 0u) << *part.error().param;
  }
}

media::PatchedImage fake_image(int64_t gh, int64_t gw, uint64_t hash, const VisionConfig& c) {
  media::PatchedImage img;
  img.grid_h = gh;
  img.grid_w = gw;
  img.patch_dim = c.patch_dim();
  img.content_hash = hash;
  return img;
}

TEST(PrefixCacheHook, ImageHashesOfATokenRange) {
  VisionConfig c;
  const int32_t pad = c.image_token_id;
  // text(2) image A (2x2 blocks = 4 tokens) text(1) image B (1x2 blocks = 2 tokens) text(1)
  std::vector<int32_t> ids = {1, 2, pad, 3, pad, 4};
  std::vector<media::PatchedImage> images;
  images.push_back(fake_image(4, 4, 0xA, c));
  images.push_back(fake_image(2, 4, 0xB, c));
  auto mm = build_multimodal_prompt(ids, std::move(images), c);
  ASSERT_TRUE(mm.ok()) << mm.message();
  ASSERT_EQ(ids.size(), 10u);  // A at [2, 6), B at [7, 9)
  EXPECT_EQ(mm->image_hashes_in(0, 2), std::vector<uint64_t>{});
  EXPECT_EQ(mm->image_hashes_in(0, 3), std::vector<uint64_t>{0xA});
  EXPECT_EQ(mm->image_hashes_in(5, 8), (std::vector<uint64_t>{0xA, 0xB}));
  EXPECT_EQ(mm->image_hashes_in(6, 7), std::vector<uint64_t>{});
  EXPECT_EQ(mm->image_hashes_in(8, 16), std::vector<uint64_t>{0xB});
}

}  // namespace
}  // namespace sparkserve
