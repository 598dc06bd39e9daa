// The elementwise steps of the expert graphs (expert_kernels.h). Each kernel
// mirrors its host twin's formula and evaluation order: kernels/ref's SwiGLU,
// moe/expert_ops.h's GPT-OSS activation, score scaling and bias steps.
#include <cuda_bf16.h>

#include "expert_kernels.h"

namespace tiermoe::cuda {

namespace {

constexpr int kThreads = 256;

template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class T>
using Acc = typename AccOf<T>::type;

__device__ inline float load(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ inline float load(float v) { return v; }
__device__ inline double load(double v) { return v; }

template <class T>
__device__ inline T store(Acc<T> v) {
  if constexpr (sizeof(T) == 2) {
    return __float2bfloat16_rn(v);  // round to nearest even, as the host's float_to_bf16
  } else {
    return v;
  }
}

// The block's pointers by ref index.
template <class P>
__device__ inline P* ref(const void* block, int i) {
  return static_cast<P*>(static_cast<void* const*>(block)[i]);
}

__device__ inline float exp_acc(float x) { return expf(x); }
__device__ inline double exp_acc(double x) { return exp(x); }

template <class A>
__device__ inline A sigmoid(A x) {
  return A(1) / (A(1) + exp_acc(-x));
}
// kernels/nn_common.h's silu and silu_grad.
template <class A>
__device__ inline A silu(A x) {
  return x / (A(1) + exp_acc(-x));
}
template <class A>
__device__ inline A silu_grad(A x) {
  A s = A(1) / (A(1) + exp_acc(-x));
  return s * (A(1) + x * (A(1) - s));
}

// The columns of h that feed a_MF[m, f]: swiglu gate f, up F + f; gpt_oss
// interleaved, gate 2f, up 2f + 1.
struct GateUp {
  int64_t gate, up;
};
__device__ inline GateUp gate_up(bool gpt_oss, int64_t f, int64_t F) {
  return gpt_oss ? GateUp{2 * f, 2 * f + 1} : GateUp{f, F + f};
}

// Sums `v` over the block (kThreads threads); thread 0 gets the total.
template <class A>
__device__ inline A block_sum(A v) {
  __shared__ A partial[kThreads / 32];
  for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  A total = 0;
  if (threadIdx.x == 0) {
    for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  }
  return total;
}

template <class T>
__global__ void act_forward_kernel(const void* block, int h_i, int a_i, int w2_in_i, int b13_i,
                                   int score_i, int64_t G, int64_t F, Activation act) {
  using A = Acc<T>;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= G * F) return;
  const int64_t m = i / F, f = i % F;
  T* h = ref<T>(block, h_i) + m * 2 * F;
  const GateUp c = gate_up(act.gpt_oss, f, F);
  A g = load(h[c.gate]), u = load(h[c.up]);
  if (b13_i >= 0) {
    const T* b13 = ref<const T>(block, b13_i);
    const T gb = store<T>(g + load(b13[c.gate])), ub = store<T>(u + load(b13[c.up]));
    h[c.gate] = gb, h[c.up] = ub;
    g = load(gb), u = load(ub);
  }
  T a;
  if (act.gpt_oss) {
    const A alpha = A(act.alpha), limit = A(act.limit);
    const A gate = g < limit ? g : limit;
    const A up = u < -limit ? -limit : (u > limit ? limit : u);
    const A glu = gate * sigmoid(alpha * gate);
    a = store<T>((up + A(1)) * glu);
  } else {
    a = store<T>(silu(g) * u);
  }
  ref<T>(block, a_i)[m * F + f] = a;
  if (w2_in_i >= 0) {
    const A s = ref<const A>(block, score_i)[m];
    ref<T>(block, w2_in_i)[m * F + f] = store<T>(load(a) * s);
  }
}

template <class T>
__global__ void bias_forward_kernel(const void* block, int y_i, int b2_i, int score_i, int64_t G,
                                    int64_t D) {
  using A = Acc<T>;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= G * D) return;
  const int64_t m = i / D, d = i % D;
  T* y = ref<T>(block, y_i);
  const A b = load(ref<const T>(block, b2_i)[d]);
  if (score_i >= 0) {
    const A s = ref<const A>(block, score_i)[m];
    y[i] = store<T>(load(y[i]) + s * b);
  } else {
    y[i] = store<T>(load(y[i]) + b);
  }
}

// One block per row.
template <class T>
__global__ void row_dot_kernel(const void* block, int out_i, int x_i, int v_i, int64_t D) {
  using A = Acc<T>;
  const int64_t m = blockIdx.x;
  const T* x = ref<const T>(block, x_i) + m * D;
  const T* v = ref<const T>(block, v_i);
  A dot = 0;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dot += load(x[d]) * load(v[d]);
  dot = block_sum(dot);
  if (threadIdx.x == 0) ref<A>(block, out_i)[m] = dot;
}

// One thread per column, the rows in order onto the running sum: the host's
// add_bias_backward order exactly.
template <class T>
__global__ void column_sum_kernel(const void* block, size_t started_offset, int out_i, int in_i,
                                  int score_i, int64_t G, int64_t C) {
  using A = Acc<T>;
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const bool started =
      *reinterpret_cast<const int32_t*>(static_cast<const char*>(block) + started_offset) != 0;
  const T* in = ref<const T>(block, in_i);
  const A* score = score_i >= 0 ? ref<const A>(block, score_i) : nullptr;
  A* out = ref<A>(block, out_i);
  A sum = started ? out[c] : A(0);
  for (int64_t m = 0; m < G; ++m) {
    const A v = load(in[m * C + c]);
    sum += score ? score[m] * v : v;
  }
  out[c] = sum;
}

template <class T>
__global__ void scale_rows_kernel(const void* block, int out_i, int a_i, int score_i, int64_t G,
                                  int64_t F) {
  using A = Acc<T>;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= G * F) return;
  const A s = ref<const A>(block, score_i)[i / F];
  ref<T>(block, out_i)[i] = store<T>(load(ref<const T>(block, a_i)[i]) * s);
}

