#pragma once
// The MoE layer rig (tests/moe) with a remat policy.
#include "moe/moe_layer_rig.h"
#include "tiermoe/remat/policy.h"

namespace tiermoe::testing {

inline MoeLayer remat_layer(LayerRig& rig, AbsorbScores absorb, const Dispatcher& d,
                            const RematPolicy& policy, MemoryTracker* tracker = nullptr) {
  MoeLayerConfig c;
  c.absorb_scores = absorb;
  c.tracker = tracker;
  c.keep = policy.moe_keep();
  return MoeLayer(c, rig.router.get(), d, *rig.host);
}

}  // namespace tiermoe::testing
