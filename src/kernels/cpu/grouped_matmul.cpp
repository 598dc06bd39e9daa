// The grouped products on TierMoE's blocked GEMM (kernels/grouped_matmul.h):
// weights packed once per stack, one parallel loop over every group's work
// items, epilogues that round, add the bias and apply the GLU and the score
// on each finished block of f32 sums.
#include "tiermoe/kernels/grouped_matmul.h"

#include <algorithm>
#include <atomic>
#include <cmath>

#include "../grouped_check.h"
#include "../nn_common.h"
#include "gemm/driver.h"
#include "quant_pack.h"
#include "tiermoe/core/parallel.h"

namespace tiermoe {

namespace gemm = cpu::gemm;
using detail::str_of;
using gemm::ceil_div;
using gemm::round_up;

namespace {

const gemm::Microkernel& kernel_for(CpuIsa isa, DType dt, std::string_view op) {
  TIERMOE_CHECK(isa != CpuIsa::onednn, str_of(op, ": the onednn baseline has no packed weights"),
                std::string(op), "run the per-group cpu::matmul_* under TIERMOE_ISA=onednn");
  return gemm::microkernel(isa, dt);
}

// Packed weights are laid out for one ISA's microkernel.
void check_packed_for_this_isa(const PackedWeights& w, std::string_view op) {
  TIERMOE_CHECK(w.isa() == cpu_isa(),
                str_of(op, ": weights packed for ", cpu_isa_name(w.isa()), ", running ",
                       cpu_isa_name(cpu_isa())),
                std::string(op), "re-pack after changing the ISA");
}

// The forward_glu column order of the swiglu layout: C block b (nc columns)
// holds gate columns [b*h, b*h + w) padded to wp (a multiple of nr), then the
// up columns F + [b*h, b*h + w), padded alike; h = nc / 2.
struct GluBlocks {
  int64_t nc = 0, h = 0, F = 0, nr = 0;
  int64_t width(int64_t b) const { return std::min(h, F - b * h); }
  int64_t padded(int64_t b) const { return round_up(width(b), nr); }
  int64_t blocks() const { return ceil_div(F, h); }
  int64_t cols() const { return (blocks() - 1) * nc + 2 * padded(blocks() - 1); }
};

GluBlocks glu_blocks(const gemm::Microkernel& uk, int64_t F) {
  const int64_t nc = gemm::block_cols(uk);
  TIERMOE_ASSERT(nc % (2 * uk.nr) == 0, "a GLU block splits into whole gate and up panels");
  return {nc, nc / 2, F, uk.nr};
}

// How a [G, N, K] stack is packed for `use` on uk: B of the product is
// Kb x Nb, element (k, j) of weight g at w_g[k * rs + j * cs]; its C columns
// as packed (the swiglu layout regrouped into blocks), K padded to Kp, and
// each group's panels of uk.nr columns, panel_bytes each.
struct PackLayout {
  bool regroup = false;
  GluBlocks blocks;
  int64_t Kb = 0, Nb = 0, rs = 0, cs = 0;
  int64_t cols = 0, Kp = 0, panel_bytes = 0, panels = 0;
  int64_t group_bytes() const { return panels * panel_bytes; }
};

PackLayout pack_layout(const gemm::Microkernel& uk, int64_t N, int64_t K, PackUse use, Glu glu) {
  PackLayout l;
  l.regroup = use == PackUse::forward_glu && glu.kind == GluKind::swiglu;
  const bool dx = use == PackUse::backward_dx;
  l.Kb = dx ? N : K, l.Nb = dx ? K : N, l.rs = dx ? K : 1, l.cs = dx ? 1 : K;
  l.blocks = l.regroup ? glu_blocks(uk, N / 2) : GluBlocks{};
  l.cols = l.regroup ? l.blocks.cols() : l.Nb;
  l.Kp = round_up(l.Kb, uk.k_step);
  l.panel_bytes = gemm::b_panel_bytes(uk, l.Kp);
  l.panels = ceil_div(l.cols, uk.nr);
  return l;
}

// The panel at C column j reads `valid` consecutive lines of B (columns
// before any regrouping) from `first`.
struct PanelLines {
  int64_t first = 0, valid = 0;
};
PanelLines panel_lines(const PackLayout& l, int64_t nr, int64_t j) {
  if (!l.regroup) return {j, std::min(nr, l.Nb - j)};
  const GluBlocks& blocks = l.blocks;
  const int64_t b = j / blocks.nc, local = j % blocks.nc, wp = blocks.padded(b);
  const bool up = local >= wp;
  const int64_t c = local - (up ? wp : 0);
  return {(up ? blocks.F : 0) + b * blocks.h + c, std::min(nr, blocks.width(b) - c)};
}

// A group's quantized weight as the GEMM's B source: each panel expanded
// from the codes into the layout pack() writes from the dequantized weight
// (straight from the codes on AVX-512, quant_pack.h; else decoded to the
// layout's width in a per-thread buffer, then packed). Forward: a line is a
// weight row, k along it; dx: lines are weight columns, k runs down the rows.
struct QuantPanels {
  const gemm::Microkernel* uk = nullptr;
  const PackLayout* l = nullptr;
  const QuantMatrix* q = nullptr;
  uint64_t call = 0;  // which product: a thread's decoded block serves only its own
};

uint64_t next_quant_call() {
  static std::atomic<uint64_t> calls{0};
  return calls.fetch_add(1, std::memory_order_relaxed) + 1;
}

// PREFETCHT0 of a row's codes [c0, c0 + n).
void prefetch_codes(const QuantMatrix& q, int64_t row, int64_t c0, int64_t n) {
  const int64_t bits = quant_code_bits(q.format);
  const char* p = reinterpret_cast<const char*>(q.codes + row * q.code_stride);
  const int64_t b0 = c0 * bits / 8 / 64 * 64, b1 = (c0 + n) * bits / 8;
  for (int64_t b = b0; b < b1; b += 64) __builtin_prefetch(p + b, 0, 3);
}

// The codes come from memory in short runs per row (a panel's stretch of
// K in the forward, of its columns in dx), too short for the hardware
// prefetchers to follow, so each panel prefetches what the driver reads
// next: the forward the next panel's rows over this step of K (the driver
// goes through a block's panels at each k step), dx the next step of K's
// rows for the whole block of columns, once per block.
void prefetch_next_codes(const QuantPanels& c, int64_t j, int64_t k0, int64_t kc) {
  const PackLayout& l = *c.l;
  const int64_t nr = c.uk->nr;
  if (l.rs == 1) {
    if (j + nr >= l.cols) return;
    const auto [first, valid] = panel_lines(l, nr, j + nr);
    for (int64_t x = 0; x < valid; ++x) prefetch_codes(*c.q, first + x, k0, std::min(kc, l.Kb - k0));
    return;
  }
  const int64_t nc = gemm::block_cols(*c.uk);
  if (j % nc != 0 || k0 + kc >= l.Kb) return;
  const int64_t n = std::min(nc, l.Nb - j);
  for (int64_t k = k0 + kc; k < std::min(l.Kb, k0 + 2 * kc); ++k) prefetch_codes(*c.q, k, j, n);
}

const void* pack_quant_panel(const void* ctx, int64_t j, int64_t /*cols*/, int64_t k0, int64_t kc,
                             void* dst) {
  const QuantPanels& c = *static_cast<const QuantPanels*>(ctx);
  const int64_t nr = c.uk->nr, nc = gemm::block_cols(*c.uk);
  const auto [first, valid] = panel_lines(*c.l, nr, j);
  const int64_t kk = std::min(kc, c.l->Kb - k0);  // k in this step, the rest zero padding
  // bf16 layouts read the values rounded as their packing rounds an f32
  // weight; f32 layouts the values themselves.
  const bool f32 = c.uk->b == gemm::BPack::f32;
  const size_t es = f32 ? 4 : 2;
  auto decode = [&](int64_t row, int64_t c0, int64_t n, void* out) {
    if (f32) dequantize_row(*c.q, row, c0, n, static_cast<float*>(out));
    else dequantize_row_bf16(*c.q, row, c0, n, static_cast<bf16*>(out));
  };
  prefetch_next_codes(c, j, k0, kc);
  if (c.l->rs == 1 && c.uk->b == gemm::BPack::bf16_pairs &&
      cpu::pairs_apply(*c.q, k0, kk, nr)) {
    cpu::pack_pairs(*c.q, first, valid, k0, kk, kc, nr, dst);
    return dst;
  }
  if (c.l->rs == 1) {  // forward: B(k, x) = w[first + x, k], a panel's rows decoded
    constexpr int64_t kCap = 64 * gemm::kKc;
    alignas(64) thread_local float lines[kCap];
    TIERMOE_ASSERT(nr * kc <= kCap, "a panel's lines fit the decode buffer");
    for (int64_t x = 0; x < valid; ++x) {
      decode(first + x, k0, kk, reinterpret_cast<char*>(lines) + size_t(x * kc) * es);
    }
    const gemm::Mat src{lines, 1, kc, f32 ? DType::f32 : DType::bf16};
    gemm::pack_b(*c.uk, src, 0, valid, 0, kc, kk, dst);
    return dst;
  }
  // dx: B(k, x) = w[k, first + x]. A panel spans a short run of each weight
  // row, so the block of columns it belongs to is expanded whole on its
  // first panel, row run by row run (a scale's table serves the whole run):
  // straight into the block's bf16-pair panels where the AVX-512 expansion
  // takes them, else decoded, each panel then packed from that.
  struct Block {
    uint64_t call = 0;
    const uint8_t* codes = nullptr;
    int64_t k0 = -1, j0 = -1;
    bool panels = false;       // values holds the block's packed panels
    std::vector<char> values;  // [kk][nc] decoded, or [nc / nr] packed panels
  };
  thread_local Block block;
  const int64_t j0 = j / nc * nc, width = std::min(nc, c.l->Nb - j0);
  if (block.call != c.call || block.codes != c.q->codes || block.k0 != k0 || block.j0 != j0) {
    block.values.resize(size_t(gemm::kKc * nc) * 4);  // grows once per thread
    block.panels = c.uk->b == gemm::BPack::bf16_pairs &&
                   cpu::pairs_dx_apply(*c.q, j0, width, nr);
    if (block.panels) {
      cpu::pack_pairs_dx(*c.q, k0, kk, kc, j0, width, nr, block.values.data());
    } else {
      for (int64_t k = 0; k < kk; ++k) {
        decode(k0 + k, j0, width, block.values.data() + size_t(k * nc) * es);
      }
    }
    block.call = c.call, block.codes = c.q->codes, block.k0 = k0, block.j0 = j0;
  }
  if (block.panels) return block.values.data() + (j - j0) / nr * gemm::b_panel_bytes(*c.uk, kc);
  const gemm::Mat src{block.values.data() + size_t(first - j0) * es, nc, 1,
                      f32 ? DType::f32 : DType::bf16};
  gemm::pack_b(*c.uk, src, 0, valid, 0, kc, kk, dst);
  return dst;
}

// The buffer of G groups' panels: whole bf16 elements, at least one.
Shape storage_shape(int64_t G, const PackLayout& l) {
  return {std::max<int64_t>(1, ceil_div(G * l.group_bytes(), 2))};
}

}  // namespace

int64_t PackedWeights::storage_bytes(int64_t G, int64_t N, int64_t K, DType dt, PackUse use,
                                     Glu glu) {
  const PackLayout l =
      pack_layout(kernel_for(cpu_isa(), dt, "PackedWeights::storage_bytes"), N, K, use, glu);
  return 2 * storage_shape(G, l)[0];
}

void PackedWeights::pack(const Tensor& w_GNK, PackUse use, Glu glu) {
  TIERMOE_CHECK(w_GNK.defined() && w_GNK.dim() == 3 &&
                    (w_GNK.dtype() == DType::f32 || w_GNK.dtype() == DType::bf16),
                str_of("PackedWeights::pack: the stack must be [G, N, K] f32 or bf16, got ",
                       w_GNK.defined() ? w_GNK.str() : std::string("undefined")),
                "PackedWeights::pack", "pass the stacked weights, e.g. w13_EFD");
  std::vector<Tensor> groups;
  groups.reserve(size_t(w_GNK.size(0)));
  for (int64_t g = 0; g < w_GNK.size(0); ++g) groups.push_back(w_GNK.select(g));
  pack(std::move(groups), w_GNK.dtype(), use, glu);
}

void PackedWeights::pack(std::vector<Tensor> w_G_NK, DType dt, PackUse use, Glu glu) {
  const char* op = "PackedWeights::pack";
  TIERMOE_CHECK(!w_G_NK.empty() && (dt == DType::f32 || dt == DType::bf16),
                str_of(op, ": needs at least one weight and products in f32 or bf16, got ",
                       w_G_NK.size(), " weights in ", dtype_name(dt)),
                op, "pass one [N, K] weight per group");
  const int64_t G = int64_t(w_G_NK.size());
  const int64_t N = w_G_NK[0].defined() ? w_G_NK[0].size(0) : 0;
  const int64_t K = w_G_NK[0].defined() && w_G_NK[0].dim() == 2 ? w_G_NK[0].size(1) : 0;
  for (int64_t g = 0; g < G; ++g) {
    const Tensor& w = w_G_NK[size_t(g)];
    TIERMOE_CHECK(w.defined() && w.dim() == 2 && w.size(0) == N && w.size(1) == K &&
                      reads(w.dtype(), dt),
                  str_of(op, ": weight ", g, " must be [", N, ", ", K, "] ", dtype_name(dt),
                         dt == DType::f32 ? " or bf16" : "", ", got ",
                         w.defined() ? w.str() : std::string("undefined")),
                  op,
                  "every group's weight has the first one's shape, at the products' width or "
                  "narrower (bf16 into f32)");
  }
  TIERMOE_CHECK(use != PackUse::forward_glu || N % 2 == 0,
                str_of(op, ": a GLU weight needs an even output count, got ", N), op,
                "W13 stacks gate and up rows: [G, 2F, D]");
  const gemm::Microkernel& uk = kernel_for(cpu_isa(), dt, op);
  const PackLayout l = pack_layout(uk, N, K, use, glu);
  const Shape shape = storage_shape(G, l);
  if (!storage_.defined() || storage_.numel() < shape[0]) {
    storage_ = Tensor::empty(shape, DType::bf16, MemTag::weights);
  }
  sources_ = std::move(w_G_NK);
  quant_.clear();
  set_shape(G, N, K, dt, use, glu);
  char* dst = static_cast<char*>(storage_.raw());
  auto pack_panel = [&](int64_t t, int64_t k0, int64_t kc) {
    const int64_t g = t / l.panels, p = t % l.panels, j = p * uk.nr;
    const Tensor& w_NK = sources_[size_t(g)];
    const size_t es = dtype_size(w_NK.dtype());
    const char* w = static_cast<const char*>(w_NK.raw());
    const auto [first, valid] = panel_lines(l, uk.nr, j);
    const gemm::Mat src{w + size_t(first * l.cs) * es, l.rs, l.cs, w_NK.dtype()};
    gemm::pack_b(uk, src, 0, valid, k0, kc, l.Kb,
                 dst + g * l.group_bytes() + p * l.panel_bytes + gemm::b_panel_bytes(uk, k0));
  };
  // The order follows the source's contiguous runs, so the weights stream
  // from memory once with few concurrent streams (packing is bound by
  // reading them). Forward: a panel's nr lines are nr weight rows, each read
  // whole. dx: a panel's lines are columns, so a group is packed in short
  // steps of K (weight rows): each step's rows are read 32 bytes per panel,
  // panel after panel, and stay in L1 meanwhile. A panel over all of K is the
  // concatenation of its steps (microkernel.h), so both give one layout.
  const int64_t k_step = use == PackUse::backward_dx ? round_up(32, uk.k_step) : l.Kp;
  parallel_for(G * l.panels, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t g0 = t0; g0 < t1;) {
      const int64_t g1 = std::min(t1, (g0 / l.panels + 1) * l.panels);  // this group's items
      for (int64_t k0 = 0; k0 < l.Kp; k0 += k_step) {
        for (int64_t t = g0; t < g1; ++t) pack_panel(t, k0, std::min(k_step, l.Kp - k0));
      }
      g0 = g1;
    }
  });
}

