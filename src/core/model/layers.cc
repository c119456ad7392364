#include "core/model/layers.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace shardwild {
namespace {

using dnnl::memory;
using tag = memory::format_tag;
using dt = memory::data_type;

memory::desc Md(int64_t rows, int64_t cols, tag t) { return memory::desc({rows, cols}, dt::f32, t); }

}  // namespace

void DenseLayer::Run(const Exec& e, const dnnl::stream& s) {
  dnnl_primitive_execute(e.prim.get(), s.get(), static_cast<int>(e.args.size()), e.args.data());
}

absl::StatusOr<std::unique_ptr<DenseLayer>> DenseLayer::Create(const dnnl::engine& engine, int64_t batch, int64_t in,
                                                               int64_t out, Activation act, const Buffers& buffers) {
  if (batch < 1 || in < 1 || out < 1) {
    return absl::InvalidArgumentError(absl::StrCat("dense layer: bad shape batch=", batch, " in=", in, " out=", out));
  }
  std::unique_ptr<DenseLayer> l(new DenseLayer());
  l->batch_ = batch;
  l->in_ = in;
  l->out_ = out;
  l->act_ = act;
  l->buffers_ = buffers;
  l->has_bwd_data_ = buffers.dx != nullptr;
  try {
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    dnnl::primitive_attr fwd_attr;
    fwd_attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (act != Activation::kNone) {
      const dnnl::algorithm alg = act == Activation::kRelu      ? dnnl::algorithm::eltwise_relu
                                  : act == Activation::kSigmoid ? dnnl::algorithm::eltwise_logistic
                                                                : dnnl::algorithm::eltwise_tanh;
      dnnl::post_ops po;
      po.append_eltwise(1.0f, alg, 0.0f, 0.0f);
      fwd_attr.set_post_ops(po);
    }
    auto handle = [](const void* p) { return const_cast<void*>(p); };

    // Forward: y[B,out] = x[B,in] * W[in,out] + b.
    const auto x_md = Md(batch, in, tag::ab), w_md = Md(in, out, tag::ab), b_md = Md(1, out, tag::ab),
               y_md = Md(batch, out, tag::ab);
    dnnl::matmul::primitive_desc fwd_pd(dnnl::matmul::desc(x_md, w_md, b_md, y_md), fwd_attr, engine);
    // Backward data: dx[B,in] = dy[B,out] * W^T, W^T viewed as [out,in] with strides (1, out).
    const auto dx_md = Md(batch, in, tag::ab), wt_md = Md(out, in, tag::ba);
    // Backward weights: dW[in,out] = x^T * dy, x^T viewed as [in,B] with strides (1, in).
    const auto xt_md = Md(in, batch, tag::ba), dw_md = Md(in, out, tag::ab);
    dnnl::matmul::primitive_desc bwd_w_pd(dnnl::matmul::desc(xt_md, y_md, dw_md), attr, engine);

    size_t scratch = std::max(fwd_pd.scratchpad_desc().get_size(), bwd_w_pd.scratchpad_desc().get_size());
    std::unique_ptr<dnnl::matmul::primitive_desc> bwd_d_pd;
    if (l->has_bwd_data_) {
      bwd_d_pd = std::make_unique<dnnl::matmul::primitive_desc>(dnnl::matmul::desc(y_md, wt_md, dx_md), attr, engine);
      scratch = std::max(scratch, bwd_d_pd->scratchpad_desc().get_size());
    }
    l->scratch_.resize(std::max<size_t>(scratch, 64));
    memory scratch_mem(memory::desc({static_cast<int64_t>(l->scratch_.size())}, dt::u8, tag::a), engine,
                       l->scratch_.data());

    auto build = [&](Exec* e, const dnnl::primitive& prim, std::vector<std::pair<int, memory>> args) {
      e->prim = prim;
      args.emplace_back(DNNL_ARG_SCRATCHPAD, scratch_mem);
      for (auto& [arg, mem] : args) {
        e->mems.push_back(mem);
        e->args.push_back({arg, mem.get()});
      }
    };
    build(&l->fwd_, dnnl::matmul(fwd_pd),
          {{DNNL_ARG_SRC, memory(x_md, engine, handle(buffers.x))},
           {DNNL_ARG_WEIGHTS, memory(w_md, engine, handle(buffers.w))},
           {DNNL_ARG_BIAS, memory(b_md, engine, handle(buffers.b))},
           {DNNL_ARG_DST, memory(y_md, engine, buffers.y)}});
    build(&l->bwd_weights_, dnnl::matmul(bwd_w_pd),
          {{DNNL_ARG_SRC, memory(xt_md, engine, handle(buffers.x))},
           {DNNL_ARG_WEIGHTS, memory(y_md, engine, buffers.dy)},
           {DNNL_ARG_DST, memory(dw_md, engine, buffers.dw)}});
    if (l->has_bwd_data_) {
      build(&l->bwd_data_, dnnl::matmul(*bwd_d_pd),
            {{DNNL_ARG_SRC, memory(y_md, engine, buffers.dy)},
             {DNNL_ARG_WEIGHTS, memory(wt_md, engine, handle(buffers.w))},
             {DNNL_ARG_DST, memory(dx_md, engine, buffers.dx)}});
    }
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN could not build a dense layer ", in, "x", out, ": ", e.what()));
  }
  return l;
}

