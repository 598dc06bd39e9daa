#pragma once
// The progress display on stderr: step/steps, loss (beside the loss floor
// when the data has one), lr, grad norm, tokens/s and ETA.
//
// On a terminal it is one line rewritten in place (\r) every step; in a log
// file or pipe it is a plain line every `every` steps (and on the first and
// last), so logs stay readable.
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#include "tiermoe/train/trainer.h"

namespace tiermoe {

struct ProgressOptions {
  int64_t total_steps = 1;
  bool tty = false;                  // rewrite one line in place
  int64_t every = 0;                 // non-tty: a line every `every` steps; 0: about 25 lines a run
  std::optional<double> loss_floor;  // printed beside the loss
};

class ProgressPrinter {
 public:
  ProgressPrinter(std::ostream& out, ProgressOptions options);
  // After each step: `elapsed_s` and `steps_run` are this process's (for the
  // rate and the ETA), `tokens_run` the tokens it processed.
  void update(const StepStats& s, double elapsed_s, int64_t steps_run, int64_t tokens_run);
  // Ends the in-place line (tty).
  void finish();

 private:
  std::ostream& out_;
  ProgressOptions options_;
  bool open_line_ = false;
};

// "1:05" / "1:02:03" for a duration in seconds.
std::string format_duration(double seconds);
// "1.83 (floor 1.69)" or "1.83".
std::string format_loss(double loss, std::optional<double> floor);

}  // namespace tiermoe
