// tiermoe: the command line. Each subcommand lives in its own file and is
// registered here (commands.h). Exit codes: 0 success, 1 a tiermoe::Error
// (printed as `error: ...`), 2 a command-line parse error.
#include <iostream>

#include "commands.h"
#include "tiermoe/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"TierMoE: train Mixture-of-Experts transformers whose experts do not fit in "
               "accelerator memory",
               "tiermoe"};
  app.set_version_flag("--version", std::string("tiermoe ") + TIERMOE_VERSION);
  app.require_subcommand(1);
  // Subcommands pass flags they do not know (--version) up to the app.
  app.fallthrough();

  tiermoe::cli::add_init_command(app);
  tiermoe::cli::add_inspect_command(app);
  tiermoe::cli::add_bench_command(app);
  tiermoe::cli::add_train_command(app);
  tiermoe::cli::add_eval_command(app);
  tiermoe::cli::add_plan_command(app);
  tiermoe::cli::add_report_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const tiermoe::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
