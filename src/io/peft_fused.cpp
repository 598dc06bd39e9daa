#include "peft_fused.h"

#include <cctype>
#include <cmath>
#include <set>

#include "safetensors_common.h"
#include "tiermoe/core/error.h"

namespace tiermoe::detail {

namespace {

using Json = nlohmann::json;

constexpr const char* kBaseLayer = ".base_layer";
constexpr const char* kExperts = ".experts";
// The fused parameters in the order transformers registers them, which is
// the order PEFT wraps them in (the first innermost).
constexpr const char* kFusedParams[] = {"gate_up_proj", "down_proj"};
// Patterns and keys are module paths, bounded so that matching stays cheap
// whatever a file holds.
constexpr size_t kMaxPatternChars = 256;
constexpr size_t kMaxKeyChars = 1024;

// rank_pattern / alpha_pattern keys as PEFT writes them: module names and
// the regular expressions of its fusion (".*\\.gate_up_proj"). TierMoE reads
// that subset of Python's syntax, literal characters (or escaped
// punctuation), "." and a "*" after either, and matches it by a linear scan
// of the key, not std::regex: a nested quantifier or a huge backreference in
// an untrusted file made std::regex backtrack for minutes or overflow.
struct PatternToken {
  char c = 0;
  bool any = false;   // "."
  bool star = false;  // followed by "*"
};

std::vector<PatternToken> parse_pattern(const std::string& pattern, const std::string& where) {
  TIERMOE_CHECK(pattern.size() <= kMaxPatternChars,
                str_of("pattern of ", pattern.size(), " characters"), where,
                str_of("rank_pattern / alpha_pattern keys are module names or short regular "
                       "expressions (at most ",
                       kMaxPatternChars, " characters)"));
  auto refuse = [&](const std::string& why) {
    throw Error(
        "pattern " + printable(pattern) + " is not a regular expression TierMoE reads: " + why,
        where,
        "rank_pattern / alpha_pattern keys are module names or regexes of literal "
        "characters, \\. , . and * (as PEFT writes them: \".*\\\\.gate_up_proj\")");
  };
  std::vector<PatternToken> tokens;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char ch = pattern[i];
    if (ch == '*') {
      if (tokens.empty() || tokens.back().star) refuse("'*' follows nothing it can repeat");
      tokens.back().star = true;
    } else if (ch == '.') {
      tokens.push_back({0, true, false});
    } else if (ch == '\\') {
      if (i + 1 == pattern.size() || std::isalnum(static_cast<unsigned char>(pattern[i + 1]))) {
        refuse("only punctuation may be escaped");
      }
      tokens.push_back({pattern[++i], false, false});
    } else if (ch == '$' && i + 1 == pattern.size()) {
      // re.match(...$) anchors anyway
    } else if (std::string_view("+?()[]{}|^$").find(ch) != std::string_view::npos) {
      refuse(str_of("'", ch, "' is not supported"));
    } else {
      tokens.push_back({ch, false, false});
    }
  }
  return tokens;
}

// PEFT's get_pattern_key: re.match(rf"(.*\.)?({pattern})$", key), i.e. the
// pattern matches the whole key or a tail of it that starts after a ".".
// One pass over the key carrying the set of pattern positions reached.
bool pattern_matches(const std::vector<PatternToken>& p, std::string_view key) {
  const size_t m = p.size();
  std::vector<char> cur(m + 1, 0), next(m + 1, 0);
  for (size_t i = 0;; ++i) {
    if (i == 0 || key[i - 1] == '.') cur[0] = 1;
    for (size_t j = 0; j < m; ++j) {  // a starred token may match nothing
      if (cur[j] && p[j].star) cur[j + 1] = 1;
    }
    if (i == key.size()) return cur[m];
    std::fill(next.begin(), next.end(), 0);
    for (size_t j = 0; j < m; ++j) {
      if (cur[j] && (p[j].any || p[j].c == key[i])) next[p[j].star ? j : j + 1] = 1;
    }
    std::swap(cur, next);
  }
}

template <class V>
V pattern_value(const std::vector<std::pair<std::string, V>>& patterns, V dflt,
                const std::string& key, const char* field, const std::string& where) {
  TIERMOE_CHECK(key.size() <= kMaxKeyChars, str_of("module path of ", key.size(), " characters"),
                where, "the adapter's keys name model modules");
  const std::string* found = nullptr;
  V value = dflt;
  for (const auto& [pattern, v] : patterns) {
    if (!pattern_matches(parse_pattern(pattern, where), key)) continue;
    TIERMOE_CHECK(
        !found || v == value,
        str_of(field, " patterns ", printable(*(found ? found : &pattern)), " and ",
               printable(pattern), " both match ", printable(key), " with different values"),
        where, "PEFT takes the first in file order; keep one pattern per module");
    found = &pattern;
    value = v;
  }
  return value;
}

double lora_scaling(double alpha, int64_t rank, bool rslora) {
  return rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank);
}

