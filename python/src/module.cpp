// tiermoe._core: the engine's MoE block for Python. Only what tiermoe/_ops.py
// needs: the op, its saved state, thread control and two introspection
// helpers the tests use. Engine errors arrive as tiermoe.TierMoEError.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "dlpack_tensor.h"
#include "moe_op.h"
#include "tiermoe/core/parallel.h"
#include "tiermoe/remat/policy.h"
#include "tiermoe/train/metrics.h"
#include "tiermoe/train/tier_session.h"

namespace nb = nanobind;
using namespace nb::literals;
using tiermoe::DType;
using tiermoe::MoeSaved;
using tiermoe::Tensor;
using tiermoe::py::Array;
using tiermoe::py::MoeOp;
using tiermoe::py::MoeOpConfig;
using tiermoe::py::to_array;
using tiermoe::py::view_of;

namespace {

MoeOpConfig op_config(int64_t num_experts, int64_t hidden, int64_t ffn, const std::string& activation,
                      double alpha, double limit, bool bias, const std::string& dtype,
                      const std::string& absorb, const std::string& remat,
                      const std::string& name, const std::optional<std::string>& router, int64_t top_k, bool norm_topk_prob,
                      int64_t n_group, int64_t topk_group, double routed_scaling_factor) {
  MoeOpConfig c;
  c.name = name;
  c.experts.num_experts = num_experts;
  c.experts.hidden = hidden;
  c.experts.ffn = ffn;
  if (activation == "gpt_oss") {
    c.experts.activation = tiermoe::ExpertActivation::gpt_oss;
    c.experts.gpt_oss = {alpha, limit};
  } else {
    TIERMOE_CHECK(activation == "swiglu", "unknown expert activation '" + activation + "'", name,
                  "TierMoE runs SwiGLU experts (silu) and gpt-oss's clamped GLU");
  }
  c.experts.bias = bias;
  c.experts.validate(name);
  c.dtype = tiermoe::parse_dtype(dtype, name);
  c.absorb = tiermoe::parse_absorb_scores(absorb, "absorb_scores");
  c.keep = tiermoe::RematPolicy::parse(remat, "remat").moe_keep();
  if (router) {
    c.routes = true;
    c.router.kind = *router == "deepseek_v3"   ? tiermoe::RouterKind::deepseek_v3
                    : *router == "deepseek_v2" ? tiermoe::RouterKind::deepseek_v2
                    : *router == "gpt_oss"     ? tiermoe::RouterKind::gpt_oss
                                               : tiermoe::RouterKind::softmax_topk;
    TIERMOE_CHECK(*router == "softmax_topk" || c.router.kind != tiermoe::RouterKind::softmax_topk,
                  "unknown router kind '" + *router + "'", name,
                  "softmax_topk, deepseek_v3, deepseek_v2 or gpt_oss");
    c.router.hidden = hidden;
    c.router.num_experts = num_experts;
    c.router.top_k = top_k;
    c.router.norm_topk_prob = norm_topk_prob;
    c.router.n_group = n_group;
    c.router.topk_group = topk_group;
    c.router.routed_scaling_factor = routed_scaling_factor;
    c.router.validate(name);
  }
  return c;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "TierMoE's engine: the MoE block over DLPack tensors (use tiermoe.transformers or tiermoe.torch)";
  m.attr("__version__") = TIERMOE_VERSION;
  nb::exception<tiermoe::Error>(m, "TierMoEError", PyExc_RuntimeError);
  // Engines live as long as the modules they serve, often until interpreter exit, which
  // nanobind would report as leaks.
  nb::set_leak_warnings(false);

  m.def("set_num_threads", &tiermoe::set_num_threads, "n"_a,
        "The engine's threads for calls from this thread (<= 0: every core).");
  m.def("num_threads", &tiermoe::num_threads);
  // Where the engine's view of `a` points: equal to the tensor's data_ptr()
  // when no copy was made.
  m.def("view_address", [](const Array& a) { return uintptr_t(view_of(a, "a").raw()); },
        "a"_a.noconvert());
  // `a` into the engine and straight back out: the result shares a's memory.
  m.def("round_trip", [](const Array& a) { return to_array(view_of(a, "a")); }, "a"_a.noconvert());

  nb::class_<MoeSaved>(m, "MoeSaved", "What one forward keeps for its backward (opaque).")
      .def(nb::init<>())
      .def_prop_ro("bytes", &MoeSaved::bytes)
      .def_prop_ro("absorbed", [](const MoeSaved& s) { return s.absorbed; });

  nb::class_<MoeOp>(m, "MoeOp")
      .def("__init__",
           [](MoeOp* self, int64_t num_experts, int64_t hidden, int64_t ffn,
              const std::string& activation, double alpha, double limit, bool bias,
              const std::string& dtype, const std::string& absorb, const std::string& remat,
              const std::string& name,
              const std::optional<std::string>& router, int64_t top_k, bool norm_topk_prob,
              int64_t n_group, int64_t topk_group, double routed_scaling_factor) {
             new (self) MoeOp(op_config(num_experts, hidden, ffn, activation, alpha, limit, bias,
                                        dtype, absorb, remat, name, router, top_k, norm_topk_prob,
                                        n_group, topk_group, routed_scaling_factor));
           },
           nb::kw_only(), "num_experts"_a, "hidden"_a, "ffn"_a, "activation"_a = "swiglu",
           "alpha"_a = 1.702, "limit"_a = 7.0, "bias"_a = false, "dtype"_a, "absorb"_a = "auto",
           "remat"_a = "none", "name"_a = "moe", "router"_a = nb::none(), "top_k"_a = 0, "norm_topk_prob"_a = false,
           "n_group"_a = 1, "topk_group"_a = 1, "routed_scaling_factor"_a = 1.0)
      .def_prop_ro("absorbs_scores", &MoeOp::absorbs_scores)
      .def("bind_experts",
           [](MoeOp& op, const Array& w13, const Array& w2, const std::optional<Array>& b13,
              const std::optional<Array>& b2) {
             const std::string& n = op.config().name;
             op.bind_experts(view_of(w13, n + ": w13"), view_of(w2, n + ": w2"),
                             view_of(b13, n + ": b13"), view_of(b2, n + ": b2"));
           },
           "w13"_a.noconvert(), "w2"_a.noconvert(), "b13"_a.noconvert() = nb::none(),
           "b2"_a.noconvert() = nb::none())
      .def("bind_router",
           [](MoeOp& op, const Array& weight, const std::optional<Array>& bias,
              const std::optional<Array>& selection_bias) {
             const std::string& n = op.config().name;
             op.bind_router(view_of(weight, n + ": router weight"),
                            view_of(bias, n + ": router bias"),
                            view_of(selection_bias, n + ": e_score_correction_bias"));
           },
           "weight"_a.noconvert(), "bias"_a.noconvert() = nb::none(),
           "selection_bias"_a.noconvert() = nb::none())
      .def_prop_ro("lora_rank", &MoeOp::lora_rank)
      .def("set_lora", &MoeOp::set_lora, "rank"_a, "w13"_a, "w2"_a)
      .def("bind_lora",
           [](MoeOp& op, const std::string& proj, const Array& A, const Array& B) {
             const std::string n = op.config().name + ": lora " + proj;
             op.bind_lora(proj, view_of(A, n + " A"), view_of(B, n + " B"));
           },
           "proj"_a, "A"_a.noconvert(), "B"_a.noconvert())
      .def("forward_routed",
           [](MoeOp& op, MoeSaved& saved, const Array& x, const Array& ids, const Array& weights,
              bool expert_grads, bool adapter_grads) {
             const std::string& n = op.config().name;
             Tensor xt = view_of(x, n + ": hidden_states");
             auto id = tiermoe::py::ids_of(ids, n + ": top_k_index");
             Tensor w = view_of(weights, n + ": top_k_weights");
             Tensor out;
             {
               nb::gil_scoped_release quiet;
               out = op.forward_routed(saved, xt, std::move(id), w, expert_grads, adapter_grads);
             }
             return to_array(out);
           },
           "saved"_a, "x"_a.noconvert(), "ids"_a.noconvert(), "weights"_a.noconvert(),
           "expert_grads"_a, "adapter_grads"_a = false)
      .def("forward",
           [](MoeOp& op, MoeSaved& saved, const Array& x, bool expert_grads, bool adapter_grads) {
             Tensor xt = view_of(x, op.config().name + ": hidden_states");
             Tensor out, logits;
             {
               nb::gil_scoped_release quiet;
               out = op.forward(saved, logits, xt, expert_grads, adapter_grads);
             }
             return std::make_pair(to_array(out), to_array(logits));
           },
           "saved"_a, "x"_a.noconvert(), "expert_grads"_a, "adapter_grads"_a = false)
      .def("backward",
           [](MoeOp& op, MoeSaved& saved, const Array& dout, const std::optional<Array>& dlogits) {
             const std::string& n = op.config().name;
             Tensor d = view_of(dout, n + ": grad_output");
             Tensor dl = view_of(dlogits, n + ": router logits' grad");
             Tensor dx = Tensor::empty(d.shape(), d.dtype());
             Tensor dweights;
             {
               nb::gil_scoped_release quiet;
               dweights = op.backward(dx, d, saved, dl);
             }
             return std::make_pair(to_array(dx), to_array(dweights));
           },
           "saved"_a, "dout"_a.noconvert(), "dlogits"_a.noconvert() = nb::none())
      // A copy: the engine reuses its gradient buffers in the next backward.
      .def("grad", [](MoeOp& op, const std::string& name) { return to_array(op.grad(name).clone()); },
           "name"_a)
      .def("attach_tier", [](MoeOp& op, tiermoe::TierSession& tier, int64_t layer) {
             op.attach_tier(tier.tier(), layer);
           }, "tier"_a, "layer"_a, nb::keep_alive<1, 2>())
      .def("pack_stats", [](const MoeOp& op) {
        const tiermoe::ExpertPackStats s = op.pack_stats();
        nb::dict d;
        d["packs"] = s.packs;
        d["seconds"] = s.seconds;
        d["bytes"] = s.bytes;
        return d;
      });

  // The device tier of one model's MoE ops: `tiermoe train --device`'s
  // TierSession, built for the ops' shapes; its step figures leave as the
  // JSON of train's --metrics ("tier"), which the Python side parses.
  nb::class_<tiermoe::TierSession>(m, "TierSession", "The device tier of one model's MoE ops.")
      .def("__init__",
           [](tiermoe::TierSession* self, const std::string& device, uint64_t memory,
              const std::string& placement, bool full, int64_t hidden, int64_t ffn,
              const std::string& dtype, bool bias, const std::string& activation, bool absorb,
              int64_t layers, int64_t experts, const std::string& profile_in,
              const std::optional<std::vector<double>>& rates) {
             tiermoe::TierRunConfig c;
             c.device = device;
             c.device_memory = memory;
             c.placement = placement;
             c.profile_in = profile_in;
             if (rates) {  // host flop/s, device flop/s, link byte/s, launch s
               TIERMOE_CHECK(rates->size() == 4,
                             "rates are (host flop/s, device flop/s, link byte/s, launch s)",
                             "rates", "");
               tiermoe::CostModel cost;
               cost.host_flops_per_s = (*rates)[0];
               cost.device_flops_per_s = (*rates)[1];
               cost.link_bytes_per_s = (*rates)[2];
               cost.launch_s = (*rates)[3];
               cost.buckets = tiermoe::bucket_ladder(16, tiermoe::ExpertsConfig{}.dw_row_block);
               cost.validate("rates");
               c.cost = cost;
             }
             tiermoe::ExpertShape shape;
             shape.D = hidden;
             shape.F = ffn;
             shape.dtype = tiermoe::parse_dtype(dtype, "dtype");
             shape.bias = bias;
             shape.activation = activation == "gpt_oss" ? tiermoe::ExpertActivation::gpt_oss
                                                         : tiermoe::ExpertActivation::swiglu;
             shape.absorb = absorb;
             new (self) tiermoe::TierSession(c, shape, layers, experts, full, nullptr);
           },
           nb::kw_only(), "device"_a, "memory"_a, "placement"_a = "auto", "full"_a = false,
           "hidden"_a, "ffn"_a, "dtype"_a, "bias"_a = false, "activation"_a = "swiglu",
           "absorb"_a = true, "layers"_a, "experts"_a, "profile_in"_a = "",
           "rates"_a = nb::none())
      .def("begin_step", [](tiermoe::TierSession& t) { t.tier().begin_step(); })
      .def("end_step", [](tiermoe::TierSession& t, bool weights_changed) {
             const tiermoe::TierStepStats s = t.tier().end_step(weights_changed);
             t.record(s);
             return tiermoe::tier_step_json(s).dump();
           }, "weights_changed"_a)
      .def("totals", [](const tiermoe::TierSession& t) { return t.summary_json().dump(); })
      .def("save_profile", [](tiermoe::TierSession& t, const std::string& path) {
             t.tier().profile().save(path);
           }, "path"_a)
      .def("resident_experts", [](tiermoe::TierSession& t) {
        std::vector<std::vector<int64_t>> ids;
        for (const auto& layer : t.tier().placement().resident) {
          ids.emplace_back();
          for (size_t e = 0; e < layer.size(); ++e)
            if (layer[e]) ids.back().push_back(int64_t(e));
        }
        return ids;
      });
}
