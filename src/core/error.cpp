#include "tiermoe/core/error.h"

namespace tiermoe {

namespace {
std::string format(const std::string& what, const std::string& where, const std::string& hint) {
  std::string s = what;
  if (!where.empty()) s += " [" + where + "]";
  if (!hint.empty()) s += "\n  hint: " + hint;
  return s;
}
}  // namespace

Error::Error(std::string what, std::string where, std::string hint)
    : std::runtime_error(format(what, where, hint)),
      what_(std::move(what)),
      where_(std::move(where)),
      hint_(std::move(hint)) {}

}  // namespace tiermoe
