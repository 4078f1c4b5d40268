// Splits template source into tokens the way jinja2's lexer does under transformers' settings
// (trim_blocks, lstrip_blocks): the whitespace rules live here, so the parser never sees them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace sparkserve::jinja {

enum class Tok { Data, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, Eof };

struct Token {
  Tok type;
  std::string text;  // Data: the text; String: the unescaped value; Name/Op: the spelling
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
  int column = 1;
};

struct LexOptions {
  bool trim_blocks = true;
  bool lstrip_blocks = true;
};

// Throws JinjaError("TemplateSyntaxError", "line L, column C: ...") on malformed source.
std::vector<Token> tokenize(const std::string& source, const LexOptions& options = {});

const char* token_type_name(Tok t);

}  // namespace sparkserve::jinja
