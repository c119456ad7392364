#include "core/model/sparse_layers.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/base/random.h"
#include "core/model/hogwild_kernels.h"

namespace shardwild {
namespace {

// log(1 + exp(x)) without overflow.
inline double Softplus(double x) { return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x)); }

// a . b over d floats. Eight partial sums (a fixed order, so the result is
// deterministic) let the compiler vectorise the reduction without
// -ffast-math.
inline float Dot(const float* __restrict a, const float* __restrict b, int64_t d) {
  constexpr int kLanes = 8;
  float acc[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= d; j += kLanes) {
    for (int t = 0; t < kLanes; ++t) acc[t] += a[j + t] * b[j + t];
  }
  float s = 0;
  for (; j < d; ++j) s += a[j] * b[j];
  if (d >= kLanes) {
    for (int t = 0; t < kLanes; ++t) s += acc[t];
  }
  return s;
}

}  // namespace

void EmbeddingBagForward(const float* rows, int64_t dim, const int64_t* offsets, const float* weights, int64_t batch,
                         Pooling pooling, float* out, int64_t out_stride) {
  // The in-place forward's pooling (hogwild_kernels.h): each output float
  // summed in a register over the bag's entries, in their order (0 + w0 r0
  // + w1 r1 + ...), then scaled for a mean. Added into the output in memory,
  // each entry waited for the store of the one before (sparse_logreg, dim
  // 1, 1143 entries a step: forward 3.8 -> 1.5 us).
  PoolGatheredBags(rows, dim, offsets, weights, batch, pooling, out, out_stride);
}

void EmbeddingBagBackward(const float* dout, int64_t out_stride, int64_t dim, const int64_t* offsets,
                          const float* weights, int64_t batch, int64_t valid, Pooling pooling, float* drows,
                          float scale) {
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t begin = offsets[b], end = offsets[b + 1];
    if (b >= valid) {
      std::fill(drows + begin * dim, drows + end * dim, 0.0f);
      continue;
    }
    const float* g = dout + b * out_stride;
    const float pool = pooling == Pooling::kMean && end > begin ? 1.0f / static_cast<float>(end - begin) : 1.0f;
    if (dim == 1) {
      // One float a row: a loop over the bag the compiler vectorises, the
      // same products in the same order as below (sparse_logreg's 1143
      // weighted entries a step: 0.8 -> 0.2 us).
      const float g0 = g[0];
      if (weights != nullptr) {
        for (int64_t i = begin; i < end; ++i) drows[i] = weights[i] * pool * scale * g0;
      } else {
        for (int64_t i = begin; i < end; ++i) drows[i] = 1.0f * pool * scale * g0;
      }
      continue;
    }
    for (int64_t i = begin; i < end; ++i) {
      const float w = (weights ? weights[i] : 1.0f) * pool * scale;
      float* d = drows + i * dim;
      for (int64_t j = 0; j < dim; ++j) d[j] = w * g[j];
    }
  }
}

int64_t DotInteractionWidth(int64_t n, int64_t d, bool with_first) {
  return (with_first ? d : 0) + n * (n - 1) / 2;
}

void DotInteractionForward(const float* z, int64_t batch, int64_t n, int64_t d, bool with_first, float* out,
                           int64_t out_stride) {
  for (int64_t b = 0; b < batch; ++b) {
    const float* zb = z + b * n * d;
    float* o = out + b * out_stride;
    if (with_first) {
      std::memcpy(o, zb, d * sizeof(float));
      o += d;
    }
    for (int64_t k = 1; k < n; ++k) {
      const float* zk = zb + k * d;
      for (int64_t l = 0; l < k; ++l) *o++ = Dot(zk, zb + l * d, d);
    }
  }
}

void DotInteractionBackward(const float* z, const float* dout, int64_t out_stride, int64_t batch, int64_t n, int64_t d,
                            bool with_first, float* dz) {
  // dz_k = sum over l != k (in order) of g_kl z_l, g symmetric, with g_kl for
  // k > l at k(k-1)/2 + l; then dz_0 += the copied part's gradient. Each dz_k
  // is built in blocks of kBlock columns held in registers while the other
  // vectors stream past; the remaining columns one at a time.
  constexpr int kBlock = 16;
  for (int64_t b = 0; b < batch; ++b) {
    const float* zb = z + b * n * d;
    float* dzb = dz + b * n * d;
    const float* first = with_first ? dout + b * out_stride : nullptr;
    const float* g = dout + b * out_stride + (with_first ? d : 0);
    for (int64_t k = 0; k < n; ++k) {
      float* dzk = dzb + k * d;
      const float* gk = g + k * (k - 1) / 2;  // g_kl for l < k
      int64_t j0 = 0;
      for (; j0 + kBlock <= d; j0 += kBlock) {
        float acc[kBlock] = {};
        for (int64_t l = 0; l < k; ++l) {
          const float gkl = gk[l];
          const float* zl = zb + l * d + j0;
          for (int t = 0; t < kBlock; ++t) acc[t] += gkl * zl[t];
        }
        for (int64_t l = k + 1; l < n; ++l) {
          const float glk = g[l * (l - 1) / 2 + k];
          const float* zl = zb + l * d + j0;
          for (int t = 0; t < kBlock; ++t) acc[t] += glk * zl[t];
        }
        std::memcpy(dzk + j0, acc, sizeof(acc));
      }
      for (int64_t j = j0; j < d; ++j) {
        float s = 0;
        for (int64_t l = 0; l < k; ++l) s += gk[l] * zb[l * d + j];
        for (int64_t l = k + 1; l < n; ++l) s += g[l * (l - 1) / 2 + k] * zb[l * d + j];
        dzk[j] = s;
      }
    }
    if (first != nullptr) {
      for (int64_t j = 0; j < d; ++j) dzb[j] += first[j];
    }
  }
}

