// Validation and normalization of chat `messages` and `tools` before they reach the template.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "server/api_error.h"
#include "server/json_fields.h"

namespace sparkserve {

// messages: the request's "messages" value. Checks every message (role in system / user /
// assistant / tool; content a string, null where allowed, or a list of text and image_url parts
// (their shape; server/image_input.h loads the images); tool_calls
// with a function name and JSON arguments; string reasoning fields and tool_call_id) and
// returns them where `reasoning` is mapped to `reasoning_content` (the template's name) and
// tool-call arguments given as JSON text are parsed into objects (vLLM does the same; the
// Qwen template iterates arguments|items). Audio / video parts are refused. Takes the messages by
// value: a request parser moves its body's messages in (an agent's are ~30 KB of JSON).
ApiResult<RequestJson> normalize_chat_messages(RequestJson messages);

// tools: the request's "tools" value: a list of {"type":"function","function":{"name",
// "description"?, "parameters"?, "strict"?}}.
// Returns them as they are (moved in, as the messages above).
ApiResult<RequestJson> validate_tools(RequestJson tools);

// An OpenAI function tool from another API's tool object (Anthropic {name, description,
// input_schema}, Responses {type: "function", name, description, parameters}): its "name",
// "description" when a string, and `params_key`'s schema (an empty object schema when absent).
// Errors name `path`.name when there is no string name.
ApiResult<RequestJson> as_function_tool(const RequestJson& tool, const char* params_key, const std::string& path);

// Another API's image part (an Anthropic "image" block, a Responses "input_image") as the chat
// path's {"type": "image_url", ...} part; errors name `path`.
using ImagePartMapper = ApiResult<RequestJson> (*)(const RequestJson& part, const std::string& path);

// Chat message content from a string, or from a list of content parts / blocks: text parts are
// those whose "type" is one of text_types ("refusal" parts give their "refusal"); image parts are
// those of type `image_type`, mapped by `image_part` (none: images are refused). Without an image
// the result is the text joined with `sep` (a string); with one, the list of chat parts in order
// ({"type": "text", "text"} and image_url parts). File, audio and document parts are refused;
// other types are errors naming the path.
ApiResult<RequestJson> chat_content_of(const RequestJson& v, const std::string& path,
                                       std::initializer_list<std::string_view> text_types, std::string_view sep,
                                       std::string_view image_type = {}, ImagePartMapper image_part = nullptr);

// chat_content_of for content that must be text: the string.
ApiResult<std::string> join_text_parts(const RequestJson& v, const std::string& path,
                                       std::initializer_list<std::string_view> text_types, std::string_view sep);

// Chat parts ({"type": "text"} / image_url, in order) as message content: their texts joined with
// `sep` when there is no image part, else the parts themselves.
RequestJson chat_content_from_parts(RequestJson parts, std::string_view sep);

}  // namespace sparkserve
