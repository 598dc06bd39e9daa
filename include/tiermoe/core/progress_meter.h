#pragma once
// Progress of long work a user waits for (loading and converting a
// checkpoint, init of a large preset, the device tier's start-up
// measurements), written to a log stream (stderr; never stdout, whose last
// line --json owns).
//
// On a terminal it is one line rewritten in place (\r), at most every
// tty_interval_s:   "load ckpt/: 41% (12.3 of 30.5 GB), 1.20 GB/s, ETA 0:15"
// Otherwise (a log file, a pipe) a plain line each time another
// quiet_fraction of the work is done or quiet_interval_s have passed since
// the last line, whichever comes first, and a last line when it finishes:
//                   "load ckpt/: done, 30.5 GB in 0:25"
// Work that ends within delay_s prints nothing at all, so quick loads (and
// the test suite's tiny models) stay as quiet as before.
//
// Amounts are bytes (shown as KB/MB/GB, decimal like file sizes) or plain
// counts with a unit word ("3 of 5 stages"). The clock is injectable, for
// tests of the rate limit.
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>

namespace tiermoe {

// Where progress goes; out null: nowhere.
struct ProgressSink {
  std::ostream* out = nullptr;
  bool tty = false;  // rewrite one line in place
};

struct ProgressMeterOptions {
  std::string unit = "bytes";     // "bytes", or a word for counts ("stages", "shards")
  double delay_s = 1.0;           // nothing is printed before this much time has passed
  double tty_interval_s = 0.25;   // terminal: at most 4 updates a second
  double quiet_interval_s = 30;   // otherwise: a line at least this often...
  double quiet_fraction = 0.25;   // ... and each time this much more is done
  std::function<double()> clock;  // seconds on a monotonic clock; default steady_clock
};

class ProgressMeter {
 public:
  // `what` begins every line ("load ckpt/"); `total` > 0 is the whole amount.
  ProgressMeter(ProgressSink sink, std::string what, double total,
                ProgressMeterOptions options = {});
  // Ends a terminal line left open (an exception unwinding through the work).
  ~ProgressMeter();
  ProgressMeter(const ProgressMeter&) = delete;
  ProgressMeter& operator=(const ProgressMeter&) = delete;

  void advance(double amount) { update(done_ + amount); }
  void update(double done);
  // The last line ("done, ... in m:ss") when anything was printed before.
  void finish();

  // "41% (12.3 of 30.5 GB), 1.20 GB/s, ETA 0:15" for `done` after `elapsed_s`.
  std::string status(double done, double elapsed_s) const;

 private:
  double now() const;
  void print(const std::string& text);

  ProgressSink sink_;
  std::string what_;
  double total_;
  ProgressMeterOptions options_;
  double start_s_ = 0, done_ = 0;
  double last_print_s_ = -1, last_print_done_ = 0;  // -1: nothing printed yet
  bool open_line_ = false, finished_ = false;
};

}  // namespace tiermoe
