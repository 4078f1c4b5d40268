// `sparkserve tokenize --model DIR (--text T | --file F) [--jsonl] [--decode]`
//   default: prints {"ids": [...]} for the whole text (special-token strings in the text are
//   matched as special tokens, as HF's Tokenizer.encode does).
//   --jsonl: the input holds one JSON string per line (so texts may contain newlines); each is
//   encoded on its own and one {"ids": [...]} is printed per line: the batch path the
//   conformance tests and benchmarks use.
//   --decode: adds "text": decode(ids) (lossy UTF-8, as HF's decode) to each object.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>

#include "cli/command.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

namespace {

std::string ids_json(const std::vector<sparkserve::TokenId>& ids, const sparkserve::Tokenizer* decode_with) {
  std::string out = "{\"ids\": [";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i) out += ", ";
    out += std::to_string(ids[i]);
  }
  out += "]";
  if (decode_with) {
    out += ", \"text\": ";
    out += nlohmann::json(sparkserve::utf8_lossy(decode_with->decode(ids))).dump();
  }
  out += "}\n";
  return out;
}

int run_tokenize(const std::string& model, const std::string* text, const std::string* file, bool jsonl,
                 bool decode) {
  auto tok = sparkserve::Tokenizer::load(model);
  if (!tok.ok()) {
    std::fprintf(stderr, "error: %s\n", tok.message().c_str());
    return 1;
  }
  std::string input;
  if (text) {
    input = *text;
  } else {
    std::ifstream f(*file, std::ios::binary);
    if (!f) {
      std::fprintf(stderr, "error: cannot open %s\n", file->c_str());
      return 1;
    }
    std::ostringstream ss;
    ss << f.rdbuf();
    input = ss.str();
  }
  const sparkserve::Tokenizer* dec = decode ? &tok.value() : nullptr;
  std::string out;
  if (!jsonl) {
    auto ids = tok->encode(input);
    if (!ids.ok()) {
      std::fprintf(stderr, "error: %s\n", ids.message().c_str());
      return 1;
    }
    out = ids_json(*ids, dec);
  } else {
    size_t start = 0, line_no = 1;
    while (start < input.size()) {
      size_t end = input.find('\n', start);
      if (end == std::string::npos) end = input.size();
      const std::string_view line = std::string_view(input).substr(start, end - start);
      std::string item;
      try {
        const auto j = nlohmann::json::parse(line);
        if (!j.is_string()) throw std::runtime_error("not a JSON string");
        item = j.get<std::string>();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "error: line %zu of the --jsonl input is not a JSON string: %s\n", line_no, e.what());
        return 1;
      }
      auto ids = tok->encode(item);
      if (!ids.ok()) {
        std::fprintf(stderr, "error: line %zu: %s\n", line_no, ids.message().c_str());
        return 1;
      }
      out += ids_json(*ids, dec);
      start = end + 1;
      ++line_no;
    }
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

void register_tokenize(CLI::App& root, int& exit_code) {
  auto* cmd = root.add_subcommand("tokenize", "Encode text with a model folder's tokenizer; prints {\"ids\": [...]}");
  static std::string model, text, file;
  static bool jsonl = false, decode = false;
  cmd->add_option("--model", model, "Model folder with tokenizer.json")->required();
  auto* t = cmd->add_option("--text", text, "Text to encode");
  auto* f = cmd->add_option("--file", file, "File whose bytes to encode");
  t->excludes(f);
  cmd->add_flag("--jsonl", jsonl, "Input has one JSON string per line; print one {\"ids\": [...]} per line");
  cmd->add_flag("--decode", decode, "Also print \"text\": the decoded ids");
  cmd->callback([&exit_code, t, f] {
    if (t->count() == 0 && f->count() == 0) {
      std::fprintf(stderr, "error: tokenize needs --text or --file\n");
      exit_code = 2;
      return;
    }
    exit_code = run_tokenize(model, t->count() ? &text : nullptr, f->count() ? &file : nullptr, jsonl, decode);
  });
}
SPARKSERVE_COMMAND(register_tokenize);

}  // namespace
