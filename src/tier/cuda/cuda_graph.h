#pragma once
// One expert graph on the GPU: an ExpertPlan captured once into a CUDA graph
// (cuBLAS batched GEMMs of batch 1 reading their matrix pointers and scalars
// from the argument block, the device's own kernels for the rest) and
// instantiated; its argument block and scratch live with it. A launch writes
// the block (cudaMemcpyAsync on the compute stream) and replays the graph.
#include <cuda_runtime.h>

#include <string>

#include "../expert_plan.h"
#include "cublas_library.h"
#include "tiermoe/tier/device.h"

namespace tiermoe::cuda {

// The cuBLAS handle graphs are captured with and its workspace (set again
// after each cublasSetStream, which resets it).
struct BlasContext {
  cublasHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

class CudaExpertGraph final : public Graph {
 public:
  // Plans and captures `key` on `capture` (a stream of the device's GPU that
  // nothing else uses). DeviceError on a CUDA or cuBLAS failure, Error on a
  // key no graph exists for.
  CudaExpertGraph(const GraphKey& key, const BlasContext& blas, cudaStream_t capture);
  ~CudaExpertGraph() override;
  CudaExpertGraph(const CudaExpertGraph&) = delete;
  CudaExpertGraph& operator=(const CudaExpertGraph&) = delete;

  const std::string& name() const { return name_; }  // key().str()
  const ExpertPlan& plan() const { return plan_; }
  void* arg_block() const { return arg_block_; }  // device, plan().arg_bytes
  uint64_t scratch() const { return uint64_t(reinterpret_cast<uintptr_t>(scratch_)); }
  cudaGraphExec_t exec() const { return exec_; }
  size_t device_bytes() const;  // argument block and scratch

 private:
  void capture(const BlasContext& blas, cudaStream_t stream);
  void release();

  std::string name_;
  ExpertPlan plan_;
  void* arg_block_ = nullptr;
  void* scratch_ = nullptr;
  cudaGraph_t graph_ = nullptr;
  cudaGraphExec_t exec_ = nullptr;
};

}  // namespace tiermoe::cuda
