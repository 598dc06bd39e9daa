#include "tiermoe/train/trainer_session.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "tiermoe/core/bounds.h"
#include "tiermoe/core/allocator.h"
#include "tiermoe/core/error.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/stored_quant.h"
#include "tiermoe/model/checkpoint.h"
#include "tiermoe/train/checkpoint.h"
#include "tiermoe/train/memory_plan.h"
#include "tiermoe/train/metrics.h"
#include "tiermoe/train/out_dir.h"
#include "tiermoe/train/progress.h"

namespace tiermoe {

namespace fs = std::filesystem;
using detail::str_of;
using nlohmann::json;

namespace {

// The stop a rank asked for, the same on every rank (the largest signal
// number asked for; 0 when none did). Every rank's control has a
// stop_requested or none has, so all or none take part in the allgather.
int agreed_stop(const std::function<int()>& stop_requested, Comm* comm) {
  if (!stop_requested) return 0;
  const int mine = stop_requested();
  if (!comm) return mine;
  int64_t stop = 0;
  for (int64_t s : comm->allgather_value(int64_t(mine), "stop request")) stop = std::max(stop, s);
  return int(stop);
}

}  // namespace

json TrainSummary::to_json() const {
  json j = {{"steps", steps},
            {"losses", losses},
            {"final_loss", final_loss},
            {"tokens_per_s", tokens_per_s},
            {"step_time_s", step_time_s},
            {"seconds", seconds},
            {"memory_peak_bytes", bytes_by_tag(memory_peak)}};
  if (loss_floor) j["loss_floor"] = *loss_floor;
  if (unigram_entropy) j["unigram_entropy"] = *unigram_entropy;
  if (!last_checkpoint.empty()) j["checkpoint"] = last_checkpoint;
  if (!final_export.empty()) j["export"] = final_export;
  if (!memory_plan.is_null()) j["memory_plan"] = memory_plan;
  if (!time_split.is_null()) j["time_split_s"] = time_split;
  j["skipped_batches"] = skipped_batches;
  if (stopped_by != 0) j["stopped_by_signal"] = stopped_by;
  if (!comm.is_null()) {
    for (const char* k : {"ranks", "alltoall_bytes", "alltoall_s"}) j[k] = comm.at(k);
    j["comm"] = comm;
  }
  if (!tier.is_null()) {
    // The contract's keys at the top level, the whole breakdown under "tier".
    for (const char* k : {"hot_fraction", "device_calls", "bytes_up", "bytes_down", "replacements"})
      j[k] = tier.at(k);
    j["tier"] = tier;
  }
  return j;
}

namespace {

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g s", s);
  return buf;
}

// "step time split (mean step 12.3 s): attention 4.1 s (31%), experts 3.9 s (29%), ..."
// largest first, parts under 1% left out.
std::string time_split_line(const json& split) {
  const double step = split.at("step_s").get<double>();
  std::vector<std::pair<double, std::string>> parts;
  for (const auto& [name, value] : split.items()) {
    if (name != "step_s") parts.push_back({value.get<double>(), name});
  }
  std::sort(parts.rbegin(), parts.rend());
  std::string line = str_of("step time split (mean step ", seconds_text(step), "):");
  bool first = true;
  for (const auto& [s, name] : parts) {
    if (step <= 0 || s < 0.01 * step) continue;
    line += str_of(first ? " " : ", ", name, " ", seconds_text(s), " (",
                   int64_t(100 * s / step + 0.5), "%)");
    first = false;
  }
  return line;
}

// The flags whose recorded values differ, for a resume that changed them.
std::string config_differences(const TrainConfig& given, const TrainConfig& saved) {
  const json a = given.to_json(), b = saved.to_json();
  std::string diff;
  for (const auto& [key, value] : b.items()) {
    if (a.value(key, json()) != value) {
      diff += str_of(diff.empty() ? "" : "; ", key, " ", a.value(key, json()).dump(),
                     " (the checkpoint's: ", value.dump(), ")");
    }
  }
  return diff;
}

// What the plan needs of the checkpoint, from the shard headers only: the
// dtype its matrices are stored in (its embedding's) and, for a LoRA run,
// the W13 parts a mapped bind of rank 0's experts copies. nullopt for a
// preset at random init.
std::optional<StoredMatrices> stored_matrices(const TrainConfig& c, const ModelConfig& model,
                                              int ranks) {
  if (c.model_dir.empty()) return std::nullopt;
  const CheckpointTensors ck = CheckpointTensors::open(c.model_dir);
  const std::string d = ck.entry("model.embed_tokens.weight").dtype;
  DType dt;
  if (d == "BF16")
    dt = DType::bf16;
  else if (d == "F32")
    dt = DType::f32;
  else if (d == "F64")
    dt = DType::f64;
  else
    return std::nullopt;  // the loader names the unsupported dtype
  if (!c.lora) return StoredMatrices(dt);
  const int64_t experts = model.num_experts / std::max(ranks, 1);
  StoredMatrices s(dt, copied_w13_elements(ck, model, c.dtype, 0, experts),
                   stores_fused_experts(ck, model));
  // What it ships at low width, read off the first matrix of each role.
  std::set<HfRole> probed;
  for (const HfTensor& t : hf_tensors(model)) {
    const bool matrix =
        t.role == HfRole::expert || t.role == HfRole::attention || t.role == HfRole::dense_mlp;
    if (!matrix || t.shape.size() != 2 || !probed.insert(t.role).second) continue;
    const std::optional<StoredQuant> q = find_stored_quant(ck, model, t.name);
    if (!q) continue;
    if (t.role == HfRole::expert) {
      s.experts_format = q->format;
      s.experts_group = q->group;
    }
    (t.role == HfRole::attention ? s.attention_quantized : s.dense_quantized) |=
        t.role != HfRole::expert;
  }
  return s;
}

// Freed blocks the allocator keeps for reuse (core/allocator.h) are in no
// plan: keeps them within `left`, the bytes the plan and the data leave
// under the limit, less room for what no tag counts (the binary, stacks,
// the libraries' buffers).
void cap_reused_blocks(uint64_t left, std::ostream* log) {
  constexpr uint64_t kUntracked = uint64_t(1) << 30;
  const uint64_t cap = left - std::min(left, kUntracked);
  HostAllocator& host = HostAllocator::process();
  if (cap >= host.cache_limit()) return;
  host.set_cache_limit(size_t(cap));
  if (log) {
    *log << str_of("memory: freed blocks kept for reuse capped at ", double(cap) / (1 << 20),
                   " MiB (what the plan leaves)\n");
  }
}

// Logs the plan and refuses a run it says cannot fit, before anything is
// loaded; a run that fits gets the allocator's reuse capped to its room.
MemoryPlan check_memory_plan(const TrainConfig& config, int ranks, const RunControl& control) {
  // What no plan could fit is refused first, naming the model and the flags.
  check_fits_host(config, ranks);
  const ModelConfig model = config.model_dir.empty() ? preset(config.preset, config.layers)
                                                     : load_model_config(config.model_dir);
  const std::optional<StoredMatrices> stored = stored_matrices(config, model, ranks);
  const MemoryPlan plan = plan_memory(config, model, stored, ranks);
  if (control.log) {
    *control.log << "memory plan (predicted peak per tag" << (ranks > 1 ? ", each rank" : "")
                 << "):\n"
                 << plan.table();
  }
  // The data is held whole beside what the plan's tags count.
  const uint64_t data = data_bytes(config);
  const std::string data_what =
      config.data_file.empty() ? str_of("the built-in corpus (", config.corpus_tokens, " tokens)")
                               : str_of("the tokens of ", config.data_file);
  if (control.log && data > 0) {
    *control.log << str_of("  + ", data_what, ": ", str_of(double(data) / (1 << 20)), " MiB\n");
  }
  // Unknown available memory (no /proc/meminfo, no sysconf) refuses nothing.
  const uint64_t limit = control.max_memory ? control.max_memory : host_memory_available();
  TIERMOE_CHECK(
      plan.total() + data <= limit || plan.total() > limit,
      str_of(data_what, " (", data, " bytes) and the memory plan (", plan.total(),
             " bytes) need more than ",
             control.max_memory ? "--max-memory " : "the available memory ", limit, " bytes"),
      control.max_memory ? "--max-memory" : "MemAvailable (/proc/meminfo)",
      config.data_file.empty()
          ? str_of("a smaller --corpus-tokens: ", (limit - plan.total()) / sizeof(int32_t),
                   " tokens fit")
          : std::string("a shorter token file, or a host with more memory"));
  if (plan.total() <= limit) {
    cap_reused_blocks(limit - std::min(limit, plan.total() + data), control.log);
    return plan;
  }
  std::string hint;
  for (const std::string& way : ways_to_fit(config, model, stored, ranks, limit)) {
    hint += (hint.empty() ? "it would fit with " : "; or ") + way;
  }
  if (hint.empty()) {
    hint = "no single change of remat, batch, LoRA or dtype fits: use a host with more memory, "
           "or more ranks (--ep)";
  }
  throw Error(str_of("the memory plan needs ", plan.total(), " bytes (the table above), more than ",
                     control.max_memory ? "--max-memory " : "the available memory ", limit,
                     " bytes"),
              control.max_memory ? "--max-memory" : "MemAvailable (/proc/meminfo)", hint);
}

int64_t count_trainable(const std::vector<Parameter>& params) {
  int64_t n = 0;
  for (const Parameter& p : params) n += p.numel();
  return n;
}

}  // namespace

