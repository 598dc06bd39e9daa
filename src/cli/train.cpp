// tiermoe train: fine-tune a model (full or LoRA) on token data, with
// checkpoints, bitwise resume, a progress line and per-step metrics.
//
// With no arguments it is the embedded demo: the tiny preset at random
// (--seed) on the built-in Markov corpus, whose entropy rate is the loss
// floor printed beside the loss. The defaults (AdamW lr 3e-3, 20 warmup
// steps (a tenth of a shorter run), cosine to 10%, 2000 steps of 16 x 64
// tokens, f32) end within about 0.01 nats of that floor in under half a
// minute on 2 idle cores (300 steps: 0.1 above it).
//
// --resume takes the run's flags from the checkpoint; a flag given again
// must say the same thing (a different value is an Error naming it), except
// the run-control flags (--out, --save-every, --keep-last, --stop-after,
// --metrics, --json, --threads, --divergence-*), which are this process's
// own; --out defaults to the directory holding the checkpoint.
//
// `mpirun -np P tiermoe train --ep P ...` trains one model over P ranks:
// expert parallel (each rank holds E/P of every MoE layer's experts) and
// data parallel (each rank runs grad_accum/P of the step's micro-batches).
// Results are the bits a single rank gets with the same flags. Rank 0 logs,
// prints --json and writes --metrics; checkpoints are written by all ranks
// together (train/checkpoint.h) and resume on any rank count that divides
// the expert count and --grad-accum. A rank that fails makes the whole job
// stop: an error on one rank aborts all of them, and a rank that dies or
// hangs is noticed by mpirun or by the others' --comm-timeout.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "flag_bounds.h"
#include "run_paths.h"
#include "stop_signals.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/dist/mpi_comm.h"
#include "tiermoe/io/peft.h"
#include "tiermoe/train/checkpoint.h"
#include "tiermoe/train/progress.h"
#include "tiermoe/train/run_fields.h"
#include "tiermoe/train/trainer_session.h"
#include "train_report.h"

namespace tiermoe::cli {

namespace {

namespace fs = std::filesystem;
using detail::str_of;
using nlohmann::json;

struct TrainFlags {
  TrainConfig config;
  std::string dtype = "f32";
  std::string optimizer = "adamw";
  std::string lr_schedule = "cosine";
  double weight_decay = 0.0;  // HF TrainingArguments' default
  bool no_shuffle = false;
  bool no_packing = false;
  int64_t layers = 0;
  std::string experts;  // int4 | int8: the routed experts quantized at load

  bool full = false;
  int64_t lora_rank = 8;
  double lora_alpha = 8;
  std::string lora_targets;
  bool rslora = false;
  std::string lora_init;

  std::string device_memory;  // a byte count with an optional unit
  std::string max_memory;     // the same; empty: MemAvailable
  bool no_replan = false;

  RunControl control;
  std::string resume;
  std::string report;  // an HTML run report, refreshed at checkpoints
  int threads = 0;
  bool json = false;

