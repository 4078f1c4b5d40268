#include "text/pretokenizer.h"

#include <algorithm>
#include <utility>

namespace sparkserve {
namespace {

// GPT-2's pattern, which HF's ByteLevel pre-tokenizer applies when use_regex is true.
constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

bool get_bool(const nlohmann::json& spec, const char* key, bool fallback) {
  return spec.contains(key) && spec[key].is_boolean() ? spec[key].get<bool>() : fallback;
}

}  // namespace

Status PreTokenizer::append_steps(const nlohmann::json& spec, std::vector<Step>& steps) {
  if (spec.is_null()) return Status::Ok();
  if (!spec.is_object() || !spec.contains("type") || !spec["type"].is_string())
    return make_error("tokenizer.json: pre_tokenizer must be null or an object with a string \"type\"");
  const std::string type = spec["type"];
  if (type == "Sequence") {
    if (!spec.contains("pretokenizers") || !spec["pretokenizers"].is_array())
      return make_error("tokenizer.json: Sequence pre_tokenizer without a \"pretokenizers\" array");
    for (const auto& sub : spec["pretokenizers"]) SS_RETURN_IF_ERROR(append_steps(sub, steps));
    return Status::Ok();
  }
  if (type == "ByteLevel") {
    Step step{Step::Kind::kByteLevel, {}};
    step.use_regex = get_bool(spec, "use_regex", true);
    step.add_prefix_space = get_bool(spec, "add_prefix_space", true);
    if (step.use_regex) {
      SS_ASSIGN_OR_RETURN(step.regex, Regex::compile(kGpt2Pattern));
    }
    steps.push_back(std::move(step));
    return Status::Ok();
  }
  if (type == "Split") {
    Step step{Step::Kind::kSplit, {}};
    const auto& pat = spec.value("pattern", nlohmann::json());
    if (pat.is_object() && pat.contains("Regex") && pat["Regex"].is_string()) {
      SS_ASSIGN_OR_RETURN(step.regex, Regex::compile(pat["Regex"].get<std::string>()));
    } else if (pat.is_object() && pat.contains("String") && pat["String"].is_string()) {
      SS_ASSIGN_OR_RETURN(step.regex, Regex::compile(pat["String"].get<std::string>(), /*literal=*/true));
    } else {
      return make_error("tokenizer.json: Split pre_tokenizer needs \"pattern\": {\"Regex\": ...} or {\"String\": ...}");
    }
    const std::string behavior = spec.value("behavior", std::string("Isolated"));
    if (behavior == "Isolated") step.behavior = Behavior::kIsolated;
    else if (behavior == "Removed") step.behavior = Behavior::kRemoved;
    else if (behavior == "MergedWithPrevious") step.behavior = Behavior::kMergedWithPrevious;
    else if (behavior == "MergedWithNext") step.behavior = Behavior::kMergedWithNext;
    else if (behavior == "Contiguous") step.behavior = Behavior::kContiguous;
    else return make_error("tokenizer.json: unsupported Split behavior '" + behavior + "'");
    step.invert = get_bool(spec, "invert", false);
    steps.push_back(std::move(step));
    return Status::Ok();
  }
  return make_error("tokenizer.json: unsupported pre_tokenizer type '" + type +
                    "' (supported: Split, ByteLevel, Sequence, null)");
}

Expected<PreTokenizer> PreTokenizer::from_json(const nlohmann::json& spec) {
  PreTokenizer p;
  SS_RETURN_IF_ERROR(append_steps(spec, p.steps_));
  return p;
}

Status PreTokenizer::apply(const Step& step, std::vector<std::string>& pieces) const {
  std::vector<std::string> next;
  next.reserve(pieces.size() * 2);
  std::vector<std::pair<size_t, size_t>> matches;
  for (auto& piece : pieces) {
    if (step.kind == Step::Kind::kByteLevel) {
      if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(0, " ");
      if (!step.use_regex) { next.push_back(std::move(piece)); continue; }
    }
    matches.clear();
    SS_RETURN_IF_ERROR(step.regex.find_all(piece, matches));
    // Segments of the piece, each flagged as a match (a delimiter) or not; HF's
    // SplitDelimiterBehavior then decides how delimiters combine with their neighbours.
    std::vector<std::pair<std::string_view, bool>> segs;
    const std::string_view text = piece;
    size_t prev = 0;
    for (auto [s, e] : matches) {
      if (s > prev) segs.emplace_back(text.substr(prev, s - prev), step.invert);
      segs.emplace_back(text.substr(s, e - s), !step.invert);
      prev = e;
    }
    if (prev < text.size()) segs.emplace_back(text.substr(prev), step.invert);
    const Behavior behavior = step.kind == Step::Kind::kByteLevel ? Behavior::kIsolated : step.behavior;
    std::vector<std::string> out;
    switch (behavior) {
      case Behavior::kIsolated:
        for (auto& [s, m] : segs) out.emplace_back(s);
        break;
      case Behavior::kRemoved:
        for (auto& [s, m] : segs)
          if (!m) out.emplace_back(s);
        break;
      case Behavior::kMergedWithPrevious: {
        bool prev_was_match = false;
        for (auto& [s, m] : segs) {
          if (m && !out.empty() && !prev_was_match) out.back() += s;
          else out.emplace_back(s);
          prev_was_match = m;
        }
        break;
      }
      case Behavior::kMergedWithNext: {
        // A delimiter joins the segment after it (HF folds right to left).
        bool next_was_match = false;
        for (auto it = segs.rbegin(); it != segs.rend(); ++it) {
          const auto& [s, m] = *it;
          if (m && !next_was_match && !out.empty()) out.back().insert(0, s);
          else out.emplace_back(s);
          next_was_match = m;
        }
        std::reverse(out.begin(), out.end());
        break;
      }
      case Behavior::kContiguous: {
        bool prev_was_match = false;
        for (auto& [s, m] : segs) {
          if (m && prev_was_match && !out.empty()) out.back() += s;
          else out.emplace_back(s);
          prev_was_match = m;
        }
        break;
      }
    }
    for (auto& o : out)
      if (!o.empty()) next.push_back(std::move(o));
  }
  pieces = std::move(next);
  return Status::Ok();
}

Status PreTokenizer::split(std::string_view text, std::vector<std::string>& pieces) const {
  std::vector<std::string> cur;
  cur.emplace_back(text);
  for (const Step& step : steps_) SS_RETURN_IF_ERROR(apply(step, cur));
  for (auto& c : cur)
    if (!c.empty()) pieces.push_back(std::move(c));
  return Status::Ok();
}

}  // namespace sparkserve
