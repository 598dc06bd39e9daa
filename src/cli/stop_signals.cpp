#include "stop_signals.h"

#include <signal.h>
#include <unistd.h>

#include <array>
#include <ctime>

namespace tiermoe::cli {

namespace {

volatile sig_atomic_t g_received = 0;
// When the first signal came (CLOCK_MONOTONIC; clock_gettime is
// async-signal-safe).
timespec g_first{};
// Composed before the handlers go in: a handler may only write(2) it.
std::array<std::string, NSIG> g_message;

// Signals this close to the first are the same request: a wrapper such as
// timeout(1) signals the process and its group, so the run gets two.
constexpr long kSameRequestNs = 1'000'000'000;

void on_stop_signal(int sig) {
  if (g_received != 0) {
    timespec now{};
    ::clock_gettime(CLOCK_MONOTONIC, &now);
    const long long since =
        (now.tv_sec - g_first.tv_sec) * 1'000'000'000LL + (now.tv_nsec - g_first.tv_nsec);
    if (since < kSameRequestNs) return;
    // A second request: what the signal would have done without the handler.
    ::signal(sig, SIG_DFL);
    ::raise(sig);
    return;
  }
  ::clock_gettime(CLOCK_MONOTONIC, &g_first);
  g_received = sig;
  const std::string& msg = g_message[size_t(sig)];
  ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
  (void)ignored;
}

}  // namespace

std::string signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "signal " + std::to_string(sig);
  }
}

StopSignals::StopSignals(bool sigterm, bool saves) {
  g_received = 0;
  std::vector<int> sigs = {SIGINT, SIGHUP};
  if (sigterm) sigs.push_back(SIGTERM);
  for (int sig : sigs) {
    g_message[size_t(sig)] =
        "\ntrain: " + signal_name(sig) + " received: finishing the step in progress, then " +
        (saves ? "saving a checkpoint" : "stopping (no --out given: nothing is saved)") +
        "; send it again (a second or more later) to stop at once\n";
    struct sigaction sa {
    }, old{};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    ::sigaction(sig, &sa, &old);
    previous_.emplace_back(sig, old);
  }
}

StopSignals::~StopSignals() {
  for (const auto& [sig, old] : previous_) ::sigaction(sig, &old, nullptr);
}

int StopSignals::received() { return g_received; }

}  // namespace tiermoe::cli
