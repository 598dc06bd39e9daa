#include "tiermoe/tier/cost_model.h"

#include <algorithm>
#include <cmath>

#include "tiermoe/core/error.h"

namespace tiermoe {

using detail::str_of;

std::string_view train_mode_name(TrainMode m) { return m == TrainMode::lora ? "lora" : "full"; }

TrainMode parse_train_mode(std::string_view s, std::string_view where) {
  if (s == "lora") return TrainMode::lora;
  if (s == "full") return TrainMode::full;
  throw Error(str_of("unknown training mode '", s, "'"), std::string(where),
              "lora (frozen experts: forward and dx) or full (experts trained: dW too)");
}

void CostModel::validate(std::string_view where) const {
  const std::string at(where);
  auto positive = [&](double v, const char* name) {
    TIERMOE_CHECK(std::isfinite(v) && v > 0, str_of("cost model ", name, " is ", v), at,
                  "rates come from measure_host / measure_device or the command line, and are > 0");
  };
  positive(host_flops_per_s, "host_flops_per_s");
  positive(device_flops_per_s, "device_flops_per_s");
  positive(link_bytes_per_s, "link_bytes_per_s");
  TIERMOE_CHECK(std::isfinite(launch_s) && launch_s >= 0,
                str_of("cost model launch_s is ", launch_s), at,
                "the launch overhead is a time >= 0");
  TIERMOE_CHECK(!buckets.empty() && buckets.front() > 0 &&
                    std::is_sorted(buckets.begin(), buckets.end()) &&
                    std::adjacent_find(buckets.begin(), buckets.end()) == buckets.end(),
                "cost model buckets must be positive and strictly ascending", at,
                "use bucket_ladder(16, 512)");
}

std::vector<int64_t> bucket_ladder(int64_t smallest, int64_t largest) {
  TIERMOE_CHECK(smallest > 0 && smallest <= largest,
                str_of("bucket ladder from ", smallest, " to ", largest), "bucket_ladder",
                "the smallest bucket is positive and at most the largest");
  // Doubling steps with a midpoint (1.5x) between each pair: a group lands in
  // a bucket at most a third larger than it, not twice as large, for twice
  // the graphs (each compiled once).
  std::vector<int64_t> out;
  for (int64_t g = smallest; g < largest; g *= 2) {
    out.push_back(g);
    const int64_t mid = g + g / 2;
    if (g % 2 == 0 && mid < largest) out.push_back(mid);
  }
  out.push_back(largest);
  return out;
}

GraphKey expert_graph_key(GraphKind kind, const ExpertShape& s, int64_t G) {
  GraphKey k;
  k.kind = kind;
  k.D = s.D;
  k.F = s.F;
  k.G = G;
  k.dtype = s.dtype;
  k.activation = s.activation;
  k.absorb = s.absorb;
  k.bias = s.bias;
  k.quant = s.quant;
  return k;
}

GraphKind backward_graph_kind(TrainMode m) {
  return m == TrainMode::lora ? GraphKind::expert_bwd_dx : GraphKind::expert_bwd_dx_dw;
}

double flops_per_row(const ExpertShape& s, TrainMode m) {
  const double pass = 6.0 * double(s.D) * double(s.F);
  return m == TrainMode::lora ? 2 * pass : 3 * pass;
}

std::vector<int64_t> padded_launches(int64_t M, const std::vector<int64_t>& buckets) {
  TIERMOE_ASSERT(M >= 0 && !buckets.empty());
  const int64_t g_max = buckets.back();
  std::vector<int64_t> out(size_t(M / g_max), g_max);
  const int64_t rest = M % g_max;
  if (rest > 0) out.push_back(*std::lower_bound(buckets.begin(), buckets.end(), rest));
  return out;
}

double host_seconds(double rows, const ExpertShape& s, TrainMode m, const CostModel& c) {
  return rows * flops_per_row(s, m) / c.host_flops_per_s;
}

double device_seconds(int64_t M, const ExpertShape& s, TrainMode m, const CostModel& c) {
  TIERMOE_ASSERT(M >= 0 && !c.buckets.empty());
  // padded_launches' launches, counted rather than listed: the planner asks
  // this for every expert and candidate, and M may be a profile's millions.
  const auto launch = [&](int64_t G) {
    return double(G) * flops_per_row(s, m) / c.device_flops_per_s + 2 * c.launch_s;
  };
  const int64_t g_max = c.buckets.back(), rest = M % g_max;
  double t = double(M / g_max) * launch(g_max);
  if (rest > 0) t += launch(*std::lower_bound(c.buckets.begin(), c.buckets.end(), rest));
  return t;
}

size_t row_bytes_up(const ExpertShape& s, TrainMode m) {
  const size_t dt = dtype_size(s.dtype), st = dtype_size(s.score_dtype());
  const size_t D = size_t(s.D), F = size_t(s.F);
  const bool full = m == TrainMode::full;
  size_t fwd = D * dt + (s.absorb ? st : 0);
  size_t bwd = (D + 2 * F) * dt + ((s.absorb || full) ? F * dt : 0) + (s.absorb ? st : 0) +
               (full ? D * dt : 0);
  return fwd + bwd;
}

size_t row_bytes_down(const ExpertShape& s, TrainMode) {
  const size_t dt = dtype_size(s.dtype), st = dtype_size(s.score_dtype());
  const size_t D = size_t(s.D), F = size_t(s.F);
  size_t fwd = (D + 2 * F + F) * dt;
  size_t bwd = D * dt + (s.absorb ? st : 0);
  return fwd + bwd;
}

double transfer_seconds(double rows, const ExpertShape& s, TrainMode m, const CostModel& c) {
  return rows * double(row_bytes_up(s, m) + row_bytes_down(s, m)) / c.link_bytes_per_s;
}

size_t sync_bytes(const ExpertShape& s, TrainMode m) {
  if (m == TrainMode::lora) return 0;
  const size_t n = size_t(s.param_count());
  return n * dtype_size(s.grad_dtype()) + n * dtype_size(s.dtype);
}

double sync_seconds(const ExpertShape& s, TrainMode m, const CostModel& c) {
  return double(sync_bytes(s, m)) / c.link_bytes_per_s;
}

size_t bytes_upload(const ExpertShape& s) {
  if (!s.quant) return size_t(s.param_count()) * dtype_size(s.dtype);
  const int64_t images =
      quant_image(s.quant->w13, 2 * s.F, s.D).bytes + quant_image(s.quant->w2, s.D, s.F).bytes;
  return size_t(images + (s.bias ? 2 * s.F + s.D : 0) * int64_t(dtype_size(s.dtype)));
}

size_t bytes_resident(const ExpertShape& s, TrainMode m) {
  const size_t sums =
      m == TrainMode::full ? size_t(s.param_count()) * dtype_size(s.grad_dtype()) : 0;
  return bytes_upload(s) + sums;
}

const WorkspaceSlot& WorkspaceLayout::slot(std::string_view name) const {
  for (const WorkspaceSlot& s : slots) {
    if (s.name == name) return s;
  }
  throw Error(str_of("the device workspace has no slot '", name, "'"), "WorkspaceLayout",
              "score_G and dscore_G exist only when router scores are absorbed");
}

DeviceTensor WorkspaceLayout::tensor(const DeviceBuffer& buffer, std::string_view name) const {
  const WorkspaceSlot& s = slot(name);
  TIERMOE_ASSERT(buffer.bytes >= bytes, "workspace buffer of ", buffer.bytes, " bytes, needs ",
                 bytes);
  return DeviceTensor{buffer, s.offset, s.shape, s.dtype};
}

WorkspaceLayout workspace_layout(const ExpertShape& s, int64_t G) {
  TIERMOE_ASSERT(G > 0 && s.D > 0 && s.F > 0);
  const DType dt = s.dtype, st = s.score_dtype();
  std::vector<std::pair<std::string, std::pair<Shape, DType>>> want = {
      {"x_GD", {{G, s.D}, dt}},      {"y_GD", {{G, s.D}, dt}}, {"dx_GD", {{G, s.D}, dt}},
      {"h_G2F", {{G, 2 * s.F}, dt}}, {"a_GF", {{G, s.F}, dt}},
  };
  if (s.absorb) {
    want.push_back({"score_G", {{G}, st}});
    want.push_back({"dscore_G", {{G}, st}});
  }
  if (s.quant) {
    want.push_back({"w13_FD", {{2 * s.F, s.D}, dt}});
    want.push_back({"w2_DF", {{s.D, s.F}, dt}});
  }
  WorkspaceLayout out;
  for (auto& [name, spec] : want) {
    const size_t bytes = size_t(shape_numel(spec.first)) * dtype_size(spec.second);
    out.slots.push_back({name, spec.first, spec.second, out.bytes, bytes});
    out.bytes += (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign;
  }
  return out;
}

size_t bytes_workspace(const ExpertShape& s, int64_t G) {
  return size_t(kWorkspaceSets) * workspace_layout(s, G).bytes;
}

}  // namespace tiermoe