void DropoutForward(float* y, float* mask, int64_t n, float rate, uint64_t* rng_state) {
  if (rate <= 0.0f) {
    std::fill(mask, mask + n, 1.0f);
    return;
  }
  const float keep = 1.0f / (1.0f - rate);
  // Keep with probability 1 - rate: compare 24 random bits with rate * 2^24.
  const uint32_t threshold = static_cast<uint32_t>(static_cast<double>(rate) * 16777216.0);
  int64_t i = 0;
  while (i < n) {
    uint64_t bits = SplitMix64(*rng_state);
    for (int part = 0; part < 2 && i < n; ++part, ++i) {
      const uint32_t u = static_cast<uint32_t>(bits & 0xFFFFFF);
      bits >>= 32;
      mask[i] = u >= threshold ? keep : 0.0f;
      y[i] *= mask[i];
    }
  }
}

void DropoutBackward(float* dy, const float* mask, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dy[i] *= mask[i];
}

LossResult SigmoidBinaryCrossEntropy(const float* logits, const int32_t* labels, int64_t valid, int64_t batch,
                                     float* dlogits) {
  LossResult r;
  const double inv = valid > 0 ? 1.0 / static_cast<double>(valid) : 0.0;
  for (int64_t i = 0; i < valid; ++i) {
    const double z = logits[i];
    const int y = labels[i] != 0 ? 1 : 0;
    // -[y log s(z) + (1-y) log(1 - s(z))] = softplus(z) - y z
    r.loss_sum += Softplus(z) - y * z;
    r.correct += ((z > 0) ? 1 : 0) == y;
    if (dlogits) {
      const double p = z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z));
      dlogits[i] = static_cast<float>((p - y) * inv);
    }
  }
  if (dlogits) std::fill(dlogits + valid, dlogits + batch, 0.0f);
  return r;
}

LossResult MeanSquaredError(const float* predictions, const float* targets, int64_t valid, int64_t batch,
                            float* dpredictions) {
  LossResult r;
  const double inv = valid > 0 ? 1.0 / static_cast<double>(valid) : 0.0;
  for (int64_t i = 0; i < valid; ++i) {
    const double e = static_cast<double>(predictions[i]) - targets[i];
    r.loss_sum += e * e;
    if (dpredictions) dpredictions[i] = static_cast<float>(2.0 * e * inv);
  }
  if (dpredictions) std::fill(dpredictions + valid, dpredictions + batch, 0.0f);
  return r;
}

LossResult SoftmaxCrossEntropyMultiLabel(const float* logits, const int64_t* label_offsets, const int32_t* label_sets,
                                         int64_t valid, int64_t batch, int64_t k, float* dlogits) {
  LossResult r;
  const double inv = valid > 0 ? 1.0 / static_cast<double>(valid) : 0.0;
  for (int64_t i = 0; i < valid; ++i) {
    const float* z = logits + i * k;
    const int64_t arg = std::max_element(z, z + k) - z;
    const double m = z[arg];
    // As in SoftmaxCrossEntropy, the exponentials of up to
    // kKeptExponentials classes are kept for the gradient.
    double e[kKeptExponentials];
    const bool keep = k <= kKeptExponentials;
    double sum = 0;
    for (int64_t c = 0; c < k; ++c) {
      const double x = std::exp(z[c] - m);
      if (keep) e[c] = x;
      sum += x;
    }
    const double log_sum = std::log(sum);
    const int64_t begin = label_offsets[i], end = label_offsets[i + 1];
    const double t = end > begin ? 1.0 / static_cast<double>(end - begin) : 0.0;
    bool hit = false;
    for (int64_t j = begin; j < end; ++j) {
      const int32_t c = label_sets[j];
      r.loss_sum -= t * (z[c] - m - log_sum);
      hit = hit || c == arg;
    }
    r.correct += hit;
    if (dlogits && end == begin) {
      // No target: the row's loss is 0 whatever the logits, and so is its gradient.
      std::fill(dlogits + i * k, dlogits + (i + 1) * k, 0.0f);
    } else if (dlogits) {
      float* d = dlogits + i * k;
      if (keep) {
        for (int64_t c = 0; c < k; ++c) d[c] = static_cast<float>(e[c] / sum * inv);
      } else {
        for (int64_t c = 0; c < k; ++c) d[c] = static_cast<float>(std::exp(z[c] - m - log_sum) * inv);
      }
      for (int64_t j = begin; j < end; ++j) d[label_sets[j]] -= static_cast<float>(t * inv);
    }
  }
  if (dlogits) std::fill(dlogits + valid * k, dlogits + batch * k, 0.0f);
  return r;
}

}  // namespace shardwild
