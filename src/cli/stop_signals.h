#pragma once
// SIGINT, SIGTERM and SIGHUP during `tiermoe train`: the first signal asks
// the run to stop after the step in progress, which then saves a checkpoint,
// says where it went and exits 128 + the signal's number; a second signal
// ends the process at once, as it would have without this, unless it comes
// within a second of the first (a wrapper such as timeout(1) signals both
// the process and its group: one request, delivered twice). Under mpirun,
// SIGTERM is left to its handler there (mpirun sends it to end a job one of
// whose ranks failed), and the ranks agree on a stop after each step.
#include <signal.h>

#include <string>
#include <utility>
#include <vector>

namespace tiermoe::cli {

class StopSignals {
 public:
  // `saves`: the run has an --out, so the message promises a checkpoint.
  StopSignals(bool sigterm, bool saves);
  ~StopSignals();  // the previous handlers back
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received, 0 while none.
  static int received();

 private:
  std::vector<std::pair<int, struct sigaction>> previous_;
};

// "SIGINT", "SIGTERM", ...
std::string signal_name(int sig);

// Thrown by a command that ends with a non-zero status after saying why
// itself (a stopped run); main returns `code` without another message.
struct ExitStatus {
  int code;
};

}  // namespace tiermoe::cli