bool param_targeted(const std::string& key, const std::vector<std::string>& targets) {
  for (const std::string& t : targets) {
    if (key == t || key.ends_with("." + t)) return true;
  }
  return false;
}

// B_e [out, R] of a [out, R*E] factor: columns e, E + e, ..., (R-1)*E + e.
Tensor expert_columns(const Tensor& B, int64_t e, int64_t R, int64_t E, int64_t col0, int64_t rows0,
                      int64_t rows) {
  Tensor out = Tensor::empty({rows, R}, B.dtype(), MemTag::weights);
  const int64_t cols = B.size(1);
  for (int64_t o = 0; o < rows; ++o) {
    for (int64_t k = 0; k < R; ++k) {
      out.set(o * R + k, B.get((rows0 + o) * cols + (col0 + k) * E + e));
    }
  }
  return out;
}

// The wrapper for one fused parameter: its factors, rank and checks.
struct FusedParam {
  std::string param;  // "gate_up_proj" or "down_proj"
  std::string key;    // the parameter's key, "<layer>.mlp.experts.gate_up_proj"
  std::string where;  // the weights file and its tensor key
  const FusedLora* w;
  int64_t R;
  double alpha;
};

void check_factors(const FusedParam& f, int64_t& E) {
  const Tensor &A = f.w->A, &B = f.w->B;
  TIERMOE_CHECK(A.defined() && B.defined(),
                "the fused " + f.param + " adapter lacks " + (A.defined() ? "lora_B" : "lora_A"),
                f.where, "every adapted parameter needs both lora_A and lora_B");
  TIERMOE_CHECK(A.dim() == 2 && B.dim() == 2,
                str_of("lora_A is ", A.str(), " and lora_B is ", B.str(), "; both must be 2-D"),
                f.where,
                "PEFT stores a 3-D parameter's LoRA as lora_A [R*E, in], lora_B [out, R*E]");
  TIERMOE_CHECK(A.size(0) > 0 && A.size(0) % f.R == 0 && B.size(1) == A.size(0) && A.size(1) > 0 &&
                    B.size(0) > 0,
                str_of("lora_A is ", A.str(), " and lora_B is ", B.str(), " but the rank of ",
                       printable(f.key), " is ", f.R),
                f.where,
                "lora_A is [R*E, in] and lora_B [out, R*E], R from rank_pattern (else r); "
                "was the config replaced?");
  E = A.size(0) / f.R;
}

void add_module(PeftAdapter& adapter, const std::string& path, Tensor A, Tensor B,
                const std::string& where) {
  TIERMOE_CHECK(!adapter.modules.contains(path),
                "module " + printable(path) + " is stored both per expert and fused", where,
                "an adapter holds one layout of each layer's experts");
  adapter.modules[path] = {std::move(A), std::move(B)};
}

void convert_down(PeftAdapter& adapter, const std::string& experts, const FusedParam& f,
                  int64_t E) {
  const int64_t r = adapter.config.r;
  TIERMOE_CHECK(f.R == r,
                str_of("the fused down_proj adapter ", printable(f.key), " has rank ", f.R,
                       ", the adapter's r is ", r),
                f.where,
                "TierMoE's expert LoRA gives every module the same rank r; only gate_up_proj "
                "may be 2r (PEFT's fusion of gate_proj and up_proj)");
  for (int64_t e = 0; e < E; ++e) {
    Tensor A = f.w->A.rows(e * r, (e + 1) * r).clone(MemTag::weights);
    Tensor B = expert_columns(f.w->B, e, r, E, 0, 0, f.w->B.size(0));
    add_module(adapter, str_of(experts, ".", e, ".down_proj"), std::move(A), std::move(B), f.where);
  }
}