void PackedWeights::bind_quantized(std::vector<QuantMatrix> w_G_NK, DType dt, PackUse use,
                                   Glu glu) {
  const char* op = "PackedWeights::bind_quantized";
  TIERMOE_CHECK(!w_G_NK.empty() && (dt == DType::f32 || dt == DType::bf16),
                str_of(op, ": needs at least one weight and products in f32 or bf16, got ",
                       w_G_NK.size(), " weights in ", dtype_name(dt)),
                op, "pass one [N, K] matrix per group");
  const int64_t G = int64_t(w_G_NK.size()), N = w_G_NK[0].rows, K = w_G_NK[0].cols;
  for (int64_t g = 0; g < G; ++g) {
    const QuantMatrix& q = w_G_NK[size_t(g)];
    check_quant_matrix(q, str_of(op, ": weight ", g));
    TIERMOE_CHECK(q.rows == N && q.cols == K,
                  str_of(op, ": weight ", g, " is [", q.rows, ", ", q.cols, "], weight 0 [", N,
                         ", ", K, "]"),
                  op, "every group's weight has the first one's shape");
  }
  TIERMOE_CHECK(use != PackUse::forward_glu || N % 2 == 0,
                str_of(op, ": a GLU weight needs an even output count, got ", N), op,
                "W13 stacks gate and up rows: [G, 2F, D]");
  storage_ = Tensor();
  sources_.assign(size_t(G), Tensor());
  quant_ = std::move(w_G_NK);
  set_shape(G, N, K, dt, use, glu);
}

