#include "tiermoe/tier/routing_profile.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "tiermoe/core/error.h"
#include "tiermoe/core/files.h"
#include "tiermoe/core/random.h"

namespace tiermoe {

namespace {

using Json = nlohmann::json;
using detail::str_of;

constexpr const char* kFormat = "tiermoe-routing-profile";
constexpr int64_t kVersion = 1;
// An expert's rows in a step are at most the step's tokens; no batch that
// fits in memory has 2^31 of them. Larger counts (1e12, 1e308) would only
// make the planner allocate launches until bad_alloc.
constexpr double kMaxRowsPerStep = double(int64_t(1) << 31);
constexpr const char* kFileHint =
    "a routing profile is written by `tiermoe train` or RoutingProfile::save; "
    "regenerate it rather than editing it by hand";

// The rows of each Zipf rank (see synthetic): weights w_r = (r+1)^-s fall
// with r, so the ranks held at `cap` are a prefix; the first rank p whose
// share of what the prefix leaves fits under the cap ends it.
std::vector<double> capped_zipf_rows(int64_t experts, double total, double s, double cap) {
  std::vector<double> weight_R(static_cast<size_t>(experts), 0.0);
  std::vector<double> suffix_R(static_cast<size_t>(experts) + 1, 0.0);
  for (int64_t r = 0; r < experts; ++r) weight_R[size_t(r)] = std::pow(double(r + 1), -s);
  for (int64_t r = experts - 1; r >= 0; --r) {
    suffix_R[size_t(r)] = suffix_R[size_t(r) + 1] + weight_R[size_t(r)];
  }
  std::vector<double> rows_R(static_cast<size_t>(experts), 0.0);
  double left = total;
  for (int64_t r = 0; r < experts && left > 0; ++r) {
    const double share = suffix_R[size_t(r)] > 0
                             ? left * weight_R[size_t(r)] / suffix_R[size_t(r)]
                             : left;  // the weights vanished: the next rank fills up
    if (share <= cap) {
      // Every later rank's share is smaller still: split by the weights.
      for (int64_t q = r; q < experts; ++q) {
        rows_R[size_t(q)] = suffix_R[size_t(r)] > 0
                                ? left * weight_R[size_t(q)] / suffix_R[size_t(r)]
                                : (q == r ? left : 0.0);
      }
      break;
    }
    rows_R[size_t(r)] = cap;
    left -= cap;
  }
  return rows_R;
}

void check_decay(double decay, const std::string& where) {
  TIERMOE_CHECK(std::isfinite(decay) && decay >= 0 && decay < 1,
                str_of("routing profile decay ", decay, " is outside [0, 1)"), where,
                "0.9 averages over about the last 10 steps; 0 keeps only the last step");
}

// L1 distance between the normalised versions of two non-negative vectors.
double normalised_l1(const std::vector<double>& a, const std::vector<double>& b) {
  double sa = std::accumulate(a.begin(), a.end(), 0.0);
  double sb = std::accumulate(b.begin(), b.end(), 0.0);
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += std::abs((sa > 0 ? a[i] / sa : 0.0) - (sb > 0 ? b[i] / sb : 0.0));
  }
  return d;
}

const Json& field(const Json& j, const char* name, const std::string& where) {
  auto it = j.find(name);
  TIERMOE_CHECK(it != j.end(), str_of("routing profile has no \"", name, "\" field"), where,
                kFileHint);
  return *it;
}

int64_t int_field(const Json& j, const char* name, const std::string& where) {
  const Json& v = field(j, name, where);
  TIERMOE_CHECK(v.is_number_integer(), str_of("routing profile \"", name, "\" is not an integer"),
                where, kFileHint);
  return v.get<int64_t>();
}

double number_field(const Json& j, const char* name, const std::string& where) {
  const Json& v = field(j, name, where);
  TIERMOE_CHECK(v.is_number(), str_of("routing profile \"", name, "\" is not a number"), where,
                kFileHint);
  return v.get<double>();
}

}  // namespace

RoutingProfile::RoutingProfile(int64_t layers, int64_t experts, double decay)
    : layers_(layers), experts_(experts), decay_(decay) {
  TIERMOE_CHECK(
      layers > 0 && experts > 0,
      str_of("a routing profile needs layers > 0 and experts > 0, got ", layers, " x ", experts),
      "RoutingProfile", "pass the model's MoE layer count and experts per layer");
  check_decay(decay, "RoutingProfile");
  ema_LE.assign(size_t(layers), std::vector<double>(size_t(experts), 0.0));
  count_LE.assign(size_t(layers), std::vector<int64_t>(size_t(experts), 0));
}

void RoutingProfile::observe(int64_t layer, const std::vector<int64_t>& count_E) {
  TIERMOE_ASSERT(layer >= 0 && layer < layers_, "layer ", layer, " of ", layers_);
  TIERMOE_ASSERT(int64_t(count_E.size()) == experts_, count_E.size(), " counts for ", experts_,
                 " experts");
  std::vector<int64_t>& sum_E = count_LE[size_t(layer)];
  for (size_t e = 0; e < count_E.size(); ++e) {
    TIERMOE_ASSERT(count_E[e] >= 0, "negative row count ", count_E[e]);
    sum_E[e] += count_E[e];
  }
}