void DenseLayer::Forward(const dnnl::stream& stream) { Run(fwd_, stream); }

void DenseLayer::Backward(const dnnl::stream& stream) {
  float* dy = buffers_.dy;
  const int64_t n = batch_ * out_;
  // The activation's derivative, from its output y.
  const float* y = buffers_.y;
  switch (act_) {
    case Activation::kNone: break;
    case Activation::kRelu:
      for (int64_t i = 0; i < n; ++i) dy[i] = y[i] > 0.0f ? dy[i] : 0.0f;
      break;
    case Activation::kSigmoid:
      for (int64_t i = 0; i < n; ++i) dy[i] *= y[i] * (1.0f - y[i]);
      break;
    case Activation::kTanh:
      for (int64_t i = 0; i < n; ++i) dy[i] *= 1.0f - y[i] * y[i];
      break;
  }
  float* db = buffers_.db;
  std::fill(db, db + out_, 0.0f);
  for (int64_t r = 0; r < batch_; ++r) {
    const float* row = dy + r * out_;
    for (int64_t o = 0; o < out_; ++o) db[o] += row[o];
  }
  Run(bwd_weights_, stream);
  if (has_bwd_data_) Run(bwd_data_, stream);
}

LossResult SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t valid, int64_t batch, int64_t k,
                               float* dlogits) {
  LossResult r;
  const float inv = valid > 0 ? 1.0f / static_cast<float>(valid) : 0.0f;
  for (int64_t b = 0; b < valid; ++b) {
    const float* z = logits + b * k;
    const int32_t label = labels[b];
    int64_t arg = 0;
    float mx = z[0];
    for (int64_t j = 1; j < k; ++j) {
      if (z[j] > mx) {
        mx = z[j];
        arg = j;
      }
    }
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) sum += std::exp(static_cast<double>(z[j] - mx));
    const double log_sum = std::log(sum);
    r.loss_sum += log_sum - static_cast<double>(z[label] - mx);
    r.correct += arg == label ? 1 : 0;
    if (dlogits) {
      float* d = dlogits + b * k;
      for (int64_t j = 0; j < k; ++j) {
        d[j] = static_cast<float>(std::exp(static_cast<double>(z[j] - mx) - log_sum)) * inv;
      }
      d[label] -= inv;
    }
  }
  if (dlogits) std::fill(dlogits + valid * k, dlogits + batch * k, 0.0f);
  return r;
}

}  // namespace shardwild
