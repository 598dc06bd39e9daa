#include "tiermoe/report/report_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tiermoe/core/error.h"
#include "tiermoe/io/model_config.h"
#include "tiermoe/tier/routing_profile.h"

namespace tiermoe {

namespace fs = std::filesystem;
using detail::str_of;
using nlohmann::json;

namespace {

std::string read_text(const std::string& path, const std::string& what, const std::string& hint) {
  std::ifstream in(path, std::ios::binary);
  TIERMOE_CHECK(in.good(), "cannot open the " + what, path, hint);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

double number(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0.0;
  TIERMOE_CHECK(it->is_number(), str_of("\"", key, "\" is not a number"), where,
                "the file is not what train --metrics writes");
  return it->get<double>();
}

// A count written as a JSON number: whole and in [0, max] (converting a
// double past int64 to it is undefined; the fuzzer found "total_steps":
// 2.2e30).
int64_t count(const json& j, const char* key, const std::string& where, int64_t max) {
  const double v = number(j, key, where);
  TIERMOE_CHECK(v >= 0 && v <= double(max) && v == std::floor(v),
                str_of("\"", key, "\" is ", v, ", not a count of at most ", max), where,
                "the file is not what tiermoe wrote");
  return int64_t(v);
}

const json& required(const json& j, const char* key, const std::string& where) {
  const auto it = j.find(key);
  TIERMOE_CHECK(it != j.end() && it->is_number(), str_of("no number \"", key, "\""), where,
                "each line must be a step of train --metrics");
  return *it;
}

// Drops every per-step entry from index `n` on (a resumed run repeating steps).
void truncate_steps(RunSeries& r, size_t n) {
  for (std::vector<double>* v :
       {&r.step, &r.loss, &r.lr, &r.grad_norm, &r.tokens_per_s, &r.step_time_s, &r.hot_fraction,
        &r.drift, &r.time.attention_s, &r.time.mlp_other_s, &r.time.host_experts_s, &r.time.wait_s,
        &r.time.tier_moves_s, &r.time.other_s, &r.time.device_s, &r.time.transfer_s}) {
    if (v->size() > n) v->resize(n);
  }
  for (auto& [tag, v] : r.memory_live) {
    if (v.size() > n) v.resize(n);
  }
  for (std::vector<double>& v : r.time.parts) {
    if (v.size() > n) v.resize(n);
  }
}

// Drops the eval points and re-placements at or after `step`.
void truncate_marks(RunSeries& r, double step) {
  size_t k = 0;
  while (k < r.eval_step.size() && r.eval_step[k] < step) ++k;
  r.eval_step.resize(k);
  r.eval_loss.resize(k);
  k = 0;
  while (k < r.replacement_steps.size() && r.replacement_steps[k] < step) ++k;
  r.replacement_steps.resize(k);
}

void add_line(RunSeries& r, const json& j, const std::string& where) {
  const double step = required(j, "step", where).get<double>();
  // A resumed run repeating steps: keep the later lines.
  size_t keep = r.step.size();
  while (keep > 0 && r.step[keep - 1] >= step) --keep;
  if (keep < r.step.size()) {
    truncate_steps(r, keep);
    truncate_marks(r, step);
  }
  const size_t i = r.step.size();  // this line's index in every per-step series
  r.step.push_back(step);
  r.loss.push_back(required(j, "loss", where).get<double>());
  const double step_s = required(j, "step_time_s", where).get<double>();
  r.step_time_s.push_back(step_s);
  r.lr.push_back(number(j, "lr", where));
  r.grad_norm.push_back(number(j, "grad_norm", where));
  r.tokens_per_s.push_back(number(j, "tokens_per_s", where));
  if (j.contains("total_steps")) r.total_steps = count(j, "total_steps", where, int64_t(1) << 31);
  if (j.contains("loss_floor")) r.loss_floor = number(j, "loss_floor", where);
  if (j.contains("eval_loss")) {
    r.eval_step.push_back(step);
    r.eval_loss.push_back(number(j, "eval_loss", where));
  }

  const double attention = number(j, "attention_s", where), mlp = number(j, "mlp_s", where);
  if (j.contains("attention_s") || j.contains("mlp_s")) r.has_time_split = true;
  double host = 0, wait = 0, moves = 0, device = 0, transfer = 0, hot = 0, drift = 0;
  const auto tier = j.find("tier");
  if (tier != j.end() && tier->is_object()) {
    const std::string w = where + ": tier";
    r.has_tier = true;
    host = number(*tier, "host_s", w);
    wait = number(*tier, "wait_s", w);
    moves = number(*tier, "move_s", w) + number(*tier, "sync_s", w);
    device = number(*tier, "device_s", w);
    transfer = number(*tier, "transfer_s", w);
    hot = number(*tier, "hot_fraction", w);
    drift = number(*tier, "drift", w);
    if (number(*tier, "replacements", w) > 0) r.replacement_steps.push_back(step);
    const auto layers = tier->find("layers");
    if (layers != tier->end() && layers->is_array()) {
      std::vector<std::vector<int64_t>> resident;
      for (const json& l : *layers) {
        std::vector<int64_t>& ids = resident.emplace_back();
        const auto it = l.find("resident_experts");
        if (it == l.end()) continue;
        TIERMOE_CHECK(it->is_array(), "\"resident_experts\" is not a list", w,
                      "the file is not what train --metrics writes");
        for (const json& e : *it) {
          TIERMOE_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0,
                        "\"resident_experts\" holds a non-id", w,
                        "the file is not what train --metrics writes");
          ids.push_back(e.get<int64_t>());
        }
      }
      r.resident_last = std::move(resident);
    }
  }
  r.hot_fraction.push_back(hot);
  r.drift.push_back(drift);
  // The experts' host share and the wait lie inside the MLP blocks; moves
  // happen between steps, outside them.
  r.time.attention_s.push_back(attention);
  r.time.host_experts_s.push_back(host);
  r.time.wait_s.push_back(wait);
  r.time.mlp_other_s.push_back(std::max(0.0, mlp - host - wait));
  r.time.tier_moves_s.push_back(moves);
  r.time.other_s.push_back(std::max(0.0, step_s - attention - mlp - moves));
  r.time.device_s.push_back(device);
  r.time.transfer_s.push_back(transfer);
  const auto split = j.find("time_split_s");
  const bool has_split = split != j.end() && split->is_object();
  if (has_split) r.has_parts = true;
  for (size_t p = 0; p <= kNumStepParts; ++p) {
    const char* name = p < kNumStepParts ? step_part_name(StepPart(p)).data() : "other";
    r.time.parts[p].push_back(has_split ? number(*split, name, where + ": time_split_s") : 0.0);
  }

  const auto memory = j.find("memory_bytes");
  if (memory != j.end() && memory->is_object() && memory->contains("live")) {
    const json& live = memory->at("live");
    TIERMOE_CHECK(live.is_object(), "\"memory_bytes\".\"live\" is not an object", where,
                  "the file is not what train --metrics writes");
    for (const auto& [tag, bytes] : live.items()) {
      if (!r.memory_live.count(tag)) r.memory_tags.push_back(tag);
      std::vector<double>& v = r.memory_live[tag];
      v.resize(i, 0.0);  // a tag first seen here was 0 before
      TIERMOE_CHECK(bytes.is_number(), "a memory figure is not a number", where + ": " + tag,
                    "the file is not what train --metrics writes");
      v.push_back(bytes.get<double>());
    }
  }
  for (auto& [tag, v] : r.memory_live) v.resize(i + 1, 0.0);
}

}  // namespace

RunSeries parse_metrics(const std::string& text, const std::string& where) {
  RunSeries r;
  r.source = where;
  std::istringstream in(text);
  std::string line;
  int64_t n = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = str_of(where, ":", n);
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    // A run killed mid-write leaves a cut last line: the lines before it stand.
    if (j.is_discarded() && !in.good()) break;
    TIERMOE_CHECK(j.is_object(), "the line is not a JSON object", at,
                  "pass the file train --metrics wrote");
    add_line(r, j, at);
  }
  TIERMOE_CHECK(!r.step.empty(), "no steps in the metrics", where,
                "the run has not finished a step yet, or this is not a metrics file");
  return r;
}

