#include "loader/model_path.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace sparkserve {
namespace {

namespace fs = std::filesystem;

fs::path hub_cache() {
  if (const char* c = std::getenv("HF_HUB_CACHE"); c && *c) return c;
  if (const char* h = std::getenv("HF_HOME"); h && *h) return fs::path(h) / "hub";
  if (const char* home = std::getenv("HOME"); home && *home) return fs::path(home) / ".cache" / "huggingface" / "hub";
  return {};
}

bool looks_like_hub_id(const std::string& s) {
  const size_t slash = s.find('/');
  return slash != std::string::npos && slash > 0 && slash + 1 < s.size() && s.find('/', slash + 1) == std::string::npos &&
         s[0] != '.' && s.find("..") == std::string::npos;
}

}  // namespace

Expected<ModelLocation> resolve_model_dir(const std::string& model) {
  std::error_code ec;
  if (model.empty()) return make_error("no model given: pass a model folder (sparkserve serve DIR)");
  if (fs::is_directory(model, ec)) {
    if (!fs::exists(fs::path(model) / "config.json"))
      return make_error("'" + model + "' is not a model folder: it has no config.json (expected a Hugging Face "
                        "checkpoint folder: config.json, *.safetensors, tokenizer.json, chat template)");
    return ModelLocation{model, ""};
  }
  if (fs::exists(model, ec)) return make_error("'" + model + "' is a file, not a model folder");
  if (looks_like_hub_id(model)) {
    const fs::path cache = hub_cache();
    std::string repo = "models--" + model;
    repo.replace(repo.find('/'), 1, "--");
    const fs::path root = cache / repo;
    if (!cache.empty() && fs::is_directory(root / "snapshots", ec)) {
      fs::path snap;
      std::ifstream ref(root / "refs" / "main");
      std::string hash;
      if (ref && std::getline(ref, hash) && fs::is_directory(root / "snapshots" / hash, ec)) {
        snap = root / "snapshots" / hash;
      } else {
        fs::file_time_type newest{};
        for (const auto& e : fs::directory_iterator(root / "snapshots", ec))
          if (e.is_directory() && (snap.empty() || e.last_write_time() > newest)) {
            snap = e.path();
            newest = e.last_write_time();
          }
      }
      if (!snap.empty() && fs::exists(snap / "config.json"))
        return ModelLocation{snap.string(), "'" + model + "' found in the Hugging Face cache: " + snap.string()};
    }
    return make_error("model folder '" + model + "' does not exist, and '" + model +
                      "' is not in the Hugging Face cache" + (cache.empty() ? "" : " (" + cache.string() + ")") +
                      ". sparkserve does not download models: fetch it first, e.g. `hf download " + model +
                      "` (then `sparkserve serve " + model + "`) or `hf download " + model +
                      " --local-dir DIR` (then `sparkserve serve DIR`)");
  }
  return make_error("model folder '" + model + "' does not exist");
}

Expected<int64_t> parse_token_count(std::string_view text, std::string_view flag) {
  const std::string s(text);
  auto bad = [&] {
    return make_error(std::string(flag) + ": '" + s +
                      "' is not a token count (e.g. 32768, 32k = 32000, 32K = 32768, 1M = 1048576)");
  };
  if (s == "-1") return int64_t{-1};
  if (s.empty()) return bad();
  double mult = 1;
  std::string num = s;
  switch (s.back()) {
    case 'k': mult = 1e3; break;
    case 'K': mult = 1024; break;
    case 'm': mult = 1e6; break;
    case 'M': mult = 1024.0 * 1024; break;
    case 'g': mult = 1e9; break;
    case 'G': mult = 1024.0 * 1024 * 1024; break;
    default: break;
  }
  if (mult != 1) num.pop_back();
  if (num.empty() || num.find_first_not_of("0123456789.") != std::string::npos || num.find('.') != num.rfind('.'))
    return bad();
  const double v = std::strtod(num.c_str(), nullptr) * mult;
  if (!(v >= 1) || v > 1e15 || std::floor(v) != v) return bad();
  return static_cast<int64_t>(v);
}

}  // namespace sparkserve
