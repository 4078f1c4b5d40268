// Single-threaded encode throughput of sparkserve's tokenizer.
//   bench_tokenizer_bench MODEL_DIR CORPUS.jsonl [REPEATS]
// CORPUS.jsonl holds one JSON string per line (tools/tokenizer_corpus.py writes it). Each line is
// encoded separately, as HF's Tokenizer.encode(line) would be; prints bytes/s and tokens/s of the
// first (cold word cache) pass and of the best pass.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s MODEL_DIR CORPUS.jsonl [REPEATS]\n", argv[0]);
    return 2;
  }
  const int repeats = argc > 3 ? std::atoi(argv[3]) : 5;
  auto tok = sparkserve::Tokenizer::load(argv[1]);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", tok.message().c_str());
    return 1;
  }
  std::ifstream f(argv[2], std::ios::binary);
  if (!f) {
    std::fprintf(stderr, "error: cannot open %s\n", argv[2]);
    return 1;
  }
  std::vector<std::string> lines;
  size_t bytes = 0;
  for (std::string line; std::getline(f, line);) {
    lines.push_back(nlohmann::json::parse(line).get<std::string>());
    bytes += lines.back().size();
  }
  double best = 1e30, first = 0;
  size_t tokens = 0;
  for (int r = 0; r < repeats; ++r) {
    size_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (const auto& l : lines) {
      auto ids = tok->encode(l);
      if (!ids.ok()) {
        std::fprintf(stderr, "error: %s\n", ids.message().c_str());
        return 1;
      }
      n += ids->size();
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) first = s;
    best = std::min(best, s);
    tokens = n;
  }
  std::printf("{\"impl\": \"sparkserve\", \"lines\": %zu, \"bytes\": %zu, \"tokens\": %zu, "
              "\"first_s\": %.4f, \"best_s\": %.4f, \"first_MBps\": %.2f, \"best_MBps\": %.2f, "
              "\"best_tokens_per_s\": %.0f}\n",
              lines.size(), bytes, tokens, first, best, bytes / first / 1e6, bytes / best / 1e6, tokens / best);
  return 0;
}
