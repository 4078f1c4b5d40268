// Helpers for the parser tests: deterministic tool-call ids, splitting a text into pieces, and
// assembling streamed deltas back into one message.
#pragma once

#include "text/output_parser.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <string>
#include <vector>

namespace sparkserve::testing {

inline ToolCallIdGenerator counter_ids() {
  auto n = std::make_shared<int>(0);
  return [n] {
    char buf[32];
    std::snprintf(buf, sizeof buf, "call_%024d", (*n)++);
    return std::string(buf);
  };
}

// Cut points: all single splits are done by the tests themselves; these give multi-splits.
inline std::vector<std::string> split_at(const std::string& text, std::vector<size_t> cuts) {
  std::sort(cuts.begin(), cuts.end());
  std::vector<std::string> pieces;
  size_t prev = 0;
  for (size_t c : cuts) {
    pieces.push_back(text.substr(prev, c - prev));
    prev = c;
  }
  pieces.push_back(text.substr(prev));
  return pieces;
}

inline std::vector<std::vector<std::string>> split_plans(const std::string& text, int random_plans, uint32_t seed) {
  std::vector<std::vector<std::string>> plans;
  for (size_t i = 0; i <= text.size(); ++i) plans.push_back(split_at(text, {i}));
  std::vector<std::string> chars;
  for (char c : text) chars.emplace_back(1, c);
  if (!chars.empty()) plans.push_back(chars);
  std::mt19937 rng(seed);
  for (int p = 0; p < random_plans; ++p) {
    std::vector<size_t> cuts;
    int k = static_cast<int>(rng() % 8) + 1;
    for (int i = 0; i < k; ++i) cuts.push_back(text.empty() ? 0 : rng() % (text.size() + 1));
    plans.push_back(split_at(text, cuts));
  }
  return plans;
}

// A streamed message put back together, checking OpenAI delta rules on the way.
struct AssembledCall {
  std::string id, name, arguments;
  int headers = 0;
};

struct Assembled {
  std::string reasoning, content;
  std::vector<AssembledCall> calls;

  void add(const std::vector<ToolCallDelta>& deltas) {
    for (const auto& d : deltas) {
      ASSERT_GE(d.index, 0);
      if (static_cast<size_t>(d.index) == calls.size()) {
        // A new call must open with its header: id, name, and empty arguments.
        ASSERT_TRUE(d.id.has_value()) << "first delta of call " << d.index << " lacks id";
        ASSERT_TRUE(d.name.has_value());
        EXPECT_EQ(d.arguments, "");
        calls.push_back({*d.id, *d.name, "", 1});
        continue;
      }
      ASSERT_LT(static_cast<size_t>(d.index), calls.size()) << "index skipped";
      ASSERT_FALSE(d.id.has_value()) << "id repeated for call " << d.index;
      ASSERT_FALSE(d.name.has_value()) << "name repeated for call " << d.index;
      calls[static_cast<size_t>(d.index)].arguments += d.arguments;
    }
  }
  void add(const OutputDelta& d) {
    reasoning += d.reasoning;
    content += d.content;
    add(d.tool_calls);
  }
};

}  // namespace sparkserve::testing