RunSeries read_metrics(const std::string& path) {
  return parse_metrics(read_text(path, "metrics file", "pass the file train --metrics wrote"),
                       path);
}

LoadMap load_map_from_profile(const std::string& profile_path,
                              const std::vector<std::vector<int64_t>>& resident) {
  const RoutingProfile p = RoutingProfile::load(profile_path);
  LoadMap m;
  m.source = profile_path;
  m.layers = p.layers();
  m.experts = p.experts();
  m.resident_LE.assign(size_t(m.layers), std::vector<uint8_t>(size_t(m.experts), 0));
  for (int64_t l = 0; l < m.layers; ++l) m.rows_LE.push_back(p.rows(l));
  TIERMOE_CHECK(resident.size() <= size_t(m.layers),
                str_of("the metrics place experts in ", resident.size(),
                       " MoE layers, the profile has ", m.layers),
                profile_path, "pass the routing profile of the same run (--profile)");
  for (size_t l = 0; l < resident.size(); ++l) {
    for (int64_t e : resident[l]) {
      TIERMOE_CHECK(e >= 0 && e < m.experts,
                    str_of("layer ", l, ": resident expert ", e, " of ", m.experts), profile_path,
                    "pass the routing profile of the same run (--profile)");
      m.resident_LE[l][size_t(e)] = 1;
    }
  }
  return m;
}

