#pragma once
// Runs an ExpertPlan (src/tier/expert_plan.h) on the host: each GEMM in
// BLAS's column-major convention exactly as the step describes it (op(A),
// op(B), leading dimensions, beta), summing over k in order in the acc
// dtype; each elementwise step with the formula its CUDA kernel uses. So the
// plan a GPU captures (shapes, transposes, strides, step order, the sums'
// continuation) is checked against the host's expert math on any machine;
// only the kernels' and cuBLAS's own arithmetic wait for a GPU.
#include <cmath>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "../../src/tier/expert_plan.h"
#include "tiermoe/core/tensor.h"

namespace tiermoe::testing {

class PlanInterpreter {
 public:
  // Scratch refs start as NaN: a step that reads scratch nothing wrote fails.
  explicit PlanInterpreter(ExpertPlan plan) : plan_(std::move(plan)), refs_(plan_.refs.size()) {
    for (size_t i = 0; i < plan_.refs.size(); ++i) {
      const PlanRef& r = plan_.refs[i];
      if (!r.slot) {
        refs_[i] = Tensor::empty(r.shape, r.dtype);
        refs_[i].fill(NAN);
      }
    }
  }
  // The tensor a slot views (shared storage: outputs land in it).
  void bind(const std::string& slot, const Tensor& t) {
    const int r = plan_.ref(slot);
    TIERMOE_ASSERT(r >= 0 && plan_.refs[size_t(r)].slot, "no slot ", slot);
    const PlanRef& ref = plan_.refs[size_t(r)];
    TIERMOE_ASSERT(t.shape() == ref.shape && t.dtype() == ref.dtype, slot, ": ", t.str());
    refs_[size_t(r)] = t;
  }
  void run(bool sum_started) {
    for (size_t i = 0; i < refs_.size(); ++i) {
      TIERMOE_ASSERT(refs_[i].defined(), "slot ", plan_.refs[i].name, " not bound");
    }
    sum_started_ = sum_started;
    visit_dtype(plan_.key.dtype, [&]<class T>() {
      for (const PlanStep& step : plan_.steps) {
        std::visit([&](const auto& s) { this->step<T>(s); }, step);
      }
    });
  }

 private:
  template <class P>
  P* at(int ref) {
    return refs_[size_t(ref)].data<P>();
  }
  template <class A>
  A score(int ref, int64_t m) {
    return ref < 0 ? A(1) : at<A>(ref)[m];
  }
  // load/store of the element type a ref really holds (T or the acc dtype).
  template <class A>
  A get(int ref, int64_t i) {
    return A(refs_[size_t(ref)].get(i));
  }
  template <class T, class A>
  void put(int ref, int64_t i, A v) {
    Tensor& t = refs_[size_t(ref)];
    if (t.dtype() == dtype_of<T>) {
      t.data<T>()[i] = store<T>(v);
    } else {
      t.data<A>()[i] = v;
    }
  }

  template <class T>
  void step(const GemmStep& g) {
    using A = acc_t<T>;
    const A beta = g.beta == GemmBeta::sum && sum_started_ ? A(1) : A(0);
    for (int64_t j = 0; j < g.n; ++j) {
      for (int64_t i = 0; i < g.m; ++i) {
        A acc = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          const A a = get<A>(g.a, g.trans_a ? p + i * g.lda : i + p * g.lda);
          const A b = get<A>(g.b, g.trans_b ? j + p * g.ldb : p + j * g.ldb);
          acc += a * b;
        }
        const int64_t c = i + j * g.ldc;
        put<T, A>(g.c, c, beta != A(0) ? acc + beta * get<A>(g.c, c) : acc);
      }
    }
  }

  template <class T>
  void step(const ActForwardStep& s) {
    using A = acc_t<T>;
    const int64_t G = plan_.key.G, F = plan_.key.F;
    const bool gpt = plan_.key.activation == ExpertActivation::gpt_oss;
    const A alpha = A(plan_.key.gpt_oss.alpha), limit = A(plan_.key.gpt_oss.limit);
    T* h = at<T>(s.h);
    for (int64_t m = 0; m < G; ++m) {
      for (int64_t f = 0; f < F; ++f) {
        const int64_t gc = gpt ? 2 * f : f, uc = gpt ? 2 * f + 1 : F + f;
        T* row = h + m * 2 * F;
        if (s.b13 >= 0) {
          row[gc] = store<T>(load(row[gc]) + load(at<T>(s.b13)[gc]));
          row[uc] = store<T>(load(row[uc]) + load(at<T>(s.b13)[uc]));
        }
        const A g = load(row[gc]), u = load(row[uc]);
        T a;
        if (gpt) {
          const A gate = std::min(g, limit), up = std::clamp(u, -limit, limit);
          a = store<T>((up + A(1)) * (gate * (A(1) / (A(1) + std::exp(-(alpha * gate))))));
        } else {
          a = store<T>(g / (A(1) + std::exp(-g)) * u);
        }
        at<T>(s.a)[m * F + f] = a;
        if (s.w2_in >= 0) at<T>(s.w2_in)[m * F + f] = store<T>(load(a) * score<A>(s.score, m));
      }
    }
  }