TrainSummary run_training(const TrainConfig& given, const RunControl& control) {
  TrainConfig config = given;
  config.trainer.data_seed = config.seed;
  config.validate();
  std::ostream* log = control.log;

  // Everything that can be wrong is checked here, before the first step.
  TIERMOE_CHECK(control.keep_last >= 0, str_of("--keep-last ", control.keep_last, " must be >= 0"),
                "--keep-last", "0 keeps every checkpoint");
  control.divergence.validate();
  // One run at a time on out_dir; rank 0 speaks for the job (out_dir.h).
  const bool rank0 = !control.comm || control.comm->rank() == 0;
  std::optional<OutDirLock> lock;
  // And one run at a time on --metrics, wherever it lies.
  std::optional<OutputFileLock> metrics_lock;
  if (!control.metrics_file.empty() && rank0)
    metrics_lock.emplace(control.metrics_file, "--metrics");
  if (!control.out_dir.empty() && rank0) {
    lock.emplace(control.out_dir);
    const OutDirCleanup cleaned = clean_out_dir(control.out_dir);
    if (log && !cleaned.removed.empty()) {
      *log << str_of("train: removed ", cleaned.removed.size(), " temporary director",
                     cleaned.removed.size() == 1 ? "y" : "ies", " (", cleaned.removed_bytes,
                     " bytes) left in ", control.out_dir, " by killed runs\n");
    }
    for (const std::string& dir : cleaned.restored) {
      if (log) *log << "train: restored " << dir << " (a run was killed while replacing it)\n";
    }
  }
  std::optional<TrainCheckpoint> ck;
  if (!control.resume.empty()) {
    ck = read_train_checkpoint(control.resume);
    const std::string diff = config_differences(config, ck->config);
    TIERMOE_CHECK(diff.empty(), "the run's flags differ from the checkpoint's: " + diff,
                  control.resume, "resume with the flags the run started with (or drop them)");
  } else if (!control.out_dir.empty()) {
    TIERMOE_CHECK(
        !has_checkpoints(control.out_dir), "--out already holds checkpoints", control.out_dir,
        "pass --resume " + control.out_dir + " to continue that run, or choose another --out");
  }
  TIERMOE_CHECK(control.save_every >= 0, "--save-every must be >= 0", "--save-every",
                "0 saves only at the end");
  TIERMOE_CHECK(control.stop_after >= 0, "--stop-after must be >= 0", "--stop-after",
                "0 runs every step");

  Comm* comm = control.comm && control.comm->size() > 1 ? control.comm : nullptr;
  const MemoryPlan plan = check_memory_plan(ck ? ck->config : config, comm ? comm->size() : 1,
                                            control);
  const ProgressSink loading{log, control.progress_tty};
  CausalLM model = ck ? resume_model(*ck, comm, loading) : build_model(config, comm, loading);
  if (log && config.trainer.seq_len > model.config().max_position_embeddings) {
    *log << "warning: --seq-len " << config.trainer.seq_len
         << " exceeds the model's max_position_embeddings ("
         << model.config().max_position_embeddings
         << "): RoPE runs on, but the model never saw positions that far\n";
  }
  std::unique_ptr<MarkovCorpus> corpus;
  const std::unique_ptr<RowSource> rows = build_data(config, model.config(), &corpus, loading);
  const RowSource& data = *rows;
  std::unique_ptr<TierSession> tier;
  if (config.tier.enabled()) {
    // Profiles on disk cover every expert; this rank's tier takes its own.
    std::optional<RoutingProfile> profile;
    if (ck && ck->profile) {
      profile =
          profile_for(*ck->profile, model, (fs::path(ck->dir) / kRoutingProfileFile).string());
    } else if (!config.tier.profile_in.empty()) {
      profile =
          profile_for(RoutingProfile::load(config.tier.profile_in), model, config.tier.profile_in);
    }
    tier = std::make_unique<TierSession>(config.tier, model, !config.lora, log, profile,
                                         control.progress_tty);
  }
  Trainer trainer(model, data, config.trainer);
  if (control.stop_requested && !comm) {
    trainer.set_stop_poll([&] { return control.stop_requested() != 0; });
  }
  if (ck) trainer.restore(ck->state, optimizer_state_for(ck->optimizer, model));

  TrainSummary out;
  DivergenceGuard divergence(control.divergence, model.config().vocab_size);
  if (ck) divergence.replay(ck->state.losses);
  auto save_checkpoint = [&] {
    const fs::path next = fs::path(control.out_dir) / checkpoint_dir_name(trainer.steps_done());
    if (log && fs::exists(next)) {
      *log << "train: replacing " << next.string()
           << " (an earlier run's, past the step this run resumed from)\n";
    }
    out.last_checkpoint = save_train_checkpoint(control.out_dir, model, trainer, config);
    if (rank0) {
      for (const std::string& gone :
           prune_checkpoints(control.out_dir, control.keep_last, out.last_checkpoint)) {
        if (log)
          *log << "train: removed " << gone << " (--keep-last " << control.keep_last << ")\n";
      }
    }
    if (control.after_checkpoint && rank0) control.after_checkpoint(out.last_checkpoint);
  };
  if (corpus) {
    out.loss_floor = corpus->loss_floor();
    out.unigram_entropy = corpus->unigram_entropy();
  }
  if (log) {
    const TrainerOptions& t = config.trainer;
    *log << "train: "
         << (config.model_dir.empty() ? "preset " + config.preset + " (random init, seed " +
                                            std::to_string(config.seed) + ")"
                                      : config.model_dir)
         << ", " << dtype_name(config.dtype) << ", " << (config.lora ? "LoRA" : "full fine-tuning")
         << ", " << count_trainable(trainer.parameters()) << " trainable parameters\n";
    const ModelConfig& m = model.config();
    const CausalLM::StoredQuantCounts q = model.stored_quant_counts();
    if (m.quant_method == "mxfp4") {
      *log << (config.lora && config.dtype != DType::f64
                   ? std::string("train: the MXFP4 experts stay at 4 bits, read in place\n")
                   : str_of("train: the MXFP4 experts are decoded at load, to ",
                            dtype_name(config.dtype),
                            config.lora ? " (f64 runs)\n" : " (full fine-tuning trains them)\n"));
    } else if (!m.quant_method.empty()) {
      const std::string stored =
          m.quant_method == "compressed-tensors" ? str_of("int", m.quant_bits) : m.quant_method;
      *log << (q.kept + q.widened > 0
                   ? str_of("train: the checkpoint's ", stored, " matrices: ", q.kept,
                            " (the routed experts') kept at that width, ", q.widened,
                            " others (attention, dense MLPs, shared experts) dequantized to ",
                            dtype_name(config.dtype), "\n")
                   : str_of("train: the checkpoint's ", stored,
                            " matrices are dequantized at load, to ", dtype_name(config.dtype),
                            config.lora ? " (f64 runs)\n" : " (full fine-tuning trains them)\n"));
    }
    *log << "train: data " << data.source() << " ("
         << (data.summary().empty() ? str_of(data.size(), " tokens") : data.summary()) << ")";
    if (corpus) {
      *log << str_of(", loss floor ", corpus->loss_floor(), " nats (entropy rate), unigram ",
                     corpus->unigram_entropy());
    }
    *log << "\ntrain: " << t.steps << " steps of " << t.batch << " x " << t.seq_len << " tokens"
         << (t.grad_accum > 1 ? str_of(" x ", t.grad_accum, " micro-batches") : std::string())
         << ", " << optimizer_kind_name(t.optimizer) << " lr " << t.schedule.base_lr
         << (ck ? str_of(", resumed at step ", trainer.steps_done(), " from ", ck->dir)
                : std::string())
         << "\n";
    if (comm) {
      *log << str_of("train: ", comm->size(), " ranks over ", comm->name(), ": expert parallel (",
                     model.local_experts(), " of ", model.config().num_experts,
                     " experts per MoE layer on each), data parallel ", "(",
                     t.grad_accum / comm->size(), " micro-batch(es) per rank per step)\n");
    }
  }

  std::optional<MetricsWriter> metrics;
  if (!control.metrics_file.empty())
    metrics.emplace(control.metrics_file, /*append=*/ck.has_value(),
                    MetricsRunInfo{config.trainer.steps, out.loss_floor});
  std::optional<ProgressPrinter> progress;
  if (log) {
    progress.emplace(*log, ProgressOptions{.total_steps = config.trainer.steps,
                                           .tty = control.progress_tty,
                                           .every = control.progress_every,
                                           .loss_floor = out.loss_floor});
  }

  const int64_t last_step = control.stop_after > 0
                                ? std::min(control.stop_after, config.trainer.steps)
                                : config.trainer.steps;
  // The measured peaks are the steps' (loading's transients are not planned).
  MemoryTracker::process().reset_peaks();
  std::vector<double> step_times;
  StepTimes parts_run;
  int64_t tokens_run = 0;
  CommStats comm_run;
  const auto start = std::chrono::steady_clock::now();
  int64_t saved_step = trainer.steps_done();
  try {
    while (trainer.steps_done() < last_step) {
      // Polled before each step: a stop asked for while loading or during
      // step k ends the run before step k + 1 (after k's checkpoint, if due).
      if (const int stop = agreed_stop(control.stop_requested, comm)) {
        out.stopped_by = stop;
        break;
      }
      if (control.before_step) control.before_step(trainer.steps_done() + 1);
      StepStats s;
      try {
        s = trainer.step();
      } catch (const StepAbandoned&) {
        out.stopped_by = control.stop_requested();  // the state is the last whole step's
        break;
      }
      if (s.skipped_batches > 0 && out.skipped_batches == 0 && log) {
        *log << "train: warning: step " << s.step << " skipped a batch whose rows hold no counted "
             << "target (every label -100); such batches are skipped and counted in the summary\n";
      }
      out.skipped_batches += s.skipped_batches;
      step_times.push_back(s.seconds);
      for (size_t i = 0; i < kNumStepParts; ++i) parts_run.s[i] += s.times.s[i];
      tokens_run += s.tokens;
      if (tier && s.tier) tier->record(*s.tier);
      if (s.comm) comm_run.add(*s.comm);
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (metrics) metrics->write(s, memory_snapshot());
      if (progress) progress->update(s, elapsed, int64_t(step_times.size()), tokens_run);
      // Before the step's checkpoint: a diverged step's state is not saved.
      divergence.observe(s.step, s.loss, s.grad_norm);
      if (!control.out_dir.empty() && control.save_every > 0 && s.step % control.save_every == 0) {
        save_checkpoint();
        saved_step = s.step;
      }
    }
  } catch (...) {
    if (progress) progress->finish();
    throw;
  }
  if (progress) progress->finish();
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (!control.out_dir.empty()) {
    if (saved_step != trainer.steps_done()) save_checkpoint();
    if (trainer.finished()) {
      out.final_export = (fs::path(control.out_dir) / (config.lora ? "adapter" : "final")).string();
      export_final(out.final_export, model, config);
    }
  }

  out.steps = trainer.steps_done();
  out.losses = trainer.losses();
  out.final_loss = out.losses.empty() ? 0.0 : out.losses.back();
  out.tokens_per_s = out.seconds > 0 ? double(tokens_run) / out.seconds : 0.0;
  out.step_time_s = median(step_times);
  if (!step_times.empty()) {
    const double n = double(step_times.size());
    double total = 0;
    for (double t : step_times) total += t;
    for (double& v : parts_run.s) v /= n;
    out.time_split = time_split_json(parts_run, total / n);
    out.time_split["step_s"] = total / n;
  }
  out.memory_peak = memory_snapshot().peak;
  out.memory_plan = plan.to_json(&out.memory_peak);
  if (tier) {
    out.tier = tier->summary_json();
    if (!comm) {
      tier->finish(log);
    } else if (!config.tier.profile_out.empty()) {
      // Every rank's experts' profile, side by side, written once.
      std::vector<RoutingProfile> parts;
      for (const std::string& t :
           comm->allgather_text(tier->tier().profile().to_json(), "routing profiles")) {
        parts.push_back(RoutingProfile::from_json(t, "rank"));
      }
      if (comm->rank() == 0) RoutingProfile::join(parts).save(config.tier.profile_out);
      if (log) *log << "tier: routing profile written to " << config.tier.profile_out << "\n";
    }
  }
  if (comm) out.comm = comm_run_json(comm_run, *comm, int64_t(step_times.size()));
  if (log) {
    *log << "train: " << step_times.size() << " steps in " << format_duration(out.seconds) << " ("
         << str_of(out.seconds) << " s), loss " << format_loss(out.final_loss, out.loss_floor)
         << ", " << int64_t(out.tokens_per_s) << " tokens/s";
    if (out.skipped_batches > 0) {
      *log << ", " << out.skipped_batches << " batch(es) without a counted target skipped";
    }
    if (!out.last_checkpoint.empty()) *log << ", checkpoint " << out.last_checkpoint;
    if (!out.final_export.empty()) *log << ", exported " << out.final_export;
    if (!out.time_split.is_null()) *log << "\n" << time_split_line(out.time_split);
    *log << "\nmemory: planned vs measured peak per tag:\n" << plan.table(&out.memory_peak);
    if (comm) {
      *log << str_of("comm: ", out.comm.at("alltoall_bytes").get<uint64_t>(),
                     " all-to-all bytes sent and received by rank 0 (",
                     out.comm.at("alltoall_bytes_all_ranks").get<uint64_t>(), " by all ranks), ",
                     out.comm.at("alltoall_s").get<double>(), " s in all-to-alls, ",
                     out.comm.at("fold_s").get<double>(), " s summing gradients\n");
    }
    if (tier) {
      *log << str_of("tier: hot fraction ", out.tier.at("hot_fraction").get<double>(), ", ",
                     out.tier.at("device_calls").get<int64_t>(), " device calls, ",
                     out.tier.at("bytes_up").get<size_t>(), " bytes up, ",
                     out.tier.at("bytes_down").get<size_t>(), " down, ",
                     out.tier.at("replacements").get<int64_t>(), " re-placements, ",
                     out.tier.at("resident").get<int64_t>(), " experts resident\n");
    }
  }
  return out;
}

}  // namespace tiermoe
