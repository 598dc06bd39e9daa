#pragma once
// Stops a run that has diverged while every number stays finite (the NaN
// guard of grad_clip.h stops the others). A step is suspect under either of
// two rules, each counted over consecutive steps; `patience` suspect steps
// in a row under one rule stop the run with an Error naming the step:
//
//   blow-up  loss > factor * mean and loss > mean + 1 nat, where `mean` is a
//            running mean (EMA, decay 0.9) over the steps that were not
//            suspect, so a plateau after a jump never becomes the norm;
//   dead     the pre-clip global grad norm is below 1e-6 while the loss is
//            at least 0.9 * ln(vocab), chance: the model predicts nothing
//            and learns nothing (AdamW or SGD at --lr 1e6 end there, the
//            weights ~1e6, the loss pinned at ln V, the gradient exactly 0).
//
// A healthy run's loss falls from about chance, so neither rule can see its
// start as suspect: the blow-up rule needs the loss to double against a mean
// that starts at the first loss, and a model at chance has a large gradient.
// Batch-to-batch noise does not last `patience` steps.
#include <cstdint>
#include <vector>

namespace tiermoe {

struct DivergenceOptions {
  int64_t patience = 10;  // suspect steps in a row that stop the run (0: never stop)
  double factor = 2.0;    // blow-up: the loss above this many times its running mean

  // Throws an Error naming the flag for a value out of range.
  void validate() const;
};

class DivergenceGuard {
 public:
  DivergenceGuard(DivergenceOptions options, int64_t vocab_size);

  // Step `step`'s loss and pre-clip grad norm; throws an Error when this
  // step makes `patience` suspect steps in a row.
  void observe(int64_t step, double loss, double grad_norm);
  // A resumed run's losses of steps 1..N, so the running mean and the
  // blow-up count continue (grad norms are not saved: the dead count starts
  // again). Never throws.
  void replay(const std::vector<double>& losses);

  double mean() const { return mean_; }

 private:
  // Updates the counts with one step; true when one reached the patience.
  bool update(double loss, double grad_norm);

  DivergenceOptions options_;
  double chance_;  // ln(vocab)
  double mean_ = 0;
  int64_t seen_ = 0;
  int64_t blowup_run_ = 0, dead_run_ = 0;
};

}  // namespace tiermoe
