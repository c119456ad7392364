#include "core/model/layers.h"

#include <algorithm>
#include <cmath>
#include <optional>

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
                                                               int64_t out, Activation act, const Buffers& buffers,
                                                               Precision precision) {
  if (batch < 1 || in < 1 || out < 1) {
    return absl::InvalidArgumentError(absl::StrCat("dense layer: bad shape batch=", batch, " in=", in, " out=", out));
  }
  std::unique_ptr<DenseLayer> l(new DenseLayer());
  l->batch_ = batch;
  l->in_ = in;
  l->out_ = out;
  l->act_ = act;
  l->precision_ = precision;
  l->buffers_ = buffers;
  l->has_bwd_data_ = buffers.dx != nullptr;
  const bool bf16 = precision == Precision::kBf16;
  // The matmuls' operand type; their outputs (y, dx, dW) are f32 either way.
  const dt ct = bf16 ? dt::bf16 : dt::f32;
  if (bf16) {
    l->x16_.assign(batch * in, 0);
    if (buffers.w16 == nullptr) l->w16_.assign(in * out, 0);
    l->dy16_.assign(batch * out, 0);
  }
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
    auto md = [](int64_t rows, int64_t cols, dt type, tag t) { return memory::desc({rows, cols}, type, t); };
    // The operands the matmuls read: the caller's f32 buffers, or the bf16 copies.
    void* x_op = bf16 ? static_cast<void*>(l->x16_.data()) : handle(buffers.x);
    void* w_op = !bf16 ? handle(buffers.w) : buffers.w16 != nullptr ? handle(buffers.w16) : l->w16_.data();
    void* dy_op = bf16 ? static_cast<void*>(l->dy16_.data()) : static_cast<void*>(buffers.dy);

    // Forward: y[B,out] = x[B,in] * W[in,out] + b.
    const auto x_md = md(batch, in, ct, tag::ab), w_md = md(in, out, ct, tag::ab), b_md = Md(1, out, tag::ab),
               y_md = Md(batch, out, tag::ab), dy_md = md(batch, out, ct, tag::ab);
    // bf16 runs only where oneDNN has bf16 instructions for it: not emulated
    // (several times slower than f32), and not at all where it has no
    // implementation (below AVX-512).
    auto no_bf16 = [](const std::string& how) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model.precision: bf16 needs bf16 instructions (AVX512_BF16 or AMX_BF16), which this CPU (or "
          "ONEDNN_MAX_CPU_ISA) does not give oneDNN: ", how, "; use model.precision: f32"));
    };
    std::optional<dnnl::matmul::primitive_desc> fwd_pd_or;
    try {
      fwd_pd_or.emplace(dnnl::matmul::desc(x_md, w_md, b_md, y_md), fwd_attr, engine);
    } catch (const dnnl::error& e) {
      if (bf16) return no_bf16("oneDNN has no bf16 matmul here");
      throw;
    }
    const dnnl::matmul::primitive_desc& fwd_pd = *fwd_pd_or;
    l->forward_impl_ = fwd_pd.impl_info_str();
    if (bf16 && l->forward_impl_.find("bf16") == std::string::npos &&
        l->forward_impl_.find("amx") == std::string::npos) {
      return no_bf16(absl::StrCat("oneDNN would emulate the matmuls ('", l->forward_impl_, "')"));
    }
    // Backward data: dx[B,in] = dy[B,out] * W^T, W^T viewed as [out,in] with strides (1, out).
    const auto dx_md = Md(batch, in, tag::ab), wt_md = md(out, in, ct, tag::ba);
    // Backward weights: dW[in,out] = x^T * dy, x^T viewed as [in,B] with strides (1, in).
    const auto xt_md = md(in, batch, ct, tag::ba), dw_md = Md(in, out, tag::ab);
    dnnl::matmul::primitive_desc bwd_w_pd(dnnl::matmul::desc(xt_md, dy_md, dw_md), attr, engine);

    size_t scratch = std::max(fwd_pd.scratchpad_desc().get_size(), bwd_w_pd.scratchpad_desc().get_size());
    std::unique_ptr<dnnl::matmul::primitive_desc> bwd_d_pd;
    if (l->has_bwd_data_) {
      bwd_d_pd = std::make_unique<dnnl::matmul::primitive_desc>(dnnl::matmul::desc(dy_md, wt_md, dx_md), attr, engine);
      scratch = std::max(scratch, bwd_d_pd->scratchpad_desc().get_size());
    }
    // bf16: the f32 -> bf16 reorders of x, W and dy.
    std::vector<dnnl::reorder::primitive_desc> to16;
    if (bf16) {
      for (const auto& [rows, cols] : {std::pair{batch, in}, std::pair{in, out}, std::pair{batch, out}}) {
        to16.emplace_back(engine, Md(rows, cols, tag::ab), engine, md(rows, cols, dt::bf16, tag::ab), attr);
        scratch = std::max(scratch, to16.back().scratchpad_desc().get_size());
      }
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
          {{DNNL_ARG_SRC, memory(x_md, engine, x_op)},
           {DNNL_ARG_WEIGHTS, memory(w_md, engine, w_op)},
           {DNNL_ARG_BIAS, memory(b_md, engine, handle(buffers.b))},
           {DNNL_ARG_DST, memory(y_md, engine, buffers.y)}});
    build(&l->bwd_weights_, dnnl::matmul(bwd_w_pd),
          {{DNNL_ARG_SRC, memory(xt_md, engine, x_op)},
           {DNNL_ARG_WEIGHTS, memory(dy_md, engine, dy_op)},
           {DNNL_ARG_DST, memory(dw_md, engine, buffers.dw)}});
    if (l->has_bwd_data_) {
      build(&l->bwd_data_, dnnl::matmul(*bwd_d_pd),
            {{DNNL_ARG_SRC, memory(dy_md, engine, dy_op)},
             {DNNL_ARG_WEIGHTS, memory(wt_md, engine, w_op)},
             {DNNL_ARG_DST, memory(dx_md, engine, buffers.dx)}});
    }
    if (bf16) {
      const std::pair<void*, void*> ends[3] = {
          {handle(buffers.x), x_op}, {handle(buffers.w), w_op}, {static_cast<void*>(buffers.dy), dy_op}};
      Exec* execs[3] = {&l->x_to16_, &l->w_to16_, &l->dy_to16_};
      for (int i = 0; i < 3; ++i) {
        if (i == 1 && buffers.w16 != nullptr) continue;  // the caller keeps W in bf16
        build(execs[i], dnnl::reorder(to16[i]),
              {{DNNL_ARG_FROM, memory(to16[i].src_desc(), engine, ends[i].first)},
               {DNNL_ARG_TO, memory(to16[i].dst_desc(), engine, ends[i].second)}});
      }
    }
  } catch (const dnnl::error& e) {
    return absl::InternalError(absl::StrCat("oneDNN could not build a dense layer ", in, "x", out, " (",
                                            PrecisionName(precision), "): ", e.what()));
  }
  return l;
}