void convert_gate_up(PeftAdapter& adapter, const std::string& experts, const FusedParam& f,
                     int64_t E) {
  const int64_t r = adapter.config.r, R = f.R;
  const Tensor &A = f.w->A, &B = f.w->B;
  TIERMOE_CHECK(B.size(0) % 2 == 0,
                str_of("the fused gate_up_proj adapter's lora_B is ", B.str(),
                       "; its rows must be the 2F gate and up rows"),
                f.where, "gate_up_proj is [E, 2F, D]");
  const int64_t F = B.size(0) / 2;
  TIERMOE_CHECK(R == r || R == 2 * r,
                str_of("the fused gate_up_proj adapter ", printable(f.key), " has rank ", R,
                       "; TierMoE can read rank r (", r, ") or 2r (", 2 * r, ")"),
                f.where,
                "TierMoE's gate_proj and up_proj adapters have the adapter's rank r each: a "
                "fused rank of r shares one A, 2r stacks the two");
  for (int64_t e = 0; e < E; ++e) {
    Tensor A_e = A.rows(e * R, (e + 1) * R);
    if (R == r) {
      add_module(adapter, str_of(experts, ".", e, ".gate_proj"), A_e.clone(MemTag::weights),
                 expert_columns(B, e, r, E, 0, 0, F), f.where);
      add_module(adapter, str_of(experts, ".", e, ".up_proj"), A_e.clone(MemTag::weights),
                 expert_columns(B, e, r, E, 0, F, F), f.where);
      continue;
    }
    // Rank 2r: separable only when B_e is block-diagonal (gate rows read the
    // first r of the rank, up rows the last r).
    for (auto [rows0, col0, what] : {std::tuple{int64_t(0), r, "gate rows [0, F) on rank [r, 2r)"},
                                     std::tuple{F, int64_t(0), "up rows [F, 2F) on rank [0, r)"}}) {
      Tensor block = expert_columns(B, e, r, E, col0, rows0, F);
      double worst = 0;
      for (int64_t i = 0; i < block.numel(); ++i) worst = std::max(worst, std::abs(block.get(i)));
      TIERMOE_CHECK(worst == 0,
                    str_of("the fused gate_up_proj adapter ", printable(f.key), " (rank 2r = ", R,
                           ") couples gate and up: expert ", e, "'s lora_B has ", what, " up to |",
                           worst, "|"),
                    f.where,
                    "TierMoE adapts gate_proj and up_proj with separate rank-r factors, so it "
                    "reads a rank-2r gate_up adapter only in the block-diagonal form PEFT makes "
                    "from per-expert adapters; one trained on the fused layout has no exact "
                    "equivalent (merge it into the base weights with PEFT's merge_and_unload)");
    }
    add_module(adapter, str_of(experts, ".", e, ".gate_proj"),
               A_e.rows(0, r).clone(MemTag::weights), expert_columns(B, e, r, E, 0, 0, F), f.where);
    add_module(adapter, str_of(experts, ".", e, ".up_proj"), A_e.rows(r, R).clone(MemTag::weights),
               expert_columns(B, e, r, E, r, F, F), f.where);
  }
}

}  // namespace

PeftPatterns parse_peft_patterns(const Json& j, const std::string& path) {
  PeftPatterns p;
  auto present = [&](const char* key) { return j.contains(key) && !j.at(key).is_null(); };
  auto fail = [&](const char* key, const std::string& what, const std::string& hint) {
    throw Error(what, path + " key " + key, hint);
  };
  for (const char* key : {"rank_pattern", "alpha_pattern"}) {
    if (!present(key)) continue;
    const Json& m = j.at(key);
    if (!m.is_object()) fail(key, str_of(key, " must be an object"), "{\"pattern\": value}");
    for (const auto& [pattern, v] : m.items()) {
      parse_pattern(pattern, path + " key " + key);
      if (std::string_view(key) == "rank_pattern") {
        if (!v.is_number_integer() || v.get<int64_t>() <= 0) {
          fail(key, "rank_pattern value for " + printable(pattern) + " must be a positive integer",
               "ranks are positive integers");
        }
        p.rank.emplace_back(pattern, v.get<int64_t>());
      } else {
        if (!v.is_number() || !std::isfinite(v.get<double>())) {
          fail(key, "alpha_pattern value for " + printable(pattern) + " must be a finite number",
               "alphas are numbers");
        }
        p.alpha.emplace_back(pattern, v.get<double>());
      }
    }
  }
  if (present("target_parameters")) {
    const Json& t = j.at("target_parameters");
    if (!t.is_array()) {
      fail("target_parameters", "target_parameters must be a list of parameter names",
           "e.g. [\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\"]");
    }
    for (const Json& name : t) {
      if (!name.is_string() || name.get<std::string>().empty()) {
        fail("target_parameters", "target_parameters must be a list of parameter names",
             "e.g. [\"mlp.experts.gate_up_proj\", \"mlp.experts.down_proj\"]");
      }
      const std::string s = name.get<std::string>();
      const std::string leaf = s.substr(s.rfind('.') + 1);
      if (leaf != kFusedParams[0] && leaf != kFusedParams[1]) {
        fail("target_parameters",
             "target_parameters names " + printable(s) + ", which TierMoE cannot adapt",
             "TierMoE adapts the experts' fused gate_up_proj and down_proj parameters only "
             "(never the router)");
      }
      p.target_parameters.push_back(s);
    }
  }
  return p;
}

