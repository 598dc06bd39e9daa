// tiermoe plan: which experts a device of --device-memory bytes would hold
// for a routing profile, and the predicted expert time per training step
// against running every expert on the host (tier/planner.h for the model).
//
// The profile is a routing_profile.json (a training run's, or any file in
// that format) or, with --synthetic-zipf S --tokens T, a Zipf-skewed one:
// T tokens times top-k rows per MoE layer, the expert of rank r getting a
// share proportional to (r+1)^-S, experts ranked in a random order per layer
// (--seed). --save-profile writes the profile used.
//
// The prediction covers the experts only (attention, router and optimizer
// are the same on either placement). Rates: measured at start-up on this
// machine (the host experts on the threads a CPU device leaves, and again on
// every core for the all-host baseline; a CpuDevice on half the cores),
// unless given: --host-tflops, --device-tflops, --link-gbps and --launch-us each
// replace one measured value; with all three device flags no device is
// measured (e.g. an H100-class device: --device-tflops 400 --link-gbps 25
// --launch-us 10).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "commands.h"
#include "flag_bounds.h"
#include "tiermoe/core/bounds.h"
#include "tiermoe/core/error.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/tier/cost_model.h"
#include "tiermoe/tier/cpu_device.h"
#include "tiermoe/tier/planner.h"

