// tiermoe: the command line. Each subcommand lives in its own file and is
// registered here (commands.h). Exit codes: 0 success, 1 a tiermoe::Error
// (printed as `error: ...`), 2 a command-line parse error, 128 + N a
// training run stopped by signal N (after saving a checkpoint).
#include <iostream>
#include <new>

#include "commands.h"
#include "flag_bounds.h"
#include "stop_signals.h"
#include "tiermoe/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"TierMoE: train Mixture-of-Experts transformers whose experts do not fit in "
               "accelerator memory",
               "tiermoe"};
  app.set_version_flag("--version", std::string("tiermoe ") + TIERMOE_VERSION);
  app.require_subcommand(1);
  // Subcommands pass flags they do not know (--version) up to the app.
  app.fallthrough();
  // Parse errors read like the library's errors: one `error:` line (the flag
  // and what is wrong with it), then where the flags are described.
  app.failure_message([](const CLI::App* top, const CLI::Error& e) {
    std::string command = top->get_name();
    for (const CLI::App* sub = top; !sub->get_subcommands().empty();) {
      sub = sub->get_subcommands().front();
      command += " " + sub->get_name();
    }
    return "error: " + std::string(e.what()) + "\n  hint: `" + command +
           " --help` lists the flags and their ranges\n";
  });

  tiermoe::cli::add_init_command(app);
  tiermoe::cli::add_inspect_command(app);
  tiermoe::cli::add_bench_command(app);
  tiermoe::cli::add_train_command(app);
  tiermoe::cli::add_eval_command(app);
  tiermoe::cli::add_plan_command(app);
  tiermoe::cli::add_report_command(app);
  tiermoe::cli::add_quantize_command(app);
  tiermoe::cli::integers_in_base_10(app);

  try {
    tiermoe::cli::bound_omp_num_threads();
    app.parse(argc, argv);
  } catch (const CLI::Success& e) {
    return app.exit(e);  // --help, --version
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  } catch (const tiermoe::cli::ExitStatus& e) {
    return e.code;  // the command said why
  } catch (const tiermoe::Error& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  } catch (const std::bad_alloc&) {
    // The checks before a run cover what it is certain to allocate; this is
    // what slipped past them.
    std::cerr << "error: out of host memory (std::bad_alloc)\n  hint: a smaller model, batch or "
                 "sequence length needs less; the up-front memory check missed this allocation, "
                 "please report it\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
