// --device's values (tier/cuda_device.h): plain parsing, in every build.
#include <charconv>

#include "tiermoe/core/error.h"
#include "tiermoe/tier/cuda_device.h"

namespace tiermoe {

DeviceChoice parse_device_choice(std::string_view s, std::string_view flag) {
  using Kind = DeviceChoice::Kind;
  if (s == "none") return {Kind::none, 0};
  if (s == "cpu") return {Kind::cpu, 0};
  if (s == "cuda") return {Kind::cuda, 0};
  if (s.starts_with("cuda:")) {
    const std::string_view n = s.substr(5);
    int ordinal = -1;
    const auto [end, ec] = std::from_chars(n.data(), n.data() + n.size(), ordinal);
    if (ec == std::errc() && end == n.data() + n.size() && !n.empty() && ordinal >= 0) {
      return {Kind::cuda, ordinal};
    }
  }
  throw Error(detail::str_of("unknown ", flag, " '", s, "'"), std::string(flag),
              "use none, cpu, cuda or cuda:N (N: the GPU's index, from 0)");
}

}  // namespace tiermoe