PlanSeries parse_plan(const std::string& text, const std::string& where) {
  // tiermoe plan --json prints its object on the last line; a saved stdout
  // may carry more above it.
  std::string last;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  const json j = json::parse(last, nullptr, /*allow_exceptions=*/false);
  const std::string hint = "pass what tiermoe plan --json printed";
  TIERMOE_CHECK(j.is_object() && j.contains("layers") && j.at("layers").is_array(),
                "not the JSON of tiermoe plan --json", where, hint);
  PlanSeries p;
  p.source = where;
  p.hot_fraction = number(j, "hot_fraction", where);
  p.step_s = number(j, "step_s", where);
  p.all_host_step_s = number(j, "all_host_step_s", where);
  p.bytes = number(j, "bytes", where);
  p.budget_bytes = number(j, "budget_bytes", where);
  const int64_t E = count(j, "experts", where, ModelConfig::kMaxExperts);
  TIERMOE_CHECK(E > 0, "no expert count", where, hint);
  LoadMap m;
  m.source = where;
  m.experts = E;
  bool has_rows = true;
  for (const json& l : j.at("layers")) {
    const std::string at = str_of(where, ": layer ", m.layers);
    std::vector<uint8_t>& on = m.resident_LE.emplace_back(size_t(E), 0);
    for (const json& e : l.value("resident_experts", json::array())) {
      TIERMOE_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 && e.get<int64_t>() < E,
                    "a resident expert id out of range", at, hint);
      on[size_t(e.get<int64_t>())] = 1;
    }
    const auto rows = l.find("rows");
    if (rows == l.end()) {
      has_rows = false;
    } else {
      TIERMOE_CHECK(rows->is_array() && int64_t(rows->size()) == E,
                    str_of("\"rows\" must hold ", E, " numbers"), at, hint);
      std::vector<double>& r = m.rows_LE.emplace_back();
      for (const json& x : *rows) {
        TIERMOE_CHECK(x.is_number(), "\"rows\" holds a non-number", at, hint);
        r.push_back(x.get<double>());
      }
    }
    ++m.layers;
  }
  if (has_rows && m.layers > 0) p.load = std::move(m);
  return p;
}

PlanSeries read_plan(const std::string& path) {
  return parse_plan(read_text(path, "plan file", "save what tiermoe plan --json prints"), path);
}

}  // namespace tiermoe
