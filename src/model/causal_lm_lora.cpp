// CausalLM: remat and absorption options for the MoE blocks, and LoRA over
// the whole model (enable, parameters, PEFT export and import).
#include <algorithm>
#include <cstring>
#include <map>

#include "tiermoe/model/causal_lm.h"
#include "tiermoe/model/checkpoint.h"

namespace tiermoe {

using detail::str_of;

void CausalLM::set_moe_options(const RematPolicy& remat, AbsorbScores absorb) {
  for (auto& layer : layers_) {
    if (MoeBlock* moe = layer->moe()) moe->set_moe_options(absorb, remat.moe_keep());
    if (SharedExpert* shared = layer->shared_expert()) {
      shared->set_keep(remat.saves(MoeRegion::shared));
    }
  }
  remat_ = remat;
  absorb_ = absorb;
}

// Views of one adapted module's A and B and their grads.
struct CausalLM::LoraModule {
  std::string path;  // HF module path, "model.layers.0.self_attn.q_proj"
  HfRole role;
  Tensor A_RI, B_OR, dA_RI, dB_OR;
  int64_t expert = -1;  // a routed expert's adapter: the expert
};

std::vector<CausalLM::LoraModule> CausalLM::lora_modules() const {
  std::vector<LoraModule> out;
  for (const auto& layer : layers_) {
    for (LoraAdapter* a : layer->lora_adapters()) {
      const bool attention = a->name().starts_with(layer->attention_name() + ".");
      HfRole role = attention ? HfRole::attention : HfRole::dense_mlp;
      out.push_back({a->name(), role, a->A_RI, a->B_OR, a->dA_RI, a->dB_OR, -1});
    }
    MoeBlock* moe = layer->moe();
    ExpertLora* ex = moe ? moe->lora() : nullptr;
    if (!ex) continue;
    for (int64_t e = 0; e < ex->num_experts(); ++e) {
      for (ExpertProj p : ex->projections()) {
        out.push_back({ex->module_path(p, e), HfRole::expert, ex->A(p).select(e),
                       ex->B(p).select(e), ex->dA(p).select(e), ex->dB(p).select(e),
                       ex->first_expert() + e});
      }
    }
  }
  return out;
}

void CausalLM::enable_lora(const LoraConfig& cfg, uint64_t seed) {
  const std::string where = "CausalLM::enable_lora";
  TIERMOE_CHECK(!lora_, "LoRA is already enabled", where,
                "enable it once; load_lora_adapter fills an enabled model's adapters");
  cfg.validate(where);
  const bool expert_targets = cfg.targets.contains("gate_proj") ||
                              cfg.targets.contains("up_proj") || cfg.targets.contains("down_proj");
  TIERMOE_CHECK(
      !expert_targets || config_.spec().expert_lora,
      str_of(config_.spec().architecture, "'s experts (", config_.spec().expert_projections[0],
             ", ", config_.spec().expert_projections[1], ", ", config_.spec().expert_projections[2],
             ") cannot be LoRA targets"),
      where, "target the attention projections (q_proj, k_proj, v_proj, o_proj)");
  set_requires_grad_all(false);
  Rng rng(seed);
  for (auto& layer : layers_) layer->enable_lora(cfg, rng);
  lora_ = cfg;
  std::string attention;
  for (const std::string& t : lora_default_targets(config_)) {
    attention += (attention.empty() ? "" : ", ") + t;
  }
  const std::string hint = "this model's attention projections are " + attention +
                           "; its MLPs' are gate_proj, up_proj, down_proj";
  const std::vector<LoraModule> modules = lora_modules();
  TIERMOE_CHECK(!modules.empty(), "no module of this model matches the LoRA targets", where, hint);
  // Each target names a module of this model (PEFT's suffix rule): a name
  // another family uses would otherwise adapt nothing and still be exported.
  for (const std::string& t : cfg.targets) {
    const bool hit = std::any_of(modules.begin(), modules.end(),
                                 [&](const LoraModule& m) { return m.path.ends_with("." + t); });
    TIERMOE_CHECK(
        hit,
        str_of("LoRA target '", t, "' matches no module of this ", config_.model_type, " model"),
        where, hint);
  }
}

const LoraConfig& CausalLM::lora_config() const {
  TIERMOE_CHECK(lora_.has_value(), "LoRA is not enabled", "CausalLM::lora_config",
                "call enable_lora (or load_lora_adapter) first");
  return *lora_;
}

std::vector<ModelParam> CausalLM::lora_params() {
  std::vector<ModelParam> out;
  for (LoraModule& m : lora_modules()) {
    out.push_back({m.path + ".lora_A.weight", m.role, m.A_RI, m.dA_RI, true, m.expert});
    out.push_back({m.path + ".lora_B.weight", m.role, m.B_OR, m.dB_OR, true, m.expert});
  }
  return out;
}

PeftLoraModules CausalLM::gather_lora_modules() const {
  PeftLoraModules modules;
  std::vector<LoraModule> held = lora_modules();
  std::vector<const LoraModule*> experts;  // this rank's routed experts' adapters, in order
  for (const LoraModule& m : held) {
    if (m.expert >= 0 && ep_ranks() > 1) {
      experts.push_back(&m);
    } else {
      modules[m.path] = {m.A_RI, m.B_OR};
    }
  }
  if (experts.empty()) return modules;
  // Every rank holds the same adapters for its own experts (same shapes, in
  // the same order), so one allgather of their values brings all of them.
  size_t bytes = 0;
  for (const LoraModule* m : experts) bytes += m->A_RI.nbytes() + m->B_OR.nbytes();
  std::vector<char> mine(bytes), all(bytes * size_t(ep_ranks()));
  size_t at = 0;
  for (const LoraModule* m : experts) {
    for (const Tensor* t : {&m->A_RI, &m->B_OR}) {
      std::memcpy(mine.data() + at, t->raw(), t->nbytes());
      at += t->nbytes();
    }
  }
  comm_->allgather(mine.data(), bytes, all.data(), "the experts' LoRA adapters");
  for (int r = 0; r < ep_ranks(); ++r) {
    at = size_t(r) * bytes;
    for (const LoraModule* m : experts) {
      // Rank r's copy of this module is the same module path at expert
      // e + (r - rank) * El.
      const int64_t e = m->expert + (r - dispatcher_->rank()) * local_experts();
      std::string path = m->path;
      const std::string from = ".experts." + std::to_string(m->expert) + ".";
      path.replace(path.find(from), from.size(), ".experts." + std::to_string(e) + ".");
      PeftLoraWeights w{m->A_RI.clone(), m->B_OR.clone()};
      for (Tensor* t : {&w.A_RI, &w.B_OR}) {
        std::memcpy(t->raw(), all.data() + at, t->nbytes());
        at += t->nbytes();
      }
      modules[path] = std::move(w);
    }
  }
  return modules;
}

void CausalLM::save_lora_adapter(const std::string& dir, DType storage,
                                 const std::string& base_model_name_or_path) const {
  const LoraConfig& cfg = lora_config();
  save_peft_adapter(dir, to_peft_config(cfg, base_model_name_or_path), gather_lora_modules(),
                    storage);
}

namespace {

// Checks that the enabled LoRA is the one the adapter was trained with.
void check_same_lora(const LoraConfig& have, const LoraConfig& file, const std::string& where) {
  auto targets_text = [](const std::set<std::string>& t) {
    std::string s;
    for (const std::string& n : t) s += (s.empty() ? "" : ",") + n;
    return s;
  };
  const std::string hint =
      "load the adapter into a model without LoRA enabled (it then takes "
      "the adapter's config), or enable LoRA with the adapter's settings";
  TIERMOE_CHECK(have.rank == file.rank,
                str_of("adapter r ", file.rank, " differs from the enabled LoRA rank ", have.rank),
                where, hint);
  TIERMOE_CHECK(have.alpha == file.alpha,
                str_of("adapter lora_alpha ", file.alpha, " differs from the enabled ", have.alpha),
                where, hint);
  TIERMOE_CHECK(
      have.rslora == file.rslora,
      str_of("adapter use_rslora ", file.rslora, " differs from the enabled ", have.rslora), where,
      hint);
  TIERMOE_CHECK(have.targets == file.targets,
                "adapter target_modules " + targets_text(file.targets) +
                    " differ from the enabled " + targets_text(have.targets),
                where, hint);
  TIERMOE_CHECK(have.layers == file.layers,
                str_of("adapter layers_to_transform (", file.layers.size(),
                       " layers) differs from the enabled (", have.layers.size(), ")"),
                where, hint);
}

}  // namespace

void CausalLM::load_lora_adapter(const std::string& dir) {
  PeftAdapter adapter = load_peft_adapter(dir);
  const std::string config_file = dir + "/" + kPeftConfigFile;
  const std::string weights_file = dir + "/" + kPeftWeightsFile;
  LoraConfig file_cfg = from_peft_config(adapter.config, config_file);
  if (lora_) {
    check_same_lora(*lora_, file_cfg, config_file);
  } else {
    enable_lora(file_cfg, /*seed=*/0);  // every A is overwritten below
  }

  std::vector<LoraModule> modules = lora_modules();
  std::map<std::string, const LoraModule*> by_path;
  for (const LoraModule& m : modules) by_path[m.path] = &m;
  const std::string hint =
      "the adapter was trained for a model with other layers, experts or sizes; check "
      "base_model_name_or_path in adapter_config.json against --model";
  for (const auto& [path, w] : adapter.modules) {
    // Another rank's expert: its owner loads it.
    const int64_t e = hf_expert_index(path);
    if (e >= 0 && e < config_.num_experts && !holds_expert(e)) continue;
    TIERMOE_CHECK(
        by_path.contains(path),
        "adapter module '" + std::string(kPeftKeyPrefix) + path + "' names no module of this model",
        weights_file, hint);
    const LoraModule& m = *by_path.at(path);
    for (auto [got, want, suffix] : {std::tuple{&w.A_RI, &m.A_RI, ".lora_A.weight"},
                                     std::tuple{&w.B_OR, &m.B_OR, ".lora_B.weight"}}) {
      TIERMOE_CHECK(got->shape() == want->shape(),
                    str_of(kPeftKeyPrefix, path, suffix, " is ", got->str(), ", the model's is ",
                           want->str()),
                    weights_file, hint);
      // Loaded as it is, it would surface steps later as "training diverged".
      const int64_t bad = first_non_finite(*got);
      TIERMOE_CHECK(bad < 0,
                    str_of(kPeftKeyPrefix, path, suffix, " holds ", bad < 0 ? 0.0 : got->get(bad),
                           " (element ", bad, ")"),
                    weights_file, "the adapter is damaged; load an earlier one");
    }
  }
  for (const LoraModule& m : modules) {
    TIERMOE_CHECK(adapter.modules.contains(m.path),
                  "the adapter lacks '" + std::string(kPeftKeyPrefix) + m.path +
                      ".lora_A.weight' / '.lora_B.weight'",
                  weights_file, "an adapter must hold every module its target_modules match");
  }
  for (LoraModule& m : modules) {
    const PeftLoraWeights& w = adapter.modules.at(m.path);
    m.A_RI.copy_from(w.A_RI);
    m.B_OR.copy_from(w.B_OR);
  }
}

}  // namespace tiermoe
