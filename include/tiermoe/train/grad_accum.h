#pragma once
// Gradient accumulation over micro-batches.
//
// Where the division happens: each micro-batch's backward accumulates (+=)
// the gradient of its own, unscaled mean loss; after the last micro-batch,
// average_accumulated_grads divides every gradient by accum_steps once,
// before clipping and the optimizer step. Hugging Face's Trainer divides each
// micro-batch loss by accum_steps before backward instead; the two agree up
// to rounding, and dividing once rounds once (exactly, for powers of two).
#include <cstdint>
#include <span>

#include "tiermoe/train/parameter.h"

namespace tiermoe {

// Zeroes every gradient (before the first micro-batch of a step).
void zero_grads(std::span<Parameter> params);
// grad *= factor, with factor rounded to the grad dtype (torch's mul_ by a
// Python float).
void scale_grads(std::span<Parameter> params, double factor);
// grad /= accum_steps, each element divided (not multiplied by 1/n), so the
// result is the correctly rounded mean of the accumulated sums.
void average_accumulated_grads(std::span<Parameter> params, int64_t accum_steps);

}  // namespace tiermoe
