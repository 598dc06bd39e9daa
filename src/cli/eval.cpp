// tiermoe eval: the loss of a checkpoint on the first B rows of the data
// `train` takes, and optionally d(loss)/d(every parameter), as the
// command-line contract (docs/architecture.md) defines them. Outside tools compare TierMoE with other
// implementations through this command, so its semantics are the contract's
// and nothing more:
//
//   a token file: window i takes inputs [i*L, i*L+L), targets [i*L+1, i*L+L+1), i < B
//   SFT JSON Lines: row i of the packed (or, with --no-packing, padded)
//     examples (train/sft_data.h): labels of -100 carry no loss, positions
//     restart and attention stops at each example
//   loss = mean cross-entropy over the counted targets
//        + router_aux_loss_coef * aux   iff config.json's output_router_logits
//
// Every check that can fail (paths, data length, token ids, the checkpoint)
// runs before the gradients are written, and the gradient file is written
// atomically, so a failed eval leaves nothing behind.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "flag_bounds.h"
#include "run_paths.h"
#include "tiermoe/core/bounds.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/io/safetensors.h"
#include "tiermoe/io/tokens.h"
#include "tiermoe/model/causal_lm.h"
#include "tiermoe/model/checkpoint.h"
#include "tiermoe/model/memory_estimate.h"
#include "tiermoe/train/data.h"
#include "tiermoe/train/trainer_config.h"