  template <class T>
  void step(const BiasForwardStep& s) {
    using A = acc_t<T>;
    const int64_t G = plan_.key.G, D = plan_.key.D;
    T* y = at<T>(s.y);
    for (int64_t m = 0; m < G; ++m) {
      for (int64_t d = 0; d < D; ++d) {
        const A b = load(at<T>(s.b2)[d]);
        y[m * D + d] = store<T>(load(y[m * D + d]) + (s.score >= 0 ? score<A>(s.score, m) * b : b));
      }
    }
  }

  template <class T>
  void step(const RowDotStep& s) {
    using A = acc_t<T>;
    const int64_t G = plan_.key.G, D = plan_.key.D;
    for (int64_t m = 0; m < G; ++m) {
      A dot = 0;
      for (int64_t d = 0; d < D; ++d) dot += load(at<T>(s.x)[m * D + d]) * load(at<T>(s.v)[d]);
      at<A>(s.out)[m] = dot;
    }
  }

  template <class T>
  void step(const ColumnSumStep& s) {
    using A = acc_t<T>;
    const int64_t G = plan_.key.G, C = shape_numel(plan_.refs[size_t(s.out)].shape);
    for (int64_t c = 0; c < C; ++c) {
      A sum = sum_started_ ? at<A>(s.out)[c] : A(0);
      for (int64_t m = 0; m < G; ++m) {
        const A v = load(at<T>(s.in)[m * C + c]);
        sum += s.score >= 0 ? score<A>(s.score, m) * v : v;
      }
      at<A>(s.out)[c] = sum;
    }
  }

  template <class T>
  void step(const ScaleRowsStep& s) {
    using A = acc_t<T>;
    const int64_t G = plan_.key.G, F = plan_.key.F;
    for (int64_t i = 0; i < G * F; ++i) {
      at<T>(s.out)[i] = store<T>(load(at<T>(s.a)[i]) * score<A>(s.score, i / F));
    }
  }

  template <class T>
  void step(const ActBackwardStep& s) {
    using A = acc_t<T>;
    const int64_t G = plan_.key.G, F = plan_.key.F;
    const bool gpt = plan_.key.activation == ExpertActivation::gpt_oss;
    const A alpha = A(plan_.key.gpt_oss.alpha), limit = A(plan_.key.gpt_oss.limit);
    auto sigmoid = [](A x) { return A(1) / (A(1) + std::exp(-x)); };
    for (int64_t m = 0; m < G; ++m) {
      const T* h = at<T>(s.h) + m * 2 * F;
      T* dh = at<T>(s.dh) + m * 2 * F;
      A dot = 0;
      for (int64_t f = 0; f < F; ++f) {
        A g = load(at<T>(s.da)[m * F + f]);
        if (s.score >= 0) {
          dot += g * load(at<T>(s.a)[m * F + f]);
          g = load(store<T>(g * score<A>(s.score, m)));
        }
        const int64_t gc = gpt ? 2 * f : f, uc = gpt ? 2 * f + 1 : F + f;
        const A g_raw = load(h[gc]), u_raw = load(h[uc]);
        if (gpt) {
          const A gate = std::min(g_raw, limit), up = std::clamp(u_raw, -limit, limit);
          const A sig = sigmoid(alpha * gate), glu = gate * sig;
          const A dglu = sig + gate * alpha * sig * (A(1) - sig);
          dh[gc] = store<T>(g_raw <= limit ? g * (up + A(1)) * dglu : A(0));
          dh[uc] = store<T>((u_raw >= -limit && u_raw <= limit) ? g * glu : A(0));
        } else {
          const A sg = sigmoid(g_raw);
          dh[gc] = store<T>(g * u_raw * (sg * (A(1) + g_raw * (A(1) - sg))));
          dh[uc] = store<T>(g * (g_raw / (A(1) + std::exp(-g_raw))));
        }
      }
      if (s.dscore >= 0) {
        A* ds = at<A>(s.dscore);
        ds[m] = s.dscore_started ? ds[m] + dot : dot;
      }
    }
  }

  ExpertPlan plan_;
  std::vector<Tensor> refs_;
  bool sum_started_ = false;
};

}  // namespace tiermoe::testing