int64_t pattern_rank(const PeftPatterns& p, const PeftLoraConfig& c, const std::string& key,
                     const std::string& where) {
  return pattern_value(p.rank, c.r, key, "rank_pattern", where);
}

double pattern_alpha(const PeftPatterns& p, const PeftLoraConfig& c, const std::string& key,
                     const std::string& where) {
  return pattern_value(p.alpha, c.lora_alpha, key, "alpha_pattern", where);
}

bool is_fused_experts_path(const std::string& path) {
  std::string_view s = path;
  while (s.ends_with(kBaseLayer)) s.remove_suffix(std::string_view(kBaseLayer).size());
  return s.ends_with(kExperts);
}

void convert_fused_experts(PeftAdapter& adapter, const std::map<std::string, FusedLora>& fused,
                           const PeftPatterns& patterns, const std::string& where) {
  // Wrapper paths grouped by the experts module they wrap, by nesting depth.
  std::map<std::string, std::map<int64_t, std::string>> by_experts;
  for (const auto& [path, w] : fused) {
    std::string experts = path;
    int64_t depth = 0;
    while (experts.ends_with(kBaseLayer)) {
      experts.resize(experts.size() - std::string_view(kBaseLayer).size());
      ++depth;
    }
    by_experts[experts][depth] = path;
  }
  const PeftLoraConfig& c = adapter.config;
  const double scaling = lora_scaling(c.lora_alpha, c.r, c.use_rslora);
  std::set<std::string> targets(c.target_modules.begin(), c.target_modules.end());
  for (const auto& [experts, wrappers] : by_experts) {
    std::vector<std::string> params;
    for (const char* p : kFusedParams) {
      if (param_targeted(experts + "." + p, patterns.target_parameters)) params.push_back(p);
    }
    const std::string key_where = where + " key " + printable(kPeftKeyPrefix + experts);
    TIERMOE_CHECK(!params.empty(),
                  "fused expert LoRA weights at " + printable(experts) +
                      " but target_parameters names neither gate_up_proj nor down_proj",
                  key_where,
                  "adapter_config.json and the weights disagree; was the config replaced?");
    const int64_t n = int64_t(params.size());
    for (const auto& [depth, path] : wrappers) {
      TIERMOE_CHECK(depth < n,
                    str_of("unexpected wrapper ", printable(path), ": ", n,
                           " targeted parameter(s) nest ", n, " deep"),
                    where, "PEFT nests one wrapper per targeted parameter of the experts");
    }
    int64_t E = -1;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t depth = n - 1 - i;  // the first parameter is wrapped innermost
      std::string path = experts;
      for (int64_t d = 0; d < depth; ++d) path += kBaseLayer;
      const std::string key = experts + "." + params[i];
      const std::string pwhere = where + " key " + printable(kPeftKeyPrefix + path) + ".lora_A/B";
      auto it = wrappers.find(depth);
      TIERMOE_CHECK(it != wrappers.end(),
                    "target_parameters names " + printable(key) + " but the weights lack " +
                        printable(kPeftKeyPrefix + path + ".lora_A.weight"),
                    where, "every targeted parameter needs lora_A and lora_B");
      FusedParam f{params[i],
                   key,
                   pwhere,
                   &fused.at(path),
                   pattern_rank(patterns, c, key, pwhere),
                   pattern_alpha(patterns, c, key, pwhere)};
      int64_t experts_here = 0;
      check_factors(f, experts_here);
      TIERMOE_CHECK(E < 0 || E == experts_here,
                    str_of(printable(key), " holds ", experts_here, " experts, its sibling ", E),
                    pwhere, "both fused parameters of a layer hold every expert");
      E = experts_here;
      const double s = lora_scaling(f.alpha, f.R, c.use_rslora);
      TIERMOE_CHECK(s == scaling,
                    str_of("the fused ", f.param, " adapter ", printable(key), " scales by ", s,
                           " (alpha ", f.alpha, ", rank ", f.R, c.use_rslora ? ", rslora" : "",
                           "), the adapter's modules by ", scaling),
                    pwhere,
                    "TierMoE's expert LoRA has one scaling; with use_rslora PEFT's fusion to rank "
                    "2r changes it, so such adapters cannot be read exactly");
      if (f.param == kFusedParams[0]) {
        convert_gate_up(adapter, experts, f, E);
        targets.insert({"gate_proj", "up_proj"});
      } else {
        convert_down(adapter, experts, f, E);
        targets.insert("down_proj");
      }
    }
  }
  adapter.config.target_modules.assign(targets.begin(), targets.end());
}

}  // namespace tiermoe::detail
