#pragma once
// train --report FILE: the run report (tiermoe report's page) written at the
// end of the run and refreshed at each checkpoint while it runs.
#include <string>

#include "tiermoe/train/trainer_session.h"

namespace tiermoe::cli {

// Before the run: checks FILE's directory, makes the metrics go to
// OUT/metrics.jsonl when --metrics is not given (an Error without --out
// either), and hooks the live refresh into `control`'s checkpoints.
void prepare_train_report(const std::string& report, RunControl& control);
// After the run: the final page, from the metrics and the last routing
// profile (the last checkpoint's, else --profile-out's).
void write_train_report(const std::string& report, const RunControl& control,
                        const TrainSummary& summary, const std::string& profile_out);

}  // namespace tiermoe::cli