void PackedWeights::set_shape(int64_t G, int64_t N, int64_t K, DType dt, PackUse use, Glu glu) {
  const PackLayout l = pack_layout(kernel_for(cpu_isa(), dt, "PackedWeights"), N, K, use, glu);
  dtype_ = dt;
  isa_ = cpu_isa();
  use_ = use;
  glu_ = glu;
  G_ = G, N_ = N, K_ = K, packed_cols_ = l.cols, group_bytes_ = l.group_bytes();
}

const void* PackedWeights::group_data(int64_t g) const {
  if (!storage_.defined()) return nullptr;
  return static_cast<const char*>(storage_.raw()) + g * group_bytes_;
}

namespace cpu {
namespace {

// What every work item's epilogue needs beyond its block: the call's
// context and where the item's group starts.
struct Item {
  const void* call = nullptr;
  int64_t row0 = 0, group = 0;
};

// Runs fn's epilogue over every work item of the call: (group, run of column
// blocks, row block) in that order, contiguous runs of them per thread. x_NI
// is A.
template <class Call>
void run_items(const gemm::Microkernel& uk, const PackedWeights& w, const Tensor& x_NI,
               const std::vector<int64_t>& offset_G, std::span<const uint8_t> skip_G,
               const Call& call,
               void (*fn)(const void*, int64_t, int64_t, int64_t, int64_t, const float*, int64_t)) {
  // Quantized weights are expanded per panel for each block of rows that
  // reads it: tall blocks, so that is about once per call.
  const bool quant = w.quantized();
  const int64_t G = w.groups(), mc = quant ? gemm::tall_rows(uk) : gemm::block_rows(uk);
  const PackLayout layout =
      quant ? pack_layout(uk, w.out_features(), w.in_features(), w.use(), w.glu()) : PackLayout{};
  const uint64_t call_id = quant ? next_quant_call() : 0;
  const int64_t Kb = w.use() == PackUse::backward_dx ? w.out_features() : w.in_features();
  const int64_t I = x_NI.size(1);
  auto rows_of = [&](int64_t g) {
    if (!skip_G.empty() && skip_G[size_t(g)]) return int64_t{0};
    return offset_G[size_t(g) + 1] - offset_G[size_t(g)];
  };
  int64_t row_blocks = 0;
  for (int64_t g = 0; g < G; ++g) row_blocks += ceil_div(rows_of(g), mc);
  // An item's columns: a run of column blocks, A packed once for them.
  const int64_t chunk = gemm::column_chunk(uk, w.packed_cols(), row_blocks, num_threads());
  const int64_t n_blocks = ceil_div(w.packed_cols(), chunk);
  const int64_t total = row_blocks * n_blocks;
  parallel_for(total, 1, [&](int64_t t0, int64_t t1) {
    if (uk.thread_begin) uk.thread_begin();
    // The group holding item t0, then walk on.
    int64_t g = 0, first = 0;
    while (first + ceil_div(rows_of(g), mc) * n_blocks <= t0) {
      first += ceil_div(rows_of(g), mc) * n_blocks;
      ++g;
    }
    for (int64_t t = t0; t < t1; ++t) {
      int64_t m_blocks = ceil_div(rows_of(g), mc);
      while (t >= first + m_blocks * n_blocks) {
        first += m_blocks * n_blocks;
        m_blocks = ceil_div(rows_of(++g), mc);
      }
      const int64_t local = t - first, nb = local / m_blocks, mb = local % m_blocks;
      const int64_t row0 = offset_G[size_t(g)], M = rows_of(g);
      const char* a =
          static_cast<const char*>(x_NI.raw()) + size_t(row0 * I) * dtype_size(x_NI.dtype());
      const QuantPanels panels{&uk, &layout, quant ? &w.quant_source(g) : nullptr, call_id};
      const gemm::BSource source{pack_quant_panel, &panels};
      const gemm::Problem p{.M = M,
                            .N = w.packed_cols(),
                            .K = Kb,
                            .a = {a, I, 1, x_NI.dtype()},
                            .b = {},
                            .b_packed = w.group_data(g),
                            .b_source = quant ? &source : nullptr};
      const Item item{&call, row0, g};
      const int64_t i0 = mb * mc, j0 = nb * chunk;
      gemm::run_block(uk, p, {fn, &item}, i0, std::min(mc, M - i0), j0,
                      std::min(chunk, w.packed_cols() - j0));
    }
    if (uk.thread_end) uk.thread_end();
  });
}

struct StoreCall {
  void* y = nullptr;
  int64_t O = 0;
  const void* bias = nullptr;  // [G, O]
  const Tensor* score = nullptr;
};

template <class T>
void store_item(const void* ctx, int64_t i0, int64_t j0, int64_t rows, int64_t cols,
                const float* acc, int64_t ld) {
  const Item& item = *static_cast<const Item*>(ctx);
  const StoreCall& c = *static_cast<const StoreCall*>(item.call);
  const int64_t O = c.O;
  const T* b = c.bias ? static_cast<const T*>(c.bias) + item.group * O : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = item.row0 + i0 + i;
    T* y = static_cast<T*>(c.y) + r * O + j0;
    const float* s = acc + i * ld;
    for (int64_t j = 0; j < cols; ++j) y[j] = store<T>(s[j]);
    if (!b) continue;
    // As add_bias_forward: the product rounded first, then the bias added.
    if (c.score) {
      const float sc = detail::score_f32(*c.score, r);
      for (int64_t j = 0; j < cols; ++j) y[j] = store<T>(load<T>(y[j]) + sc * load<T>(b[j0 + j]));
    } else {
      for (int64_t j = 0; j < cols; ++j) y[j] = store<T>(load<T>(y[j]) + load<T>(b[j0 + j]));
    }
  }
}

struct GluCall {
  void *h = nullptr, *a = nullptr, *as = nullptr;
  int64_t F = 0;
  const void* bias = nullptr;  // [G, 2F]
  const Tensor* score = nullptr;
  Glu glu;
  GluBlocks blocks;  // swiglu only
};

// One row's h for columns hc (real column indices), rounded, bias added.
template <class T>
T h_value(float sum, const T* b, int64_t col) {
  T h = store<T>(sum);
  return b ? store<T>(load<T>(h) + load<T>(b[col])) : h;
}
// h_value over n consecutive columns (b: their biases, or null), the bias
// test outside the loop so that it vectorizes.
template <class T>
void h_row(T* __restrict h, const float* __restrict s, const T* __restrict b, int64_t n) {
  if (!b) {
    for (int64_t f = 0; f < n; ++f) h[f] = store<T>(s[f]);
    return;
  }
  for (int64_t f = 0; f < n; ++f) h[f] = store<T>(load<T>(store<T>(s[f])) + load<T>(b[f]));
}

template <class T>
void glu_item(const void* ctx, int64_t i0, int64_t j0, int64_t rows, int64_t cols, const float* acc,
              int64_t ld) {
  const Item& item = *static_cast<const Item*>(ctx);
  const GluCall& c = *static_cast<const GluCall*>(item.call);
  const int64_t F = c.F;
  const T* b = c.bias ? static_cast<const T*>(c.bias) + item.group * 2 * F : nullptr;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = item.row0 + i0 + i;
    T* h = static_cast<T*>(c.h) + r * 2 * F;
    T* a = static_cast<T*>(c.a) + r * F;
    T* as = c.score ? static_cast<T*>(c.as) + r * F : nullptr;
    const float sc = c.score ? detail::score_f32(*c.score, r) : 0.f;
    const float* s = acc + i * ld;
    int64_t f0 = 0, n = 0;
    if (c.glu.kind == GluKind::swiglu) {
      const int64_t blk = j0 / c.blocks.nc, wp = c.blocks.padded(blk);
      f0 = blk * c.blocks.h, n = c.blocks.width(blk);
      h_row<T>(h + f0, s, b ? b + f0 : nullptr, n);
      h_row<T>(h + F + f0, s + wp, b ? b + F + f0 : nullptr, n);
      nn_detail::swiglu_row(a + f0, h + f0, h + F + f0, n);
    } else {
      // GPT-OSS's clamped GLU on interleaved pairs, as gpt_oss_glu_forward.
      const float alpha = float(c.glu.alpha), limit = float(c.glu.limit);
      f0 = j0 / 2, n = cols / 2;
      for (int64_t f = 0; f < n; ++f) {
        const int64_t col = j0 + 2 * f;
        const T gh = h_value<T>(s[2 * f], b, col), uh = h_value<T>(s[2 * f + 1], b, col + 1);
        h[col] = gh;
        h[col + 1] = uh;
        a[f0 + f] = store<T>(nn_detail::gpt_oss_glu(load<T>(gh), load<T>(uh), alpha, limit));
      }
    }
    if (as) {
      for (int64_t f = f0; f < f0 + n; ++f) as[f] = store<T>(load<T>(a[f]) * sc);
    }
  }
}

}  // namespace

