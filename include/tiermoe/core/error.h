#pragma once
// One exception type for everything the library rejects: what went wrong,
// where (file, tensor, layer), and a hint for the user. The library never
// prints-and-exits; the CLI turns an Error into a message and an exit code.
#include <sstream>
#include <stdexcept>
#include <string>

namespace tiermoe {

class Error : public std::runtime_error {
 public:
  Error(std::string what, std::string where = {}, std::string hint = {});

  const std::string& message() const { return what_; }
  const std::string& where() const { return where_; }
  const std::string& hint() const { return hint_; }

 private:
  std::string what_, where_, hint_;
};

namespace detail {
// Builds a string from a stream expression: str_of("x", 3, "y").
template <class... Args>
std::string str_of(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

}  // namespace tiermoe

// Throws tiermoe::Error when `cond` is false. The three message arguments are
// only evaluated on failure, so they may format freely.
#define TIERMOE_CHECK(cond, what, where, hint)                       \
  do {                                                               \
    if (!(cond)) [[unlikely]] {                                      \
      throw ::tiermoe::Error((what), (where), (hint));               \
    }                                                                \
  } while (0)

// For internal invariants (a caller broke a precondition, not user input).
#define TIERMOE_ASSERT(cond, ...)                                                  \
  do {                                                                             \
    if (!(cond)) [[unlikely]] {                                                    \
      throw ::tiermoe::Error(::tiermoe::detail::str_of("internal check failed: ",  \
                                                       #cond, " ", ##__VA_ARGS__), \
                             ::tiermoe::detail::str_of(__FILE__, ":", __LINE__),   \
                             "this is a TierMoE bug; please report it");           \
    }                                                                              \
  } while (0)
