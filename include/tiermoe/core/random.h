#pragma once
// A small, seedable, serialisable random generator (xoshiro256** seeded by
// splitmix64). Its whole state is four words, so checkpoints can save it and
// a resumed run draws the same numbers as one that never stopped.
#include <array>
#include <cstdint>

namespace tiermoe {

class Tensor;

class Rng {
 public:
  explicit Rng(uint64_t seed = 0);

  uint64_t next_u64();
  double uniform();                    // [0, 1), 53 random bits
  double uniform(double lo, double hi);
  double normal();                     // standard normal (Box-Muller)
  uint64_t below(uint64_t n);          // uniform integer in [0, n), unbiased

  std::array<uint64_t, 4> state() const { return s_; }
  void set_state(const std::array<uint64_t, 4>& s) { s_ = s; }

 private:
  std::array<uint64_t, 4> s_;
};

// In-place initialisers (values drawn in f64, then rounded to the dtype).
void fill_normal(Tensor& t, Rng& rng, double mean, double std);
void fill_uniform(Tensor& t, Rng& rng, double lo, double hi);

}  // namespace tiermoe
