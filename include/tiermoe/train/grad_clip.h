#pragma once
// Global-norm gradient clipping, torch.nn.utils.clip_grad_norm_ semantics:
//   total = sqrt(sum over all grads of g^2)
//   coef  = max_norm / (total + 1e-6); when coef < 1, every grad *= coef
// and the pre-clip total is returned.
//
// The sum of squares accumulates in f64 for every grad dtype, in fixed
// blocks added in order, so the norm is the same bits for any thread count
// (torch sums in the grad dtype; the two agree to fp32 rounding, not
// bitwise). coef is computed in f64 and rounded to the grad dtype for the
// multiply; torch multiplies by 1.0 when coef >= 1, which we skip (exact).
//
// The order of the sum does not depend on how experts are split over
// ranks: first every parameter that is no routed expert's (Parameter::expert
// < 0), in list order; then expert 0's parameters (all layers, in list
// order), expert 1's, and so on. With expert parallelism each rank sums its
// own experts' and an allgather brings every expert's sum in expert order,
// so every rank gets the one-rank bits.
//
// A non-finite total is the trainer's NaN guard: it throws Error naming the
// first parameter (in list order) whose grad holds a NaN or Inf, before any
// grad is touched (under expert parallelism, on the rank that holds it; the
// others name that rank).
#include <span>

#include "tiermoe/dist/comm.h"
#include "tiermoe/train/parameter.h"

namespace tiermoe {

// The global L2 norm of all grads (over every rank of `comm`, when given);
// throws Error on a non-finite norm.
double global_grad_norm(std::span<const Parameter> params, Comm* comm = nullptr);
// Clips in place; returns the pre-clip global norm. max_norm must be > 0.
double clip_grad_norm(std::span<Parameter> params, double max_norm, Comm* comm = nullptr);

}  // namespace tiermoe