void RoutingProfile::end_step() {
  double drift = 0;
  for (size_t l = 0; l < size_t(layers_); ++l) {
    std::vector<double> before = ema_LE[l];
    std::vector<double>& ema_E = ema_LE[l];
    for (size_t e = 0; e < size_t(experts_); ++e) {
      double c = double(count_LE[l][e]);
      ema_E[e] = steps_ == 0 ? c : decay_ * ema_E[e] + (1 - decay_) * c;
      count_LE[l][e] = 0;
    }
    if (steps_ > 0) drift += normalised_l1(before, ema_E);
  }
  drift_ = drift / double(layers_);
  ++steps_;
}

const std::vector<double>& RoutingProfile::rows(int64_t layer) const {
  TIERMOE_ASSERT(layer >= 0 && layer < layers_, "layer ", layer, " of ", layers_);
  return ema_LE[size_t(layer)];
}

double RoutingProfile::total_rows(int64_t layer) const {
  const std::vector<double>& r = rows(layer);
  return std::accumulate(r.begin(), r.end(), 0.0);
}

std::string RoutingProfile::to_json() const {
  Json j;
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["decay"] = decay_;
  j["steps"] = steps_;
  j["layers"] = layers_;
  j["experts"] = experts_;
  j["drift"] = drift_;
  j["rows"] = ema_LE;
  return j.dump();
}

RoutingProfile RoutingProfile::from_json(std::string_view text, const std::string& where) {
  Json j;
  try {
    j = Json::parse(text);
  } catch (const Json::exception& e) {
    throw Error(str_of("routing profile is not valid JSON: ", e.what()), where, kFileHint);
  }
  TIERMOE_CHECK(j.is_object(), "routing profile is not a JSON object", where, kFileHint);
  const Json& format = field(j, "format", where);
  TIERMOE_CHECK(format.is_string() && format.get<std::string>() == kFormat,
                str_of("\"format\" is ", format.dump(), ", not \"", kFormat, "\""), where,
                "this file is not a TierMoE routing profile");
  const int64_t version = int_field(j, "version", where);
  TIERMOE_CHECK(version == kVersion,
                str_of("routing profile version ", version, " is not supported (this build reads ",
                       kVersion, ")"),
                where, "write the profile with this build of TierMoE");
  const double decay = number_field(j, "decay", where);
  check_decay(decay, where + ": \"decay\"");
  const int64_t steps = int_field(j, "steps", where);
  TIERMOE_CHECK(steps >= 0, str_of("\"steps\" is ", steps), where, "steps counts from 0");
  const int64_t layers = int_field(j, "layers", where);
  const int64_t experts = int_field(j, "experts", where);
  TIERMOE_CHECK(
      layers > 0 && experts > 0,
      str_of("\"layers\" and \"experts\" must be positive, got ", layers, " and ", experts), where,
      kFileHint);
  // The rows' shape is checked before the profile is allocated: "layers"
  // and "experts" may claim far more than the file holds.
  const Json& rows = field(j, "rows", where);
  TIERMOE_CHECK(
      rows.is_array() && int64_t(rows.size()) == layers,
      str_of("\"rows\" must be an array of ", layers, " layers, got ",
             rows.is_array() ? std::to_string(rows.size()) + " entries" : rows.type_name()),
      where, "one array of per-expert rows per MoE layer");
  for (int64_t l = 0; l < layers; ++l) {
    const Json& row = rows[size_t(l)];
    TIERMOE_CHECK(
        row.is_array() && int64_t(row.size()) == experts,
        str_of("layer ", l, " must list ", experts, " experts, got ",
               row.is_array() ? std::to_string(row.size()) + " entries" : row.type_name()),
        str_of(where, ": rows[", l, "]"), "every layer lists rows for each of \"experts\" experts");
  }
  RoutingProfile p(layers, experts, decay);
  p.steps_ = steps;
  if (j.contains("drift")) {
    p.drift_ = number_field(j, "drift", where);
    TIERMOE_CHECK(std::isfinite(p.drift_) && p.drift_ >= 0 && p.drift_ <= 2,
                  str_of("\"drift\" is ", p.drift_, ", outside [0, 2]"), where, kFileHint);
  }
  for (int64_t l = 0; l < layers; ++l) {
    const Json& row = rows[size_t(l)];
    const std::string at = str_of(where, ": rows[", l, "]");
    for (int64_t e = 0; e < experts; ++e) {
      const Json& v = row[size_t(e)];
      TIERMOE_CHECK(v.is_number(), str_of("layer ", l, " expert ", e, " is not a number"), at,
                    kFileHint);
      double r = v.get<double>();
      TIERMOE_CHECK(std::isfinite(r) && r >= 0 && r <= kMaxRowsPerStep,
                    str_of("layer ", l, " expert ", e, " has ", r, " rows"), at,
                    str_of("rows per step are non-negative and at most ", kMaxRowsPerStep,
                           " (an expert takes at most one row per token of a step)"));
      TIERMOE_CHECK(steps > 0 || r == 0,
                    str_of("layer ", l, " expert ", e, " has ", r, " rows after 0 steps"), at,
                    "a profile with \"steps\": 0 has observed nothing");
      p.ema_LE[size_t(l)][size_t(e)] = r;
    }
  }
  return p;
}