  int ep = 0;                 // ranks the experts are split over (0: not given)
  double comm_timeout = 600;  // seconds a collective may wait for the other ranks
  std::string inject_fault;   // tests: KIND:RANK:STEP with KIND kill, hang or error
};

bool given(const CLI::App& cmd, const std::string& flag) { return cmd.count(flag) > 0; }

// The run's config from the flags alone.
TrainConfig config_from_flags(TrainFlags& f, const CLI::App& cmd) {
  TrainConfig c = f.config;
  if (given(cmd, "--layers")) c.layers = f.layers;
  // The default warmup is 20 steps, or a tenth of a shorter run.
  if (!given(cmd, "--warmup-steps")) {
    c.trainer.schedule.warmup_steps = std::min<int64_t>(20, c.trainer.steps / 10);
  }
  c.dtype = parse_dtype(f.dtype, "--dtype");
  if (!f.experts.empty()) c.experts = parse_quant_format(f.experts, "--experts");
  TrainerOptions& t = c.trainer;
  t.optimizer = parse_optimizer_kind(f.optimizer);
  t.schedule.kind = parse_lr_schedule(f.lr_schedule);
  t.adamw.weight_decay = t.sgd.weight_decay = f.weight_decay;
  t.shuffle = !f.no_shuffle;
  t.data_seed = c.seed;
  c.pack = !f.no_packing;

  const bool lora = given(cmd, "--lora-rank") || given(cmd, "--lora-alpha") ||
                    given(cmd, "--lora-targets") || given(cmd, "--rslora") ||
                    given(cmd, "--lora-init");
  TIERMOE_CHECK(!(lora && f.full), "--full and the --lora flags exclude each other", "--full",
                "pass --full for full fine-tuning, or --lora-rank R for adapters, not both");
  if (lora) {
    LoraConfig l;
    if (!f.lora_init.empty()) {
      // The adapter's own config, as PEFT's from_pretrained reads it; each
      // flag given replaces its field (--lora-alpha 16 alone keeps the
      // adapter's rank, not the default 8).
      l = from_peft_config(load_peft_adapter(f.lora_init).config, f.lora_init);
      if (given(cmd, "--lora-rank")) l.rank = f.lora_rank;
      if (given(cmd, "--lora-alpha")) l.alpha = f.lora_alpha;
      if (given(cmd, "--rslora")) l.rslora = f.rslora;
      if (given(cmd, "--lora-targets")) l.targets = parse_lora_targets(f.lora_targets);
    } else {
      l.rank = f.lora_rank;
      l.alpha = given(cmd, "--lora-alpha") ? f.lora_alpha : double(f.lora_rank);
      l.rslora = f.rslora;
      if (given(cmd, "--lora-targets")) {  // '' too: refused, not the default
        l.targets = parse_lora_targets(f.lora_targets);
      } else if (!c.model_dir.empty()) {
        // The default is the model's own attention projections (latent
        // attention names other modules than q/k/v/o). A missing config is
        // left to the --model check, whose message says more.
        if (std::filesystem::exists(std::filesystem::path(c.model_dir) / "config.json")) {
          l.targets = lora_default_targets(load_model_config(c.model_dir));
        }
      } else {
        l.targets = lora_default_targets(preset(c.preset));
      }
    }
    c.lora = l;
    c.lora_init = f.lora_init;
  }
  if (!f.device_memory.empty()) {
    c.tier.device_memory = parse_bytes(f.device_memory, "--device-memory");
    if (c.tier.device_memory == 0) {
      throw CLI::ValidationError("--device-memory",
                                 "is 0: give the device tier a positive budget, e.g. 2GiB");
    }
  }
  c.tier.replan = !f.no_replan;
  // trainer_state.json records the files by absolute real path, so a resume
  // from another directory, or naming them another way, finds them the same.
  for (std::string* p : {&c.model_dir, &c.data_file, &c.lora_init, &c.tier.profile_in}) {
    if (!p->empty()) *p = real_path(*p);
  }
  return c;
}

// The first line a run prints: which parameters train, and why (the flag
// that chose it, or the default when none did).
std::string mode_line(const TrainConfig& c, const TrainFlags& f, bool resumed) {
  const std::string why = resumed  ? "as the checkpoint's run"
                          : f.full ? "--full"
                          : c.lora ? "a --lora-* flag given"
                                   : "the default: no --lora-* flag given";
  if (!c.lora) {
    return str_of("train: mode: full fine-tuning (", why,
                  "): every parameter trains, fp32 masters");
  }
  std::string targets;
  for (const std::string& t : c.lora->targets) targets += (targets.empty() ? "" : ",") + t;
  return str_of("train: mode: LoRA (", why, "): rank ", c.lora->rank, ", alpha ", c.lora->alpha,
                c.lora->rslora ? " (rsLoRA)" : "", ", targets ", targets);
}

// On --resume: the checkpoint's config, with the run flags given on this
// command line laid over it (run_training then rejects any that differ).
TrainConfig resumed_config(const TrainConfig& from_flags, const std::string& checkpoint,
                           const CLI::App& cmd) {
  json saved = read_checkpoint_config(checkpoint).to_json();
  const json mine = from_flags.to_json();
  for (const RunField& f : run_fields()) {
    for (const std::string& flag : f.flags) {
      if (given(cmd, flag)) saved[f.key] = mine.at(f.key);
    }
  }
  return TrainConfig::from_json(saved, checkpoint + "/" + kTrainerStateFile);
}

// mpirun ends the other ranks of a job one of whose processes died with
// SIGTERM: say why before going.
void on_sigterm(int) {
  static const char msg[] =
      "tiermoe: stopped by mpirun: another rank of this job failed (see its output above)\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg, sizeof msg - 1);
  (void)ignored;
  ::_exit(1);
}

// --inject-fault KIND:RANK:STEP: on rank RANK, before step STEP, die
// (SIGKILL), hang (sleep for good) or throw an Error. For the tests of a
// failing rank.
std::function<void(int64_t)> fault_hook(const std::string& spec, int rank) {
  if (spec.empty()) return {};
  const size_t a = spec.find(':'), b = spec.rfind(':');
  TIERMOE_CHECK(a != std::string::npos && b != a, "expected KIND:RANK:STEP, got '" + spec + "'",
                "--inject-fault", "e.g. kill:1:2");
  const std::string kind = spec.substr(0, a);
  const int on_rank = std::stoi(spec.substr(a + 1, b - a - 1));
  const int64_t at_step = std::stoll(spec.substr(b + 1));
  TIERMOE_CHECK(kind == "kill" || kind == "hang" || kind == "error" || kind == "sigint",
                "unknown fault '" + kind + "'", "--inject-fault",
                "use kill, hang, error or sigint");
  if (on_rank != rank) return {};
  return [kind, at_step, rank](int64_t step) {
    if (step != at_step) return;
    std::cerr << "tiermoe: rank " << rank << ": injected fault '" << kind << "' before step "
              << step << std::endl;
    if (kind == "kill") ::raise(SIGKILL);
    if (kind == "sigint") {
      ::raise(SIGINT);  // as a user's Ctrl-C during the step
      return;
    }
    if (kind == "hang") {
      for (;;) ::pause();
    }
    throw Error("injected error", "--inject-fault", "a test of a failing rank");
  };
}

// Each of P ranks runs grad_accum / P micro-batches of --batch rows a step.
// A fresh run that left --grad-accum out splits one process's step over the
// ranks (B rows: P micro-batches of B / P, the same rows in the same order),
// or, when B does not divide, runs one micro-batch a rank (a step of P x B
// rows), and says so. A resume keeps its checkpoint's accumulation, so the
// ranks must divide it; --grad-accum cannot change on resume, so the hint is
// the rank count.
void fit_batch_to_ranks(TrainConfig& config, int ranks, const TrainFlags& f, const CLI::App& cmd,
                        bool log) {
  TrainerOptions& t = config.trainer;
  if (ranks == 1 || t.grad_accum % ranks == 0) return;
  if (!f.resume.empty()) {
    std::string divisors;
    for (int64_t d = 1; d <= t.grad_accum; ++d) {
      if (t.grad_accum % d == 0) divisors += (divisors.empty() ? "" : ", ") + std::to_string(d);
    }
    throw Error(
        str_of("the checkpoint's run accumulates ", t.grad_accum,
               " micro-batch(es) a step, which the ", ranks, " ranks started do not divide"),
        f.resume,
        str_of("resume it under mpirun -np N with N one of ", divisors,
               " (each rank runs grad_accum / N micro-batches)"));
  }
  if (given(cmd, "--grad-accum")) return;  // validate() refuses it with a hint
  if (t.batch % ranks == 0) {
    if (log) {
      std::cerr << str_of("train: --grad-accum not given: the ", ranks, " ranks split each step's ",
                          t.batch, " rows, ", t.batch / ranks, " each (as --batch ",
                          t.batch / ranks, " --grad-accum ", ranks, ")\n");
    }
    t.batch /= ranks;
  } else if (log) {
    std::cerr << str_of("train: --grad-accum not given and --batch ", t.batch,
                        " does not split over ", ranks,
                        " ranks: each rank runs one micro-batch of ", t.batch, " rows, a step of ",
                        ranks * t.batch, " rows (as --grad-accum ", ranks, ")\n");
  }
  t.grad_accum = ranks;
}

// No output of the run may destroy an input or another output (run_paths.h);
// checked before loading, so a bad path fails before step 1.
void check_run_paths(const TrainConfig& config, const RunControl& control, const TrainFlags& f) {
  if (!control.out_dir.empty()) fs::create_directories(control.out_dir);
  RunPaths paths;
  paths.input_dir(config.model_dir, "--model");
  paths.input_file(config.data_file, "--data");
  paths.input_dir(config.lora_init, "--lora-init");
  paths.input_dir(control.resume, "--resume");
  paths.input_file(config.tier.profile_in, "--profile-in");
  paths.run_dir(control.out_dir);
  paths.output(control.metrics_file, f.control.metrics_file.empty()
                                         ? "the metrics (--report's OUT/metrics.jsonl)"
                                         : "--metrics");
  paths.output(f.report, "--report");
  paths.output(config.tier.profile_out, "--profile-out");
  paths.check();
}

void run_train_on(TrainFlags& f, const CLI::App& cmd, MpiComm* mpi) {
  const int ranks = mpi ? mpi->size() : 1, rank = mpi ? mpi->rank() : 0;
  TIERMOE_CHECK(f.ep == 0 || f.ep == ranks,
                str_of("--ep ", f.ep, " but ", ranks, " rank(s) were started"), "--ep",
                str_of("start the run with mpirun -np ", f.ep, " tiermoe train --ep ", f.ep,
                       " ...; --ep must equal the number of ranks"));
  TIERMOE_CHECK(ranks == 1 || f.ep == ranks,
                str_of("mpirun started ", ranks, " ranks but --ep is not given"), "--ep",
                str_of("pass --ep ", ranks,
                       " (without it every rank would train a model of its own into the same "
                       "--out)"));
  if (f.threads > 0) {
    set_num_threads(f.threads);
  } else if (mpi && mpi->local_size() > 1) {
    // The ranks on this host share its cores.
    set_num_threads(std::max(1, default_num_threads() / mpi->local_size()));
  }
  // Flags that promise checkpoints need somewhere to write them.
  for (const char* flag : {"--save-every", "--keep-last", "--stop-after"}) {
    if (given(cmd, flag) && f.control.out_dir.empty() && f.resume.empty()) {
      throw CLI::ValidationError(
          flag,
          "saves checkpoints, and the run has no --out to save them in (pass --out DIR, "
          "or --resume a run, which keeps writing where it was)");
    }
  }
  TrainConfig config = config_from_flags(f, cmd);
  RunControl control = f.control;
  if (!f.max_memory.empty()) {
    control.max_memory = parse_bytes(f.max_memory, "--max-memory");
    // 0 would read as "no limit" (RunControl's unset value): refused, as --device-memory 0 is.
    if (control.max_memory == 0) {
      throw CLI::ValidationError("--max-memory",
                                 "is 0: give a positive limit, e.g. 20GiB, or leave it out for the "
                                 "host's MemAvailable");
    }
  }
  if (!f.resume.empty()) {
    control.resume = resolve_checkpoint(f.resume);
    // A resumed run keeps writing where it was writing.
    if (control.out_dir.empty()) control.out_dir = fs::path(control.resume).parent_path().string();
    const TierRunConfig tier = config.tier;  // where experts run is this process's choice
    config = resumed_config(config, control.resume, cmd);
    config.tier = tier;
  }
  fit_batch_to_ranks(config, ranks, f, cmd, rank == 0);
  if (rank == 0) std::cerr << mode_line(config, f, !f.resume.empty()) << "\n";
  control.comm = mpi;
  control.log = rank == 0 ? &std::cerr : nullptr;
  control.progress_tty = ::isatty(STDERR_FILENO) == 1;
  if (!f.report.empty() && rank == 0) prepare_train_report(f.report, control);
  check_run_paths(config, control, f);
  if (rank != 0) control.metrics_file.clear();
  control.before_step = fault_hook(f.inject_fault, rank);
  // Under mpirun SIGTERM means another rank failed (on_sigterm).
  const StopSignals signals(/*sigterm=*/!mpi || mpi->size() == 1, !control.out_dir.empty());
  control.stop_requested = &StopSignals::received;

  const TrainSummary summary = run_training(config, control);
  if (rank == 0) {
    if (!f.report.empty()) write_train_report(f.report, control, summary, config.tier.profile_out);
    if (f.json) {
      std::cout << summary.to_json().dump() << "\n";
    } else {
      std::cout << "loss " << format_loss(summary.final_loss, summary.loss_floor) << " after "
                << summary.steps << " steps\n";
    }
  }
  if (summary.stopped_by == 0) return;
  if (rank == 0) {
    std::cerr << "train: stopped by " << signal_name(summary.stopped_by) << " after step "
              << summary.steps << " of " << config.trainer.steps << "; ";
    if (control.out_dir.empty()) {
      std::cerr << "nothing saved (no --out given)\n";
    } else if (summary.last_checkpoint.empty()) {
      std::cerr << "nothing saved (no step was done)\n";
    } else {
      std::cerr << "checkpoint saved to " << summary.last_checkpoint
                << "\n  hint: continue with `tiermoe train --resume " << summary.last_checkpoint
                << "`\n";
    }
  }
  throw ExitStatus{128 + summary.stopped_by};
}

void run_train(TrainFlags& f, const CLI::App& cmd) {
  if (!launched_by_mpirun()) {
    run_train_on(f, cmd, nullptr);
    return;
  }
  MpiComm mpi(f.comm_timeout);
  if (mpi.size() > 1) ::signal(SIGTERM, on_sigterm);
  try {
    run_train_on(f, cmd, &mpi);
  } catch (const std::exception& e) {
    if (mpi.size() == 1) throw;
    // The other ranks may wait in a collective for this one: end them all.
    // The message goes out in one write, so the ranks' never interleave; the
    // other ranks wait a moment first, so that when every rank fails alike
    // (bad data, a bad path) rank 0's abort ends them before they repeat it.
    const std::string msg =
        str_of("error: rank ", mpi.rank(), " of ", mpi.size(), ": ", e.what(), "\n");
    if (mpi.rank() != 0) std::this_thread::sleep_for(std::chrono::seconds(2));
    write_all(STDERR_FILENO, msg.data(), msg.size(), "stderr");
    mpi.abort(1);
  }
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto f = std::make_shared<TrainFlags>();
  TrainConfig& c = f->config;
  TrainerOptions& t = c.trainer;
  // The embedded demo's defaults (see the file comment).
  t.steps = 2000;
  t.batch = 16;
  t.seq_len = 64;
  t.schedule.base_lr = 3e-3;
  t.schedule.warmup_steps = 20;
  t.schedule.min_lr_ratio = 0.1;

  CLI::App* cmd = app.add_subcommand(
      "train",
      "Fine-tune a model (full or LoRA); with no arguments, the tiny demo on a built-in corpus");
  CLI::Option* model =
      cmd->add_option("--model", c.model_dir, "Hugging Face checkpoint directory to start from");
  CLI::Option* preset_opt =
      cmd->add_option("--preset", c.preset, "Without --model: a preset initialised at random")
          ->capture_default_str();
  CLI::Option* layers =
      cmd->add_option("--layers", f->layers, "Decoder layers of the preset (default: the preset's)")
          ->check(count_in(1, ModelConfig::kMaxLayers));
  // A checkpoint has its own shape: a preset or a layer count beside it
  // would be ignored.
  model->excludes(preset_opt);
  model->excludes(layers);
  cmd->add_option("--data", c.data_file,
                  "Token file (.npy or llm.c .bin), or SFT JSON Lines (input_ids + labels or "
                  "assistant_mask); default: the built-in Markov corpus");
  cmd->add_flag("--no-packing", f->no_packing,
                "SFT data: one example per row, padded (default: examples packed into rows)");
  cmd->add_option("--lm-head-chunk", c.lm_head_chunk,
                  "Token rows per LM head chunk: the logits are never whole (0: all at once)")
      ->capture_default_str()
      ->check(count_in(0, kMaxCount));
  cmd->add_option("--corpus-tokens", c.corpus_tokens, "Tokens sampled from the built-in corpus")
      ->capture_default_str()
      ->check(count_in(2, int64_t(1) << 30, "the corpus is held in memory, 4 bytes a token"));
  cmd->add_option("--steps", t.steps, "Optimizer steps")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  cmd->add_option("--batch", t.batch, "Sequences per micro-batch")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  cmd->add_option("--seq-len", t.seq_len, "Tokens per sequence")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  cmd->add_option("--grad-accum", t.grad_accum, "Micro-batches per optimizer step")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  cmd->add_option("--dtype", f->dtype, "Compute dtype: bf16|f32|f64")->capture_default_str();
  cmd->add_option("--seed", c.seed, "Seed of the random init, LoRA init, corpus sample and shuffle")
      ->capture_default_str();
  cmd->add_option("--threads", f->threads, "CPU threads (default: all cores)")
      ->check(count_in(1, max_threads(), "4 x the cores: more only oversubscribe them"));
  cmd->add_option("--remat", c.remat, "Remat policy: none|full|default|save-w2-only|save:<regions>")
      ->capture_default_str();
  cmd->add_option("--absorb-scores", c.absorb, "Absorb router scores: auto|on|off")
      ->capture_default_str();
  cmd->add_option("--experts", f->experts,
                  "Keep the routed experts at int4|int8, quantized at load and frozen (LoRA runs; "
                  "default: the compute dtype)");
  cmd->add_option("--experts-group", c.experts_group,
                  "Columns per scale of --experts int4|int8 (compressed-tensors' group size)")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  cmd->add_flag("--dequantize", c.dequantize,
                "Full fine-tuning of a checkpoint shipped at low width (MXFP4, FP8, int4/int8): "
                "train copies dequantized to --dtype");

  cmd->add_option("--optimizer", f->optimizer, "adamw|sgd")->capture_default_str();
  cmd->add_option("--lr", t.schedule.base_lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--lr-schedule", f->lr_schedule, "cosine|constant (after warmup)")
      ->capture_default_str();
  cmd->add_option("--warmup-steps", t.schedule.warmup_steps,
                  "Linear warmup steps (default: 20, or --steps / 10 when fewer)");
  cmd->add_option("--min-lr-ratio", t.schedule.min_lr_ratio, "Cosine floor as a fraction of --lr")
      ->capture_default_str();
  cmd->add_option("--weight-decay", f->weight_decay,
                  "Decoupled (AdamW) or coupled (SGD) weight decay; norms and biases exempt")
      ->capture_default_str()
      ->check(number_in(0, HUGE_VAL, "a decay rate"));
  cmd->add_option("--adam-beta1", t.adamw.beta1)->capture_default_str();
  cmd->add_option("--adam-beta2", t.adamw.beta2)->capture_default_str();
  cmd->add_option("--adam-eps", t.adamw.eps)->capture_default_str();
  cmd->add_option("--momentum", t.sgd.momentum, "SGD momentum")->capture_default_str();
  cmd->add_option("--max-grad-norm", t.max_grad_norm, "Global-norm clipping (0: off)")
      ->capture_default_str()
      ->check(number_in(0, HUGE_VAL, "a norm; 0 turns clipping off"));
  cmd->add_flag("--no-shuffle", f->no_shuffle, "Walk the data windows in order");

  cmd->add_flag("--full", f->full,
                "Full fine-tuning: every parameter trainable (fp32 masters); the mode when no "
                "--lora-* flag is given");
  cmd->add_option("--lora-rank", f->lora_rank,
                  "LoRA rank R; any --lora-* flag selects LoRA (rank 8 when only the others are "
                  "given), none means full fine-tuning")
      ->check(count_in(1, int64_t(1) << 16));
  cmd->add_option("--lora-alpha", f->lora_alpha, "LoRA alpha (default: the rank)");
  cmd->add_option("--lora-targets", f->lora_targets,
                  "Comma-separated q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj "
                  "(default: q_proj,k_proj,v_proj,o_proj; DeepSeek-V3's latent attention: "
                  "q_a_proj,q_b_proj,kv_a_proj_with_mqa,kv_b_proj,o_proj)");
  cmd->add_flag("--rslora", f->rslora, "Scale by alpha/sqrt(R) instead of alpha/R");
  cmd->add_option("--lora-init", f->lora_init, "PEFT adapter directory to start from");

  TierRunConfig& d = c.tier;
  CLI::Option* device =
      cmd->add_option("--device", d.device,
                      "Device tier for hot experts: cpu (the CPU backend), cuda or cuda:N (a GPU; "
                      "builds with the CUDA toolkit), or none")
          ->capture_default_str();
  // The device tier's settings mean nothing without a device: each needs
  // --device rather than being silently ignored.
  std::vector<CLI::Option*> tier_flags;
  tier_flags.push_back(
      cmd->add_option("--device-memory", f->device_memory,
                      "The device tier's memory budget, e.g. 2GiB (required with --device)"));
  tier_flags.push_back(cmd->add_option("--placement", d.placement,
                                       "auto (the planner's cost model) | device (as many as "
                                       "fit, hottest first) | host (none)")
                           ->capture_default_str());
  tier_flags.push_back(
      cmd->add_option("--device-threads", d.device_threads,
                      "CPU device: its kernel threads (default: half the cores; the host keeps "
                      "the rest while it runs)")
          ->check(count_in(1, max_threads(), "4 x the cores: more only oversubscribe them")));
  tier_flags.push_back(cmd->add_option("--profile-in", d.profile_in,
                                       "Routing profile (JSON) to place experts from at once"));
  tier_flags.push_back(cmd->add_option("--profile-out", d.profile_out,
                                       "Write the routing profile (JSON) at the end"));
  tier_flags.push_back(
      cmd->add_option("--profile-decay", d.profile_decay, "Routing profile EMA decay per step")
          ->capture_default_str());
  tier_flags.push_back(
      cmd->add_option("--replan-horizon", d.horizon_steps,
                      "Steps a re-placement must pay for itself in (weights moved vs time gained)")
          ->capture_default_str()
          ->check(count_in(1, kMaxCount)));
  tier_flags.push_back(
      cmd->add_option("--replan-min-gain", d.min_gain,
                      "Hysteresis: a re-placement must gain this fraction of the predicted step")
          ->capture_default_str());
  tier_flags.push_back(
      cmd->add_flag("--no-replan", f->no_replan, "Keep the first placement for the whole run"));
  for (CLI::Option* o : tier_flags) o->needs(device);
  cmd->add_option("--max-memory", f->max_memory,
                  "Refuse a run whose memory plan (logged before loading) exceeds this many "
                  "bytes, e.g. 20GiB (default: the host's MemAvailable)");

  cmd->add_option("--out", f->control.out_dir,
                  "Directory for checkpoint-<step>/ and the final export (final/ or adapter/)");
  cmd->add_option("--save-every", f->control.save_every, "Checkpoint every N steps (0: at the end)")
      ->capture_default_str()
      ->check(count_in(0, kMaxCount));
  cmd->add_option("--keep-last", f->control.keep_last,
                  "Keep only the N newest checkpoints in --out (0: every one)")
      ->capture_default_str()
      ->check(count_in(0, kMaxCount));
  cmd->add_option(
         "--stop-after", f->control.stop_after,
         "Stop (with a checkpoint) once N steps are done; the schedule still spans --steps")
      ->check(count_in(1, kMaxCount, "leave it out to run every step"));
  cmd->add_option("--resume", f->resume,
                  "Continue bitwise from a checkpoint dir, or the latest one under an --out dir");
  cmd->add_option("--metrics", f->control.metrics_file, "JSONL file: one line of metrics per step");
  cmd->add_option("--report", f->report,
                  "HTML run report (tiermoe report's page), refreshed at each checkpoint and "
                  "written at the end; the metrics go to OUT/metrics.jsonl unless --metrics");
  cmd->add_option("--progress-every", f->control.progress_every,
                  "Without a terminal: a progress line every N steps (default: about 25 a run)")
      ->check(count_in(1, kMaxCount));
  cmd->add_option("--divergence-patience", f->control.divergence.patience,
                  "Stop when the loss stays above --divergence-factor x its running mean, or at "
                  "chance with a vanished gradient, for N steps in a row (0: never)")
      ->capture_default_str()
      ->check(count_in(0, kMaxCount));
  cmd->add_option("--divergence-factor", f->control.divergence.factor,
                  "How many times its running mean a loss must reach to count as blown up")
      ->capture_default_str();
  cmd->add_flag("--json", f->json, "Print a JSON summary as the last stdout line");
  cmd->add_option("--ep", f->ep,
                  "Expert and data parallelism over N ranks (start with mpirun -np N; N must "
                  "divide the expert count and --grad-accum)")
      ->check(count_in(1, int64_t(1) << 16));
  cmd->add_option("--comm-timeout", f->comm_timeout,
                  "Seconds a collective may wait for the other ranks before the run stops")
      ->capture_default_str()
      ->check(number_in(0.001, 1e7, "seconds"));
  cmd->add_option(
         "--inject-fault", f->inject_fault,
         "Tests: KIND:RANK:STEP, KIND kill|hang|error|sigint, on that rank before that step")
      ->group("");
  cmd->callback([f, cmd] { run_train(*f, *cmd); });
}

}  // namespace tiermoe::cli
