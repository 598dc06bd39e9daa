#include "flag_bounds.h"

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe::cli {

using detail::str_of;

namespace {

std::string because(const std::string& why) { return why.empty() ? "" : " (" + why + ")"; }

}  // namespace

CLI::Validator count_in(int64_t lo, int64_t hi, const std::string& why) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        int64_t v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not an integer";
        if (v < lo || v > hi) {
          return str_of(text, " is outside [", lo, ", ", hi, "]", because(why));
        }
        return {};
      },
      str_of("INT in [", lo, ", ", hi, "]"));
}

CLI::Validator number_in(double lo, double hi, const std::string& why) {
  auto bound = [](double b) {
    std::ostringstream os;
    os << b;
    return os.str();
  };
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double v = 0;
        if (!CLI::detail::lexical_cast(text, v)) return "'" + text + "' is not a number";
        if (!std::isfinite(v) || v < lo || v > hi) {
          return str_of(text, " is outside [", bound(lo), ", ", bound(hi), "]", because(why));
        }
        return {};
      },
      str_of("NUMBER in [", bound(lo), ", ", bound(hi), "]"));
}

int max_threads() { return 4 * default_num_threads(); }

void bound_omp_num_threads() {
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env == nullptr || num_threads() <= max_threads()) return;
  std::cerr << "warning: OMP_NUM_THREADS=" << env << " is above 4 x the " << default_num_threads()
            << " cores this process may run on; using " << default_num_threads() << " threads\n";
  set_num_threads(0);
}

}  // namespace tiermoe::cli