namespace tiermoe::cli {

namespace {

using detail::str_of;
using Json = nlohmann::json;

struct PlanOptions {
  std::string profile, save_profile;
  double zipf = 0;
  int64_t tokens = 0;
  uint64_t seed = 0;
  std::string device_memory;
  std::string preset = "qwen3-30b-a3b", model;
  int64_t layers = 0;
  std::string mode = "lora", dtype = "bf16", placement = "auto";
  int64_t micro_batches = 1;
  double host_tflops = 0, device_tflops = 0, link_gbps = 0, launch_us = 0;
  bool json = false;
  // Which of the optional flags were given (set by the callback).
  bool synthetic = false, has_host = false, has_device = false, has_link = false,
       has_launch = false, has_layers = false, has_model = false;
};

struct Rates {
  CostModel cost;
  // The all-host baseline runs on every core; with a CPU device measured,
  // cost.host_flops_per_s is the rate on the cores the device leaves.
  double all_host_flops_per_s = 0;
  bool host_measured = false, device_measured = false, link_measured = false,
       launch_measured = false;
  int host_threads = 0, device_threads = 0;
};

ModelConfig model_config(const PlanOptions& o) {
  ModelConfig c = o.has_model ? load_model_config(o.model)
                              : preset(o.preset, o.has_layers ? std::optional<int64_t>(o.layers)
                                                              : std::nullopt);
  const std::string where = o.has_model ? o.model : "--preset " + o.preset;
  TIERMOE_CHECK(c.num_experts > 0 && c.num_moe_layers() > 0, "the model has no MoE layers", where,
                "plan places experts: pick a MoE model or preset");
  return c;
}

RoutingProfile routing_profile(const PlanOptions& o, const ModelConfig& c) {
  const int64_t L = c.num_moe_layers(), E = c.num_experts;
  if (o.synthetic) {
    // Each token picks top-k distinct experts: at most one row per expert.
    return RoutingProfile::synthetic(L, E, double(o.tokens * c.num_experts_per_tok), o.zipf, o.seed,
                                     /*max_rows_per_expert=*/double(o.tokens));
  }
  RoutingProfile p = RoutingProfile::load(o.profile);
  TIERMOE_CHECK(p.layers() == L && p.experts() == E,
                str_of("the profile has ", p.layers(), " layers x ", p.experts(),
                       " experts; the model has ", L, " MoE layers x ", E, " experts"),
                o.profile,
                "pass the model the profile was recorded on (--model DIR, or --preset NAME with "
                "--layers N)");
  return p;
}

std::string threads(int n) { return str_of(n, n == 1 ? " thread" : " threads"); }

Rates cost_rates(const PlanOptions& o, const ExpertShape& shape, TrainMode mode) {
  Rates r;
  r.cost.buckets = bucket_ladder(16, ExpertsConfig{}.dw_row_block);
  const bool on_cpu_device = !(o.has_device && o.has_link && o.has_launch);
  // The measurements run real experts of the model's shape on the host.
  const uint64_t host_bytes = o.has_host ? 0 : measure_host_bytes(shape, mode);
  const uint64_t device_bytes =
      on_cpu_device ? measure_device_bytes(shape, mode, r.cost.buckets) : 0;
  check_host_memory(host_bytes + device_bytes, "measuring the expert rates",
                    o.has_model ? o.model : "--preset " + o.preset,
                    "give the rates instead: --host-tflops, --device-tflops, --link-gbps and "
                    "--launch-us");
  const int cores = default_num_threads();
  r.device_threads = on_cpu_device ? std::max(1, cores / 2) : 0;
  r.host_threads = std::max(1, cores - r.device_threads);

  if (o.has_host) {
    r.cost.host_flops_per_s = o.host_tflops * 1e12;
  } else {
    std::cerr << "plan: measuring the host experts (" << threads(r.host_threads) << ")\n";
    r.cost.host_flops_per_s = measure_host(shape, mode, r.host_threads);
    r.host_measured = true;
  }
  r.all_host_flops_per_s = r.cost.host_flops_per_s;
  if (!o.has_host && r.host_threads < cores) {
    std::cerr << "plan: measuring the host experts on all " << cores
              << " threads (the all-host baseline)\n";
    r.all_host_flops_per_s = measure_host(shape, mode, cores);
  }
  if (on_cpu_device) {
    std::cerr << "plan: measuring a CPU device (" << threads(r.device_threads)
              << "); to predict another device pass --device-tflops, --link-gbps and "
                 "--launch-us\n";
    CpuDeviceConfig cfg;
    cfg.memory_bytes = measure_device_bytes(shape, mode, r.cost.buckets);
    cfg.threads = r.device_threads;
    CpuDevice dev(cfg);
    const DeviceRates d = measure_device(dev, shape, mode, r.cost.buckets);
    r.cost.device_flops_per_s = d.flops_per_s;
    r.cost.link_bytes_per_s = d.link_bytes_per_s;
    r.cost.launch_s = d.launch_s;
    r.device_measured = !o.has_device;
    r.link_measured = !o.has_link;
    r.launch_measured = !o.has_launch;
  }
  if (o.has_device) r.cost.device_flops_per_s = o.device_tflops * 1e12;
  if (o.has_link) r.cost.link_bytes_per_s = o.link_gbps * 1e9;
  if (o.has_launch) r.cost.launch_s = o.launch_us * 1e-6;
  r.cost.validate("tiermoe plan rates");
  return r;
}

std::string fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string percent(double f) { return fixed(100 * f, 1) + "%"; }

// "1.234 s", "12.345 ms", "56.789 us".
std::string duration(double s) {
  if (s >= 1) return fixed(s, 3) + " s";
  if (s >= 1e-3) return fixed(s * 1e3, 3) + " ms";
  return fixed(s * 1e6, 3) + " us";
}

std::string origin(bool measured) { return measured ? "measured" : "given"; }

void print_report(std::ostream& os, const PlanOptions& o, const ModelConfig& c,
                  const ExpertShape& shape, const Rates& r, const PlacementPlanner& planner,
                  const Placement& p, const PlanPrediction& pred, const PlanPrediction& host) {
  const std::string model = o.has_model ? o.model : o.preset;
  os << "plan: " << model << ", " << c.num_moe_layers() << " MoE layers x " << c.num_experts
     << " experts (D " << shape.D << ", F " << shape.F << ", " << o.dtype << ", " << o.mode
     << "), placement " << o.placement << ", profile "
     << (o.synthetic ? str_of("synthetic (Zipf ", o.zipf, ", ", o.tokens, " tokens)") : o.profile)
     << "\n";
  const CostModel& k = r.cost;
  os << "rates: host " << fixed(k.host_flops_per_s / 1e12, 3) << " TFLOP/s ("
     << origin(r.host_measured) << ", " << threads(r.host_threads) << "; all-host baseline "
     << fixed(r.all_host_flops_per_s / 1e12, 3) << "), device "
     << fixed(k.device_flops_per_s / 1e12, 3) << " TFLOP/s (" << origin(r.device_measured)
     << "), link " << fixed(k.link_bytes_per_s / 1e9, 2) << " GB/s (" << origin(r.link_measured)
     << "), launch " << fixed(k.launch_s * 1e6, 1) << " us (" << origin(r.launch_measured) << ")\n";
  os << "layer  resident  hot      host ms  device ms  transfer ms  makespan ms\n";
  for (size_t l = 0; l < pred.layers.size(); ++l) {
    const LayerPrediction& q = pred.layers[l];
    char line[160];
    std::snprintf(line, sizeof line, "%5zu  %8lld  %6s  %8.3f  %9.3f  %11.3f  %11.3f\n", l,
                  static_cast<long long>(p.count(int64_t(l))), percent(q.hot_fraction).c_str(),
                  q.host_s * 1e3, q.device_s * 1e3, q.transfer_s * 1e3, q.makespan_s * 1e3);
    os << line;
  }
  const double speedup = pred.step_s > 0 ? host.step_s / pred.step_s : 1.0;
  os << "total: " << p.count() << " resident experts, hot fraction " << percent(pred.hot_fraction)
     << ", predicted expert time per step " << duration(pred.step_s) << " vs "
     << duration(host.step_s) << " all-host (" << fixed(speedup, 2) << "x)";
  if (pred.sync_s > 0) os << ", of which weight sync " << duration(pred.sync_s);
  os << "\n";
  os << "device memory: " << human_bytes(pred.bytes) << " of " << human_bytes(planner.budget())
     << " budget (workspace " << human_bytes(bytes_workspace(shape, k.largest_bucket())) << " + "
     << p.count() << " x " << human_bytes(bytes_resident(shape, planner.config().train))
     << " per expert)\n";
  if (planner.capacity() == 0) {
    os << "note: the budget holds no expert; one needs " << human_bytes(planner.bytes_for(1))
       << "\n";
  }
}

Json to_json(const PlanOptions& o, const ModelConfig& c, const ExpertShape& shape, const Rates& r,
             const PlacementPlanner& planner, const RoutingProfile& profile, const Placement& p,
             const PlanPrediction& pred, const PlanPrediction& host) {
  Json j;
  j["model"] = o.has_model ? o.model : o.preset;
  j["moe_layers"] = c.num_moe_layers();
  j["experts"] = c.num_experts;
  j["top_k"] = c.num_experts_per_tok;
  j["D"] = shape.D;
  j["F"] = shape.F;
  j["dtype"] = o.dtype;
  j["mode"] = o.mode;
  j["placement"] = o.placement;
  j["profile"] = {{"source", o.synthetic ? "synthetic" : o.profile},
                  {"steps", profile.steps()},
                  {"drift", profile.drift()}};
  j["rates"] = {{"host_flops_per_s", r.cost.host_flops_per_s},
                {"host_threads", r.host_threads},
                {"all_host_flops_per_s", r.all_host_flops_per_s},
                {"device_threads", r.device_threads},
                {"device_flops_per_s", r.cost.device_flops_per_s},
                {"link_bytes_per_s", r.cost.link_bytes_per_s},
                {"launch_s", r.cost.launch_s},
                {"buckets", r.cost.buckets},
                {"measured",
                 {{"host", r.host_measured},
                  {"device", r.device_measured},
                  {"link", r.link_measured},
                  {"launch", r.launch_measured}}}};
  j["budget_bytes"] = planner.budget();
  j["bytes"] = pred.bytes;
  j["workspace_bytes"] = bytes_workspace(shape, r.cost.largest_bucket());
  j["expert_bytes"] = bytes_resident(shape, planner.config().train);
  j["resident"] = p.count();
  j["hot_fraction"] = pred.hot_fraction;
  j["step_s"] = pred.step_s;
  j["sync_s"] = pred.sync_s;
  j["all_host_step_s"] = host.step_s;
  j["speedup"] = pred.step_s > 0 ? host.step_s / pred.step_s : 1.0;
  Json layers = Json::array();
  for (size_t l = 0; l < pred.layers.size(); ++l) {
    const LayerPrediction& q = pred.layers[l];
    std::vector<int64_t> experts;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      if (p.is_resident(int64_t(l), e)) experts.push_back(e);
    }
    layers.push_back({{"layer", l},
                      {"resident", experts.size()},
                      {"resident_experts", experts},
                      {"rows", profile.rows(int64_t(l))},
                      {"hot_fraction", q.hot_fraction},
                      {"host_s", q.host_s},
                      {"device_s", q.device_s},
                      {"transfer_s", q.transfer_s},
                      {"makespan_s", q.makespan_s}});
  }
  j["layers"] = layers;
  return j;
}

void run_plan(const PlanOptions& o) {
  const ModelConfig c = model_config(o);
  ExpertShape shape;
  shape.D = c.hidden_size;
  shape.F = c.moe_intermediate_size;
  shape.dtype = parse_dtype(o.dtype, "--dtype");
  TIERMOE_CHECK(shape.dtype != DType::f64, "plan predicts bf16 or f32 runs", "--dtype",
                "f64 is the parity mode, not a speed mode");
  const TrainMode mode = parse_train_mode(o.mode, "--mode");

  PlannerConfig pc;
  pc.budget_bytes = parse_bytes(o.device_memory, "--device-memory");
  pc.mode = parse_placement_mode(o.placement, "--placement");
  pc.train = mode;
  pc.micro_batches = o.micro_batches;

  const RoutingProfile profile = routing_profile(o, c);
  if (!o.save_profile.empty()) profile.save(o.save_profile);
  const Rates rates = cost_rates(o, shape, mode);
  const PlacementPlanner planner(pc, shape, c.num_moe_layers(), c.num_experts, rates.cost);
  const Placement placement = planner.plan(profile);
  const PlanPrediction pred = planner.predict(placement, profile);
  CostModel all_host_cost = rates.cost;
  all_host_cost.host_flops_per_s = rates.all_host_flops_per_s;
  const PlanPrediction host =
      PlacementPlanner(pc, shape, c.num_moe_layers(), c.num_experts, all_host_cost)
          .predict(Placement::none(c.num_moe_layers(), c.num_experts), profile);

  print_report(o.json ? std::cerr : std::cout, o, c, shape, rates, planner, placement, pred, host);
  if (o.json) {
    std::cout << to_json(o, c, shape, rates, planner, profile, placement, pred, host).dump()
              << "\n";
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanOptions>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "Which experts a device would hold for a routing profile, and the predicted step time");
  cmd->fallthrough();
  CLI::Option* profile =
      cmd->add_option("--profile", o->profile, "Routing profile JSON (tiermoe-routing-profile)");
  CLI::Option* zipf = cmd->add_option(
      "--synthetic-zipf", o->zipf,
      "Instead of --profile: a Zipf-skewed profile with this exponent (needs --tokens)");
  CLI::Option* tokens =
      cmd->add_option("--tokens", o->tokens, "Tokens per step of the synthetic profile")
          ->check(count_in(1, kMaxCount));
  profile->excludes(zipf);
  zipf->needs(tokens);
  tokens->needs(zipf);
  cmd->add_option("--seed", o->seed, "Expert order of the synthetic profile")
      ->capture_default_str();
  cmd->add_option("--save-profile", o->save_profile, "Write the profile used to this file");
  cmd->add_option("--device-memory", o->device_memory,
                  "Device bytes for the experts (5000000000, 5GB, 40GiB)")
      ->required();
  CLI::Option* preset_opt =
      cmd->add_option("--preset", o->preset, "Model preset")->capture_default_str();
  CLI::Option* model = cmd->add_option("--model", o->model, "Checkpoint dir (its config.json)");
  CLI::Option* layers = cmd->add_option("--layers", o->layers, "Decoder layers of the preset")
                            ->check(count_in(1, ModelConfig::kMaxLayers));
  model->excludes(preset_opt);
  model->excludes(layers);
  cmd->add_option("--mode", o->mode, "lora (frozen experts) or full (experts trained)")
      ->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "bf16 or f32")->capture_default_str();
  cmd->add_option("--placement", o->placement, "auto, device (as many as fit) or host")
      ->capture_default_str();
  cmd->add_option("--micro-batches", o->micro_batches,
                  "Expert calls per step (gradient accumulation); padding is per call")
      ->capture_default_str()
      ->check(count_in(1, kMaxCount));
  CLI::Option* host =
      cmd->add_option("--host-tflops", o->host_tflops, "Host expert TFLOP/s (default: measured)")
          ->check(number_in(1e-9, 1e9, "TFLOP/s"));
  CLI::Option* device = cmd->add_option("--device-tflops", o->device_tflops,
                                        "Device expert TFLOP/s (default: a CPU device, measured)")
                            ->check(number_in(1e-9, 1e9, "TFLOP/s"));
  CLI::Option* link =
      cmd->add_option("--link-gbps", o->link_gbps, "Host-device link, GB/s (10^9 bytes/s) each way")
          ->check(number_in(1e-9, 1e9, "GB/s"));
  CLI::Option* launch = cmd->add_option("--launch-us", o->launch_us,
                                        "Fixed cost of one device graph launch, microseconds")
                            ->check(number_in(0, 1e9, "microseconds"));
  cmd->add_flag("--json", o->json, "Print one JSON object on the last stdout line");
  cmd->callback([=] {
    o->synthetic = zipf->count() > 0;
    TIERMOE_CHECK(o->synthetic || profile->count() > 0, "no routing profile", "tiermoe plan",
                  "pass --profile FILE, or --synthetic-zipf S --tokens T");
    TIERMOE_CHECK(!o->synthetic || o->zipf >= 0, str_of("Zipf exponent ", o->zipf),
                  "--synthetic-zipf", "0 is uniform routing; about 1 is a typical skew");
    o->has_model = model->count() > 0;
    o->has_layers = layers->count() > 0;
    o->has_host = host->count() > 0;
    o->has_device = device->count() > 0;
    o->has_link = link->count() > 0;
    o->has_launch = launch->count() > 0;
    run_plan(*o);
  });
}

}  // namespace tiermoe::cli
