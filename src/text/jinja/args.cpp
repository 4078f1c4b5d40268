#include "text/jinja/builtins.h"
#include "text/jinja/error.h"

namespace sparkserve::jinja {

std::vector<std::optional<Value>> bind_args(const std::string& func, CallArgs& args,
                                            const std::vector<std::string>& names) {
  std::vector<std::optional<Value>> out(names.size());
  if (args.args.size() > names.size())
    type_error(func + "() takes at most " + std::to_string(names.size()) + " argument(s) (" +
               std::to_string(args.args.size()) + " given)");
  for (size_t i = 0; i < args.args.size(); ++i) out[i] = args.args[i];
  for (auto& [k, v] : args.kwargs) {
    size_t i = 0;
    while (i < names.size() && names[i] != k) ++i;
    if (i == names.size()) type_error(func + "() got an unexpected keyword argument '" + k + "'");
    if (out[i]) type_error(func + "() got multiple values for argument '" + k + "'");
    out[i] = v;
  }
  return out;
}

}  // namespace sparkserve::jinja
