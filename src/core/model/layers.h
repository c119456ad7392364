// Layers with explicit forward and backward passes, and the loss.
//
// A layer works on buffers that its owner (the model) allocates once and
// keeps at fixed addresses; oneDNN primitives and memory objects are created
// once, in Create(), and each call only executes them. Forward/Backward
// allocate nothing in Shardwild's code; arguments are passed to oneDNN
// through pre-built C argument arrays, and each primitive uses a
// caller-owned scratchpad (scratchpad_mode::user).
//
// A layer object is used by one thread at a time (it belongs to a worker).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "core/config/options.h"
#include "oneapi/dnnl/dnnl.hpp"

namespace shardwild {

// y = act(x W + b) for a fixed batch size. W is [in, out] row-major and b is
// [out]. The activation is fused into the forward matmul as a oneDNN eltwise
// post-op (ReLU: eltwise_relu, sigmoid: eltwise_logistic, tanh:
// eltwise_tanh); its derivative is applied in Backward from y (ReLU: y > 0,
// sigmoid: y(1 - y), tanh: 1 - y^2).
class DenseLayer {
 public:
  struct Buffers {
    const float* x = nullptr;  // [batch, in]   input (read by forward and backward-weights)
    float* y = nullptr;        // [batch, out]  output
    const float* w = nullptr;  // [in, out]     weights
    const float* b = nullptr;  // [out]         bias
    float* dy = nullptr;       // [batch, out]  in: dL/dy; Backward turns it into dL/d(pre-activation)
    float* dx = nullptr;       // [batch, in]   out: dL/dx, or nullptr to skip backward-data (first layer)
    float* dw = nullptr;       // [in, out]     out: dL/dW (overwritten)
    float* db = nullptr;       // [out]         out: dL/db (overwritten)
  };

  // Builds the forward, backward-data and backward-weights primitives.
  static absl::StatusOr<std::unique_ptr<DenseLayer>> Create(const dnnl::engine& engine, int64_t batch, int64_t in,
                                                            int64_t out, Activation act, const Buffers& buffers);

  void Forward(const dnnl::stream& stream);
  void Backward(const dnnl::stream& stream);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // Multiply-adds x2 of one forward pass and of one backward pass.
  double ForwardFlops() const { return 2.0 * batch_ * in_ * out_; }
  double BackwardFlops() const { return (buffers_.dx ? 4.0 : 2.0) * batch_ * in_ * out_; }

 private:
  struct Exec {
    dnnl::primitive prim;
    std::vector<dnnl::memory> mems;      // keeps the memory objects alive
    std::vector<dnnl_exec_arg_t> args;   // pre-built C argument list
  };
  DenseLayer() = default;
  void Run(const Exec& e, const dnnl::stream& s);

  int64_t batch_ = 0, in_ = 0, out_ = 0;
  Activation act_ = Activation::kNone;
  Buffers buffers_;
  std::vector<char> scratch_;
  Exec fwd_, bwd_data_, bwd_weights_;
  bool has_bwd_data_ = false;
};

// Result of a loss over one batch (this one and those in sparse_layers.h).
struct LossResult {
  double loss_sum = 0;    // sum of the per-row loss over the valid rows (here: -log softmax(logits)[label])
  int64_t correct = 0;    // valid rows predicted right (here: whose arg-max equals the label)
};

// Softmax cross-entropy over `valid` rows of `logits` ([batch, k]). Writes
// dlogits = (softmax - onehot(label)) / valid for valid rows and zeros for
// the padding rows (valid..batch). dlogits may be nullptr (evaluation).
// Labels must be in [0, k).
LossResult SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t valid, int64_t batch, int64_t k,
                               float* dlogits);

}  // namespace shardwild