namespace tiermoe::cli {

namespace {

namespace fs = std::filesystem;
using detail::str_of;

struct EvalOptions {
  std::string model;
  std::string data;
  int64_t seq_len = 0;
  int64_t batch = 0;
  std::string dtype = "f64";
  std::string save_grads;  // empty: no backward
  bool no_packing = false;
  int64_t lm_head_chunk = kDefaultLmHeadChunk;
  std::string experts;  // int4 | int8: the routed experts quantized at load
  int64_t experts_group = 128;
  bool json = false;
};

std::string format_double(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The gradients of the trainable parameters under their HF names and in
// their checkpoint shapes (gpt-oss's x-major experts transposed back), each
// rounded once from the f32/f64 accumulators to `dtype`. A selection-only
// buffer (DeepSeek-V3's and GLM-4.5's e_score_correction_bias) has none, as
// in transformers.
NamedTensors gradients(CausalLM& model, DType dtype) {
  NamedTensors out;
  for (ModelParam& p : model.params()) {
    if (!p.requires_grad) continue;
    TIERMOE_ASSERT(p.grad.defined());
    const Tensor g = p.grad.to(dtype, MemTag::grads);
    out.emplace_back(p.name, p.hf_transposed ? swap_last_two_dims(g, MemTag::grads) : g);
  }
  return out;
}

void run_eval(const EvalOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  const DType dtype = parse_dtype(o.dtype, "--dtype");
  TIERMOE_CHECK(o.batch >= 1 && o.seq_len >= 1,
                str_of("--batch ", o.batch, " and --seq-len ", o.seq_len, " must both be >= 1"),
                "tiermoe eval", "pass positive --batch and --seq-len");
  TIERMOE_CHECK(fs::is_directory(o.model),
                fs::exists(o.model) ? "--model is not a directory" : "--model does not exist",
                o.model, "pass a checkpoint directory (config.json + model.safetensors or shards)");
  // Fails before any work when the gradient file could not be written at the end.
  RunPaths paths;
  paths.input_dir(o.model, "--model");
  paths.input_file(o.data, "--data");
  paths.output(o.save_grads, "--save-grads");
  paths.check();

  // Data problems are cheaper to find than checkpoint ones: config first, then
  // tokens, then the weights.
  const ModelConfig config = load_model_config(o.model);
  RunMemoryShape run;
  run.dtype = dtype;
  run.backward = !o.save_grads.empty();
  run.full_ft = run.backward;  // --save-grads writes every parameter's gradient
  run.tokens = checked_mul(o.batch, o.seq_len, "--batch x --seq-len", "--batch");
  run.lm_head_chunk = o.lm_head_chunk;
  check_host_memory_for(config, run, o.model, "--batch x --seq-len",
                        "use a smaller --batch or --seq-len, or a machine with more memory");
  if (o.seq_len > config.max_position_embeddings) {
    std::cerr << "warning: --seq-len " << o.seq_len << " exceeds the model's "
              << "max_position_embeddings (" << config.max_position_embeddings
              << "): RoPE runs on, but the model never saw positions that far\n";
  }
  const std::unique_ptr<RowSource> rows =
      open_data_file(o.data, config, o.seq_len, /*pack=*/!o.no_packing);
  const TokenBatch batch = without_padded_tail(rows->eval_batch(o.batch, o.seq_len));

  // A loss alone reads the frozen matrices mapped at their stored width, as
  // a LoRA run does (an f32 eval of a bf16 checkpoint held every matrix
  // widened: 912 MB more at vocab 151,936); --save-grads needs them as
  // parameters of --dtype.
  const bool grad_run = !o.save_grads.empty();
  const WeightBinding binding = grad_run ? WeightBinding::copy : WeightBinding::mapped;
  CausalLM model = CausalLM::from_checkpoint(o.model, dtype, nullptr, binding, stderr_progress());
  model.set_lm_head_chunk(o.lm_head_chunk);
  if (!o.experts.empty()) {
    // The routed experts as a LoRA run over them holds them (train --experts).
    const QuantFormat f = parse_quant_format(o.experts, "--experts");
    TIERMOE_CHECK(f == QuantFormat::int4 || f == QuantFormat::int8,
                  str_of("--experts ", o.experts, " is read from checkpoints, not made at load"),
                  "--experts", "quantize at load to int4 or int8");
    TIERMOE_CHECK(config.quant_method.empty(),
                  str_of("--experts ", o.experts,
                         " would quantize experts the checkpoint already "
                         "ships at low width (",
                         config.quant_method, ")"),
                  "--experts", "drop --experts: the stored experts are read at their width");
    TIERMOE_CHECK(!grad_run && dtype != DType::f64,
                  "--experts evaluates the f32 and bf16 kernels over frozen quantized experts",
                  "--experts", "drop --save-grads and use --dtype bf16 or f32");
    model.set_requires_grad_all(false);
    const auto [before, after] = model.quantize_experts(f, o.experts_group);
    std::cerr << "eval: experts " << o.experts << " g" << o.experts_group << ", "
              << format_size(uint64_t(before)) << " -> " << format_size(uint64_t(after)) << "\n";
  }
  std::cerr << "eval: " << o.model << " (" << config.model_type << ", " << config.num_hidden_layers
            << " layers) in " << dtype_name(dtype) << " on " << o.batch << " x " << o.seq_len
            << " tokens of " << o.data
            << (rows->summary().empty() ? "" : " (" + rows->summary() + ")") << "\n";

  const bool grad = grad_run;
  if (batch.seq_len < o.seq_len) {
    std::cerr << "eval: the rows' padding past token " << batch.seq_len << " is skipped\n";
  }
  model.forward(batch.inputs_BL, batch.targets_BL, o.batch, batch.seq_len, grad, batch.layout);
  if (grad) {
    model.backward();
    NamedTensors grads = gradients(model, dtype);
    save_safetensors(o.save_grads, grads);
    std::cerr << "eval: wrote " << grads.size() << " gradients (" << safetensors_dtype_name(dtype)
              << ") to " << o.save_grads << "\n";
  }
  const LossParts& loss = model.last_loss();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  if (o.json) {
    nlohmann::json j = {{"loss", loss.total},     {"ce", loss.ce},
                        {"aux", loss.aux},        {"aux_in_loss", loss.aux_in_total},
                        {"tokens", loss.targets}, {"batch", o.batch},
                        {"seq_len", o.seq_len},   {"dtype", std::string(dtype_name(dtype))},
                        {"model", o.model},       {"data", o.data},
                        {"seconds", seconds}};
    if (grad) j["grads"] = o.save_grads;
    std::cout << j.dump() << "\n";
    return;
  }
  std::cout << "loss " << format_double(loss.total) << " (cross-entropy " << format_double(loss.ce)
            << " over " << loss.targets << " targets";
  if (loss.aux_in_total) {
    std::cout << " + " << config.router_aux_loss_coef << " * aux " << format_double(loss.aux);
  }
  std::cout << ")\n";
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand(
      "eval",
      "Loss (and optionally every gradient) of a checkpoint on the first B windows of a token "
      "file or rows of SFT data");
  cmd->add_option("--model", o->model, "Checkpoint directory (Hugging Face layout)")->required();
  cmd->add_option("--data", o->data,
                  "Token file (.npy or llm.c .bin), or SFT JSON Lines (input_ids + labels)")
      ->required();
  cmd->add_option("--seq-len", o->seq_len, "Window / row length L")
      ->required()
      ->check(count_in(1, kMaxCount));
  cmd->add_option("--batch", o->batch, "Number of windows or rows B (the first B)")
      ->required()
      ->check(count_in(1, kMaxCount));
  cmd->add_flag("--no-packing", o->no_packing, "SFT data: one example per row, padded");
  cmd->add_option("--lm-head-chunk", o->lm_head_chunk,
                  "Token rows per LM head chunk (0: all at once)")
      ->capture_default_str()
      ->check(count_in(0, kMaxCount));
  cmd->add_option("--dtype", o->dtype, "Compute dtype, and the gradient file's: f64|f32|bf16")
      ->capture_default_str();
  cmd->add_option("--experts", o->experts,
                  "Evaluate with the routed experts quantized at load to int4|int8 (as train "
                  "--experts holds them)");
  cmd->add_option("--experts-group", o->experts_group, "Columns per scale of --experts")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  cmd->add_option("--save-grads", o->save_grads,
                  "Write d(loss)/d(parameter) under Hugging Face names to this .safetensors file");
  cmd->add_flag("--json", o->json, "Print one JSON object on stdout");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace tiermoe::cli
