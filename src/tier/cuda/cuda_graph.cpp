#include "cuda_graph.h"

#include <climits>
#include <type_traits>

#include "cuda_check.h"
#include "expert_kernels.h"

namespace tiermoe::cuda {

namespace {

constexpr const char* kWhere = "CUDA expert graph";

cudaDataType blas_type(DType d) {
  switch (d) {
    case DType::f64:
      return CUDA_R_64F;
    case DType::f32:
      return CUDA_R_32F;
    case DType::bf16:
      return CUDA_R_16BF;
  }
  __builtin_unreachable();
}

ElemType elem_type(DType d) {
  switch (d) {
    case DType::f64:
      return ElemType::f64;
    case DType::f32:
      return ElemType::f32;
    case DType::bf16:
      return ElemType::bf16;
  }
  __builtin_unreachable();
}

int as_int(int64_t v) {
  TIERMOE_ASSERT(v >= 0 && v <= INT_MAX, "GEMM size ", v, " past cuBLAS's int");
  return int(v);
}

// Enqueues the plan's steps on the stream being captured.
class StepRecorder {
 public:
  StepRecorder(const ExpertPlan& plan, const BlasContext& blas, cudaStream_t stream,
               const void* block)
      : plan_(plan), blas_(blas), stream_(stream), block_(static_cast<const char*>(block)) {
    const GraphKey& k = plan.key;
    act_.gpt_oss = k.activation == ExpertActivation::gpt_oss;
    act_.alpha = k.gpt_oss.alpha;
    act_.limit = k.gpt_oss.limit;
    t_ = elem_type(k.dtype);
  }

  // f32 in f32 (no TF32), bf16 products with f32 accumulation, f64 in f64.
  void operator()(const GemmStep& g) const {
    const auto& lib = CublasLibrary::get();
    auto array = [&](int ref) {
      return reinterpret_cast<const void* const*>(block_ + size_t(ref) * sizeof(uint64_t));
    };
    const cublasComputeType_t compute =
        plan_.key.dtype == DType::f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
    check_cublas(
        lib.gemm_batched(blas_.handle, g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                         g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, as_int(g.m), as_int(g.n),
                         as_int(g.k), block_ + plan_.one_offset(), array(g.a),
                         blas_type(plan_.refs[size_t(g.a)].dtype), as_int(g.lda), array(g.b),
                         blas_type(plan_.refs[size_t(g.b)].dtype), as_int(g.ldb),
                         block_ + plan_.beta_offset(g.beta), const_cast<void* const*>(array(g.c)),
                         blas_type(plan_.refs[size_t(g.c)].dtype), as_int(g.ldc), 1, compute,
                         CUBLAS_GEMM_DEFAULT),
        "cublasGemmBatchedEx", kWhere);
  }
  void operator()(const ActForwardStep& s) const {
    check(act_forward(stream_, t_, block_, s.h, s.a, s.w2_in, s.b13, s.score, rows(), F(), act_),
          "act_forward");
  }
  void operator()(const BiasForwardStep& s) const {
    check(bias_forward(stream_, t_, block_, s.y, s.b2, s.score, rows(), D()), "bias_forward");
  }
  void operator()(const RowDotStep& s) const {
    check(row_dot(stream_, t_, block_, s.out, s.x, s.v, rows(), D()), "row_dot");
  }
  void operator()(const ColumnSumStep& s) const {
    const int64_t C = shape_numel(plan_.refs[size_t(s.out)].shape);
    check(
        column_sum(stream_, t_, block_, plan_.sum_started_offset, s.out, s.in, s.score, rows(), C),
        "column_sum");
  }
  void operator()(const ScaleRowsStep& s) const {
    check(scale_rows(stream_, t_, block_, s.out, s.a, s.score, rows(), F()), "scale_rows");
  }
  void operator()(const ActBackwardStep& s) const {
    check(act_backward(stream_, t_, block_, s.dh, s.da, s.h, s.a, s.score, s.dscore,
                       s.dscore_started, rows(), F(), act_),
          "act_backward");
  }

 private:
  int64_t rows() const { return plan_.key.G; }
  int64_t D() const { return plan_.key.D; }
  int64_t F() const { return plan_.key.F; }
  void check(cudaError_t e, const char* kernel) const {
    if (e != cudaSuccess) throw_cuda(e, kernel, std::string(kWhere) + " " + plan_.key.str());
  }

  const ExpertPlan& plan_;
  const BlasContext& blas_;
  cudaStream_t stream_;
  const char* block_;
  Activation act_;
  ElemType t_ = ElemType::f32;
};

}  // namespace

CudaExpertGraph::CudaExpertGraph(const GraphKey& key, const BlasContext& blas,
                                 cudaStream_t capture_stream)
    : Graph(key), name_(key.str()), plan_(plan_expert_graph(key)) {
  try {
    TIERMOE_CUDA(cudaMalloc(&arg_block_, plan_.arg_bytes), kWhere);
    if (plan_.scratch_bytes > 0) TIERMOE_CUDA(cudaMalloc(&scratch_, plan_.scratch_bytes), kWhere);
    capture(blas, capture_stream);
  } catch (...) {
    release();
    throw;
  }
}

CudaExpertGraph::~CudaExpertGraph() { release(); }

void CudaExpertGraph::release() {
  // Teardown cannot report: a sticky CUDA error has surfaced through sync().
  if (exec_) cudaGraphExecDestroy(exec_);
  if (graph_) cudaGraphDestroy(graph_);
  if (scratch_) cudaFree(scratch_);
  if (arg_block_) cudaFree(arg_block_);
  exec_ = nullptr, graph_ = nullptr, scratch_ = nullptr, arg_block_ = nullptr;
}

size_t CudaExpertGraph::device_bytes() const { return plan_.arg_bytes + plan_.scratch_bytes; }

void CudaExpertGraph::capture(const BlasContext& blas, cudaStream_t stream) {
  const auto& lib = CublasLibrary::get();
  check_cublas(lib.set_stream(blas.handle, stream), "cublasSetStream", kWhere);
  check_cublas(lib.set_workspace(blas.handle, blas.workspace, blas.workspace_bytes),
               "cublasSetWorkspace", kWhere);
  check_cublas(lib.set_pointer_mode(blas.handle, CUBLAS_POINTER_MODE_DEVICE),
               "cublasSetPointerMode", kWhere);
  // Thread-local: the device's feeder thread keeps issuing transfers on its
  // own streams while this thread captures.
  TIERMOE_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), kWhere);
  const StepRecorder record(plan_, blas, stream, arg_block_);
  try {
    for (const PlanStep& step : plan_.steps) std::visit(record, step);
  } catch (...) {
    cudaGraph_t partial = nullptr;
    cudaStreamEndCapture(stream, &partial);
    if (partial) cudaGraphDestroy(partial);
    throw;
  }
  TIERMOE_CUDA(cudaStreamEndCapture(stream, &graph_), kWhere);
  TIERMOE_CUDA(cudaGraphInstantiate(&exec_, graph_, 0), kWhere);
}

}  // namespace tiermoe::cuda
