// The built-in chat page (GET /): static HTML, CSS and JavaScript compiled into the binary.
#pragma once

#include <string_view>

namespace sparkserve {

std::string_view chat_page_html();

}  // namespace sparkserve