// One block per row: the score's gradient needs the whole row.
template <class T>
__global__ void act_backward_kernel(const void* block, int dh_i, int da_i, int h_i, int a_i,
                                    int score_i, int dscore_i, bool dscore_started, int64_t F,
                                    Activation act) {
  using A = Acc<T>;
  const int64_t m = blockIdx.x;
  const T* da = ref<const T>(block, da_i) + m * F;
  const T* h = ref<const T>(block, h_i) + m * 2 * F;
  const T* a = a_i >= 0 ? ref<const T>(block, a_i) + m * F : nullptr;
  T* dh = ref<T>(block, dh_i) + m * 2 * F;
  const A s = score_i >= 0 ? ref<const A>(block, score_i)[m] : A(1);
  const A alpha = A(act.alpha), limit = A(act.limit);
  A dot = 0;
  for (int64_t f = threadIdx.x; f < F; f += blockDim.x) {
    A g = load(da[f]);
    if (score_i >= 0) {
      dot += g * load(a[f]);
      g = load(store<T>(g * s));  // the host stores the scaled da, then reads it back
    }
    const GateUp c = gate_up(act.gpt_oss, f, F);
    const A g_raw = load(h[c.gate]), u_raw = load(h[c.up]);
    if (act.gpt_oss) {
      const A gate = g_raw < limit ? g_raw : limit;
      const A up = u_raw < -limit ? -limit : (u_raw > limit ? limit : u_raw);
      const A sig = sigmoid(alpha * gate);
      const A glu = gate * sig;
      const A dglu = sig + gate * alpha * sig * (A(1) - sig);
      dh[c.gate] = store<T>(g_raw <= limit ? g * (up + A(1)) * dglu : A(0));
      dh[c.up] = store<T>((u_raw >= -limit && u_raw <= limit) ? g * glu : A(0));
    } else {
      dh[c.gate] = store<T>(g * u_raw * silu_grad(g_raw));
      dh[c.up] = store<T>(g * silu(g_raw));
    }
  }
  if (dscore_i < 0) return;
  dot = block_sum(dot);
  if (threadIdx.x == 0) {
    A* dscore = ref<A>(block, dscore_i);
    dscore[m] = dscore_started ? dscore[m] + dot : dot;
  }
}

unsigned blocks_for(int64_t n) { return unsigned((n + kThreads - 1) / kThreads); }

#define TIERMOE_WITH_TYPE(t, launch) \
  do {                               \
    switch (t) {                     \
      case ElemType::f64: {          \
        using T = double;            \
        launch;                      \
        break;                       \
      }                              \
      case ElemType::f32: {          \
        using T = float;             \
        launch;                      \
        break;                       \
      }                              \
      case ElemType::bf16: {         \
        using T = __nv_bfloat16;     \
        launch;                      \
        break;                       \
      }                              \
    }                                \
    return cudaGetLastError();       \
  } while (0)

}  // namespace

cudaError_t act_forward(cudaStream_t stream, ElemType t, const void* block, int h, int a, int w2_in,
                        int b13, int score, int64_t G, int64_t F, Activation act) {
  TIERMOE_WITH_TYPE(t, (act_forward_kernel<T><<<blocks_for(G * F), kThreads, 0, stream>>>(
                           block, h, a, w2_in, b13, score, G, F, act)));
}

cudaError_t bias_forward(cudaStream_t stream, ElemType t, const void* block, int y, int b2,
                         int score, int64_t G, int64_t D) {
  TIERMOE_WITH_TYPE(t, (bias_forward_kernel<T>
                        <<<blocks_for(G * D), kThreads, 0, stream>>>(block, y, b2, score, G, D)));
}

cudaError_t row_dot(cudaStream_t stream, ElemType t, const void* block, int out, int x, int v,
                    int64_t G, int64_t D) {
  TIERMOE_WITH_TYPE(t,
                    (row_dot_kernel<T><<<unsigned(G), kThreads, 0, stream>>>(block, out, x, v, D)));
}

cudaError_t column_sum(cudaStream_t stream, ElemType t, const void* block, size_t started_offset,
                       int out, int in, int score, int64_t G, int64_t C) {
  TIERMOE_WITH_TYPE(t, (column_sum_kernel<T><<<blocks_for(C), kThreads, 0, stream>>>(
                           block, started_offset, out, in, score, G, C)));
}

cudaError_t scale_rows(cudaStream_t stream, ElemType t, const void* block, int out, int a,
                       int score, int64_t G, int64_t F) {
  TIERMOE_WITH_TYPE(t, (scale_rows_kernel<T>
                        <<<blocks_for(G * F), kThreads, 0, stream>>>(block, out, a, score, G, F)));
}

cudaError_t act_backward(cudaStream_t stream, ElemType t, const void* block, int dh, int da, int h,
                         int a, int score, int dscore, bool dscore_started, int64_t G, int64_t F,
                         Activation act) {
  TIERMOE_WITH_TYPE(t, (act_backward_kernel<T><<<unsigned(G), kThreads, 0, stream>>>(
                           block, dh, da, h, a, score, dscore, dscore_started, F, act)));
}

}  // namespace tiermoe::cuda