void RoutingProfile::save(const std::string& path) const {
  write_file_atomic(path, to_json() + "\n");
}

RoutingProfile RoutingProfile::load(const std::string& path) {
  std::error_code ec;
  TIERMOE_CHECK(std::filesystem::is_regular_file(path, ec), "no such routing profile file", path,
                "pass the routing_profile.json a training run wrote, or use a synthetic profile");
  std::ifstream in(path, std::ios::binary);
  TIERMOE_CHECK(in.good(), "cannot open for reading", path, "check permissions");
  std::string text{std::istreambuf_iterator<char>(in), {}};
  return from_json(text, path);
}

RoutingProfile RoutingProfile::synthetic(int64_t layers, int64_t experts,
                                         double total_rows_per_layer, double zipf_s, uint64_t seed,
                                         double max_rows_per_expert) {
  TIERMOE_CHECK(std::isfinite(total_rows_per_layer) && total_rows_per_layer >= 0,
                str_of("synthetic profile rows per layer ", total_rows_per_layer), "synthetic",
                "give the tokens times top-k of one step");
  TIERMOE_CHECK(std::isfinite(zipf_s) && zipf_s >= 0, str_of("Zipf exponent ", zipf_s), "synthetic",
                "0 is uniform routing; about 1 is a typical skew");
  TIERMOE_CHECK(total_rows_per_layer <= double(experts) * max_rows_per_expert,
                str_of(total_rows_per_layer, " rows a layer do not fit in ", experts,
                       " experts of at most ", max_rows_per_expert, " rows"),
                "synthetic", "top-k is at most the number of experts");
  RoutingProfile p(layers, experts);
  const std::vector<double> rows_R =
      capped_zipf_rows(experts, total_rows_per_layer, zipf_s, max_rows_per_expert);
  Rng rng(seed);
  for (int64_t l = 0; l < layers; ++l) {
    // Fisher-Yates: expert_R[r] is the expert of rank r in this layer.
    std::vector<int64_t> expert_R(static_cast<size_t>(experts));
    std::iota(expert_R.begin(), expert_R.end(), 0);
    for (int64_t i = experts - 1; i > 0; --i) {
      std::swap(expert_R[size_t(i)], expert_R[size_t(rng.below(uint64_t(i + 1)))]);
    }
    for (int64_t r = 0; r < experts; ++r) {
      p.ema_LE[size_t(l)][size_t(expert_R[size_t(r)])] = rows_R[size_t(r)];
    }
  }
  p.steps_ = 1;
  return p;
}

RoutingProfile RoutingProfile::join(const std::vector<RoutingProfile>& parts) {
  TIERMOE_CHECK(!parts.empty(), "no profiles to join", "RoutingProfile::join", "");
  int64_t experts = 0;
  for (const RoutingProfile& p : parts) {
    TIERMOE_CHECK(
        p.layers_ == parts[0].layers_ && p.decay_ == parts[0].decay_ && p.steps_ == parts[0].steps_,
        "the ranks' routing profiles disagree on layers, decay or steps", "RoutingProfile::join",
        "join the profiles of one run's ranks");
    experts += p.experts_;
  }
  RoutingProfile out(parts[0].layers_, experts, parts[0].decay_);
  out.steps_ = parts[0].steps_;
  for (int64_t l = 0; l < out.layers_; ++l) {
    std::vector<double>& row = out.ema_LE[size_t(l)];
    row.clear();
    for (const RoutingProfile& p : parts) {
      row.insert(row.end(), p.ema_LE[size_t(l)].begin(), p.ema_LE[size_t(l)].end());
      out.drift_ = std::max(out.drift_, p.drift_);
    }
  }
  return out;
}

RoutingProfile RoutingProfile::experts_slice(int64_t first, int64_t count) const {
  TIERMOE_CHECK(
      first >= 0 && count >= 1 && first + count <= experts_,
      detail::str_of("experts [", first, ", ", first + count, ") of a profile of ", experts_),
      "routing profile", "the profile is of another model");
  RoutingProfile out(layers_, count, decay_);
  out.steps_ = steps_;
  out.drift_ = drift_;
  for (int64_t l = 0; l < layers_; ++l) {
    const auto& row = ema_LE[size_t(l)];
    out.ema_LE[size_t(l)].assign(row.begin() + first, row.begin() + first + count);
  }
  return out;
}

}  // namespace tiermoe
