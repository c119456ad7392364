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
#include <string>
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
//
// With Precision::kBf16 the three matmuls take bf16 operands and accumulate
// in f32: Forward rounds x and W (unless the caller gives W in bf16) to
// bf16 (oneDNN reorders into buffers the layer owns) before the matmul, Backward rounds dL/d(pre-activation) after
// the activation's derivative. Every buffer the caller sees stays f32: y,
// dx, dW and db come out f32, the bias is added in f32. Create fails with
// one line when the CPU (or ONEDNN_MAX_CPU_ISA) gives oneDNN no bf16
// instructions, rather than running the matmuls emulated.
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
    // bf16 only: the weights already in bf16 ([in, out]), kept by the caller
    // (a pull that converts as it copies); Forward then reads them as they
    // are and ignores w. Null: Forward rounds w itself.
    const uint16_t* w16 = nullptr;
  };

  // Builds the forward, backward-data and backward-weights primitives.
  static absl::StatusOr<std::unique_ptr<DenseLayer>> Create(const dnnl::engine& engine, int64_t batch, int64_t in,
                                                            int64_t out, Activation act, const Buffers& buffers,
                                                            Precision precision = Precision::kF32);

  void Forward(const dnnl::stream& stream);
  void Backward(const dnnl::stream& stream);

  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // Multiply-adds x2 of one forward pass and of one backward pass.
  double ForwardFlops() const { return 2.0 * batch_ * in_ * out_; }
  double BackwardFlops() const { return (buffers_.dx ? 4.0 : 2.0) * batch_ * in_ * out_; }
  Precision precision() const { return precision_; }
  // The implementation oneDNN chose for the forward matmul (its
  // impl_info_str, e.g. "brg:avx512_core_bf16"): what ONEDNN_VERBOSE
  // would print for it.
  const std::string& forward_impl() const { return forward_impl_; }

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
  Precision precision_ = Precision::kF32;
  Buffers buffers_;
  std::vector<char> scratch_;
  Exec fwd_, bwd_data_, bwd_weights_;
  // bf16: the rounded copies of x, W and dL/d(pre-activation), and the
  // reorders that fill them.
  std::vector<uint16_t> x16_, w16_, dy16_;
  Exec x_to16_, w_to16_, dy_to16_;
  bool has_bwd_data_ = false;
  std::string forward_impl_;
};

// Result of a loss over one batch (this one and those in sparse_layers.h).
struct LossResult {
  double loss_sum = 0;    // sum of the per-row loss over the valid rows (here: -log softmax(logits)[label])
  int64_t correct = 0;    // valid rows predicted right (here: whose arg-max equals the label)
};

// The softmax losses keep the exponentials of rows of up to this many
// classes (on the stack) for the gradient, instead of computing them twice
// (the text config, 16 rows of 8 classes, 8 alternating rounds on the
// 2-core EPYC VM: backward 3.10 -> 2.50 us, the step 14.75 -> 14.28 us).
inline constexpr int64_t kKeptExponentials = 64;

// Softmax cross-entropy over `valid` rows of `logits` ([batch, k]). Writes
// dlogits = (softmax - onehot(label)) / valid for valid rows and zeros for
// the padding rows (valid..batch). dlogits may be nullptr (evaluation).
// Labels must be in [0, k).
LossResult SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t valid, int64_t batch, int64_t k,
                               float* dlogits);

}  // namespace shardwild
