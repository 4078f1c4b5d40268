// The real Qwen3.5 tokenizer of tests/fixtures/tokenizers/qwen3.5 (tokenizer.json is stored
// gzipped), for unit tests that need its 248,077 ids or its added tokens.
#pragma once

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "text/tokenizer.h"

#ifndef SPARKSERVE_SOURCE_DIR
#define SPARKSERVE_SOURCE_DIR "."
#endif

namespace sparkserve::testing {

inline std::string read_fixture_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string gunzip_fixture_file(const std::string& path) {
  std::string out;
  FILE* p = popen(("gzip -dc '" + path + "'").c_str(), "r");
  if (!p) return out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

inline Expected<Tokenizer> load_qwen35_tokenizer() {
  const std::string dir = std::string(SPARKSERVE_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen3.5/";
  return Tokenizer::from_json_text(gunzip_fixture_file(dir + "tokenizer.json.gz"),
                                   read_fixture_file(dir + "tokenizer_config.json"));
}

}  // namespace sparkserve::testing