void grouped_matmul(Tensor& y_NO, const Tensor& x_NI, const std::vector<int64_t>& offset_G,
                    const PackedWeights& w, const Tensor& bias_GO, const Tensor& score_N,
                    std::span<const uint8_t> skip_G) {
  const char* op = "grouped_matmul";
  detail::check_grouped_matmul(y_NO, x_NI, offset_G, w, bias_GO, score_N, skip_G);
  check_packed_for_this_isa(w, op);
  const int64_t O = w.use() == PackUse::backward_dx ? w.in_features() : w.out_features();
  const DType dt = w.dtype();
  const gemm::Microkernel& uk = kernel_for(w.isa(), dt, op);
  const StoreCall call{y_NO.raw(), O, bias_GO.defined() ? bias_GO.raw() : nullptr,
                       bias_GO.defined() && score_N.defined() ? &score_N : nullptr};
  run_items(uk, w, x_NI, offset_G, skip_G, call,
            dt == DType::f32 ? store_item<float> : store_item<bf16>);
}

void grouped_glu_forward(Tensor& h_N2F, Tensor& a_NF, Tensor& as_NF, const Tensor& x_ND,
                         const std::vector<int64_t>& offset_G, const PackedWeights& w13,
                         const Tensor& b13_G2F, const Tensor& score_N,
                         std::span<const uint8_t> skip_G) {
  const char* op = "grouped_glu_forward";
  detail::check_grouped_glu_forward(h_N2F, a_NF, as_NF, x_ND, offset_G, w13, b13_G2F, score_N,
                                    skip_G);
  check_packed_for_this_isa(w13, op);
  const int64_t F = w13.out_features() / 2;
  const DType dt = w13.dtype();
  const gemm::Microkernel& uk = kernel_for(w13.isa(), dt, op);
  GluCall call{h_N2F.raw(),
               a_NF.raw(),
               score_N.defined() ? as_NF.raw() : nullptr,
               F,
               b13_G2F.defined() ? b13_G2F.raw() : nullptr,
               score_N.defined() ? &score_N : nullptr,
               w13.glu(),
               {}};
  if (w13.glu().kind == GluKind::swiglu) call.blocks = glu_blocks(uk, F);
  run_items(uk, w13, x_ND, offset_G, skip_G, call,
            dt == DType::f32 ? glu_item<float> : glu_item<bf16>);
}

}  // namespace cpu
}  // namespace tiermoe
