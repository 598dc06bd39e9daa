#include "tiermoe/moe/regions.h"

namespace tiermoe {

std::string_view moe_region_name(MoeRegion r) {
  switch (r) {
    case MoeRegion::router: return "router";
    case MoeRegion::dispatch: return "dispatch";
    case MoeRegion::w13: return "w13";
    case MoeRegion::act: return "act";
    case MoeRegion::w2: return "w2";
    case MoeRegion::combine: return "combine";
    case MoeRegion::shared: return "shared";
  }
  __builtin_unreachable();
}

bool moe_region_replayable(MoeRegion r) {
  return r != MoeRegion::router && r != MoeRegion::combine;
}

MoeRematPlan MoeRematPlan::make(const MoeRegionKeep& keep, bool absorbed, bool weight_grads,
                                bool post_norm, ExpertAdapted adapted) {
  // What the experts' own backward reads, then what each replay reads as its
  // input, walking up the chain dispatch -> w13 -> act -> w2: a region is
  // replayed when one of its outputs is read and it did not keep it.
  const bool read_x = weight_grads || adapted.w13;              // dW13, gate/up dA
  const bool read_h = true;                                     // the activation backward
  const bool read_a = weight_grads || absorbed || adapted.w2;   // dW2, d score, down dA
  const bool read_w2 = post_norm;                               // the postprocess backward
  const bool read_lora_w2 = adapted.w2;                         // down dB

  MoeRematPlan p;
  p.routed_replay.w2 = (read_w2 || read_lora_w2) && !keep[MoeRegion::w2];
  const bool need_a = read_a || p.routed_replay.w2;
  p.routed_replay.act = need_a && !keep[MoeRegion::act];
  const bool need_h = read_h || p.routed_replay.act;
  p.routed_replay.w13 = need_h && !keep[MoeRegion::w13];
  const bool need_x = read_x || p.routed_replay.w13;
  p.replay_dispatch = need_x && !keep[MoeRegion::dispatch];

  p.routed_keep.x = need_x && keep[MoeRegion::dispatch];
  p.routed_keep.h = need_h && keep[MoeRegion::w13];
  p.routed_keep.a = need_a && keep[MoeRegion::act];
  p.routed_keep.w2 = read_w2 && keep[MoeRegion::w2];
  p.routed_keep.lora_w13 = adapted.w13 && keep[MoeRegion::w13];
  p.routed_keep.lora_w2 = read_lora_w2 && keep[MoeRegion::w2];
  return p;
}

bool MoeRematPlan::replays(MoeRegion r) const {
  switch (r) {
    case MoeRegion::dispatch: return replay_dispatch;
    case MoeRegion::w13: return routed_replay.w13;
    case MoeRegion::act: return routed_replay.act;
    case MoeRegion::w2: return routed_replay.w2;
    case MoeRegion::shared:  // the model's SharedExpert reads it, not this plan
    case MoeRegion::router:
    case MoeRegion::combine: return false;
  }
  __builtin_unreachable();
}

}  // namespace tiermoe
