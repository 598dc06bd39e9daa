#pragma once
// RematPolicy: per named region, whether a forward keeps the region's outputs
// for backward or backward rebuilds them by replaying the region from its
// inputs. Loss and gradients are bitwise the same under every policy; only
// memory and recompute change.
//
// A policy names region kinds, the part of a region's name after the layer
// ("w13" covers model.layers.3.mlp.w13 and every other layer's w13):
//
//   kind       layer  replayable  notes
//   router     MoE    never       the routing decision: x_TD, logits, probs, weights
//   dispatch   MoE    yes         x_ND, the gathered rows (a collective under EP)
//   w13        MoE    yes         h_N2F = x . W13^T
//   act        MoE    yes         a_NF = act(h)
//   w2         MoE    yes         keeps nothing unless a post-expert norm reads its output
//   combine    MoE    never       keeps the permutation (+ scores and y_ND when not absorbed)
//   shared     MoE    yes         the shared experts' MLP
//   attention  model  yes         (consulted by the model module)
//   norm       model  yes         RMSNorms (consulted by the model module)
//   mlp        model  yes         dense MLP layers (consulted by the model module)
//
// moe/regions.h says what each MoE region's outputs are and who reads them.
//
// Policies (the text form is what --remat takes):
//   none          keep every region's outputs (no remat)
//   full          replay every replayable region
//   default       keep w13, act, w2, shared, attention, mlp; replay dispatch and norm.
//                 Per routed row at Qwen3-30B-A3B shapes (D 2048, F 768) the
//                 expert path holds x_ND 2048, h 1536 and a 768 values. x_ND is
//                 the largest and the cheapest to rebuild (a row gather, no
//                 GEMM; it is only read by dW13), while rebuilding h or a would
//                 re-run the W13 GEMM, 2/3 of the expert forward's FLOPs. So
//                 default drops 45% of the expert-path bytes for a copy. Norms
//                 are elementwise and cheap to replay; attention and the dense
//                 MLP are GEMM-heavy and kept.
//   save-w2-only  keep only w2 (with absorbed scores it keeps nothing: the
//                 W2 output has no backward reader, so it is freed anyway)
//   save:A,B,...  keep the listed kinds, replay every other replayable one
//
// router and combine are never replayed under any policy; naming them in a
// save list is allowed and changes nothing.
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "tiermoe/moe/regions.h"

namespace tiermoe {

struct RematRegionKind {
  std::string_view name;
  bool replayable;
  bool in_default;  // kept by the default policy
};
// Every region kind a policy may name, in the order above.
const std::vector<RematRegionKind>& remat_region_kinds();
// "router, dispatch, w13, act, w2, combine, shared, attention, norm, mlp"
std::string remat_region_names();

class RematPolicy {
 public:
  // none | full | default | save-w2-only | save:<kind>,<kind>,... ; an unknown
  // policy or region kind is an Error that lists the valid ones.
  static RematPolicy parse(std::string_view text, std::string_view where = "--remat");
  static RematPolicy none() { return parse("none"); }
  static RematPolicy full() { return parse("full"); }

  RematPolicy() : RematPolicy(none()) {}

  // The canonical text: "none", "full", "default", "save-w2-only", or
  // "save:" and the saved kinds in table order.
  const std::string& name() const { return name_; }
  // True when the region keeps its outputs (always for router and combine).
  // Takes a kind or a full region name ("model.layers.3.mlp.w13"); an unknown
  // kind is an Error listing the valid ones.
  bool saves(std::string_view region) const;
  bool saves(MoeRegion r) const { return saves(moe_region_name(r)); }
  // The MoE layer's view of this policy (MoeLayerConfig::keep).
  MoeRegionKeep moe_keep() const;

 private:
  RematPolicy(std::string name, std::vector<bool> keep)
      : name_(std::move(name)), keep_(std::move(keep)) {}
  std::string name_;
  std::vector<bool> keep_;  // per remat_region_kinds() entry
};

}  // namespace tiermoe
