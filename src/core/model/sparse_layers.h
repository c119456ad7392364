// The layers of sparse models with explicit forward and backward passes:
// EmbeddingBag pooling, DLRM's dot interaction, dropout, and the losses of
// the binary and regression heads and of multi-label softmax.
//
// Plain loops over caller-owned buffers (the model's); nothing here
// allocates, keeps state between calls or is shared between threads, so
// each function is thread-safe on distinct buffers.
#pragma once

#include <cstdint>

#include "core/model/layers.h"
#include "core/config/options.h"

namespace shardwild {

// EmbeddingBag: for each of `batch` bags b,
//   out[b * out_stride + 0..dim) = pool over i in [offsets[b], offsets[b+1]) of w_i * rows[i * dim + 0..dim)
// with w_i = weights ? weights[i] : 1. kSum: the sum; kMean: the sum divided
// by the number of ids in the bag (not by the weight sum). An empty bag
// gives zeros. `rows` holds the pulled rows of the batch's ids in order
// ([offsets[batch] x dim]); offsets[0] == 0.
void EmbeddingBagForward(const float* rows, int64_t dim, const int64_t* offsets, const float* weights, int64_t batch,
                         Pooling pooling, float* out, int64_t out_stride);

// The gradient wrt each pulled row: drows[i * dim ..] = scale * w_i * dout[b]
// (/ n_b for kMean) for each id i of bag b < valid; the rows of bags
// b >= valid (the padding of a short last batch) get zeros. `scale` 1 leaves
// the products exactly as without it.
void EmbeddingBagBackward(const float* dout, int64_t out_stride, int64_t dim, const int64_t* offsets,
                          const float* weights, int64_t batch, int64_t valid, Pooling pooling, float* drows,
                          float scale = 1.0f);

// DLRM's dot interaction over n vectors of width d per sample, vector k of
// sample b at z[b * n * d + k * d]. Output row b, at out[b * out_stride]:
// with_first: z[b, 0, :] copied (d floats), then the dot products z_k . z_l
// of every pair k > l in DLRM's order (k = 1..n-1, l = 0..k-1).
void DotInteractionForward(const float* z, int64_t batch, int64_t n, int64_t d, bool with_first, float* out,
                           int64_t out_stride);
// dz (overwritten, [batch, n, d]) from dout; with_first adds the copied
// part's gradient to dz[b, 0, :].
void DotInteractionBackward(const float* z, const float* dout, int64_t out_stride, int64_t batch, int64_t n, int64_t d,
                            bool with_first, float* dz);
// The output width: (with_first ? d : 0) + n(n-1)/2.
int64_t DotInteractionWidth(int64_t n, int64_t d, bool with_first);

// Inverted dropout: mask[i] = 1/(1-rate) with probability 1-rate, else 0,
// drawn from *rng_state (a SplitMix64 stream, core/base/random.h; the same state
// gives the same mask, and the state moves on), and y *= mask. rate must be
// in [0, 1); rate 0 leaves y as it is and sets the mask to 1 (drawing nothing).
void DropoutForward(float* y, float* mask, int64_t n, float rate, uint64_t* rng_state);
// dy *= mask.
void DropoutBackward(float* dy, const float* mask, int64_t n);

// The losses use the conventions of SoftmaxCrossEntropy (layers.h): the
// gradient is of the MEAN loss over the first `valid` rows, padding rows
// (valid..batch) get zero gradient, and the gradient pointer may be nullptr
// (evaluation).

// Binary: one logit per row, labels 0/1; numerically stable BCE with
// logits. correct = (logit > 0) == label.
LossResult SigmoidBinaryCrossEntropy(const float* logits, const int32_t* labels, int64_t valid, int64_t batch,
                                     float* dlogits);
// Regression: squared error (p - t)^2 summed; gradient 2(p - t) / valid. correct = 0.
LossResult MeanSquaredError(const float* predictions, const float* targets, int64_t valid, int64_t batch,
                            float* dpredictions);
// Softmax whose target spreads evenly over each row's labels (multi-label
// fastText data): row r's labels are label_sets[label_offsets[r] ..
// label_offsets[r+1]) (label_offsets[0] == 0). loss = -sum_c t_c log
// softmax(z)_c; dz = (softmax - t) / valid; correct = the arg-max is among
// the row's labels. A row without labels has no target: it adds no loss, is
// not correct and gets zero gradient. Labels must be in [0, k); a label
// repeated in a row counts as often as it appears. With one label per row
// it is SoftmaxCrossEntropy.
LossResult SoftmaxCrossEntropyMultiLabel(const float* logits, const int64_t* label_offsets, const int32_t* label_sets,
                                         int64_t valid, int64_t batch, int64_t k, float* dlogits);

}  // namespace shardwild