void DenseLayer::Forward(const dnnl::stream& stream) {
  if (precision_ == Precision::kBf16) {
    Run(x_to16_, stream);
    if (buffers_.w16 == nullptr) Run(w_to16_, stream);
  }
  Run(fwd_, stream);
}

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
  if (precision_ == Precision::kBf16) Run(dy_to16_, stream);
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
    // Up to kKeptExponentials classes, the exponentials of the sum are kept
    // for the gradient (softmax_j = e_j / sum) instead of computed again.
    double e[kKeptExponentials];
    const bool keep = k <= kKeptExponentials;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      const double x = std::exp(static_cast<double>(z[j] - mx));
      if (keep) e[j] = x;
      sum += x;
    }
    const double log_sum = std::log(sum);
    r.loss_sum += log_sum - static_cast<double>(z[label] - mx);
    r.correct += arg == label ? 1 : 0;
    if (dlogits) {
      float* d = dlogits + b * k;
      if (keep) {
        for (int64_t j = 0; j < k; ++j) d[j] = static_cast<float>(e[j] / sum) * inv;
      } else {
        for (int64_t j = 0; j < k; ++j) {
          d[j] = static_cast<float>(std::exp(static_cast<double>(z[j] - mx) - log_sum)) * inv;
        }
      }
      d[label] -= inv;
    }
  }
  if (dlogits) std::fill(dlogits + valid * k, dlogits + batch * k, 0.0f);
  return r;
}

}  // namespace shardwild
