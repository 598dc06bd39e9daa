#include "flag_bounds.h"

#include <cerrno>
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

namespace {

CLI::Validator base_10(bool is_unsigned) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        const bool sign = !text.empty() && (text[0] == '-' || text[0] == '+');
        std::string digits = text.substr(sign ? 1 : 0);
        if (digits.empty() || digits.find_first_not_of("0123456789") != std::string::npos) {
          return "'" + text + "' is not a base-10 integer";
        }
        const bool negative = sign && text[0] == '-';
        const size_t first = digits.find_first_not_of('0');
        digits = first == std::string::npos ? "0" : digits.substr(first);
        if (is_unsigned && negative && digits != "0") return text + " is negative";
        errno = 0;
        if (is_unsigned) {
          std::strtoull(digits.c_str(), nullptr, 10);
        } else {
          std::strtoll((negative ? "-" + digits : digits).c_str(), nullptr, 10);
        }
        if (errno == ERANGE) {
          return text + " is outside the range of a " +
                 (is_unsigned ? "64-bit unsigned" : "64-bit") + " integer";
        }
        text = (negative && digits != "0" ? "-" : "") + digits;
        return {};
      },
      "", "base 10");
}

// A number flag: a finite one, written out (CLI11 reads '' as 0 and takes
// inf and nan).
CLI::Validator finite_number() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        double v = 0;
        if (text.empty() || !CLI::detail::lexical_cast(text, v)) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(v)) return text + " is not a finite number";
        return {};
      },
      "", "finite");
}

}  // namespace

void integers_in_base_10(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    const std::string base = type.substr(0, type.find(':'));
    if (base == "INT" || base == "UINT") opt->transform(base_10(base == "UINT"));
    if (base == "FLOAT") opt->transform(finite_number());
  }
  for (CLI::App* sub : app.get_subcommands({})) integers_in_base_10(*sub);
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
