// The decode step's two opaque operators in C++, so that a compiled graph calls them through the
// dispatcher and needs no Python around them (Inductor's C++ wrapper; compiled.py says why they
// are opaque). Each computes exactly what its Python reference computes: the same ATen calls in
// the same order (tests/models/test_native_ops.py).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <vector>

#include "int4_gemv.h"
#include "int8_gemv.h"

namespace {

// int8_gemv.Int8Gemv's product: rows [M, K] fp32 (unit stride along K) -> [M, N] fp32.
at::Tensor w8a8_gemv(const at::Tensor& rows, const at::Tensor& weight, const at::Tensor& colsum,
                     const at::Tensor& multiplier, double inverse_scale, int64_t zero_point) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kFloat, "w8a8_gemv: rows must be [M, K] fp32");
  TORCH_CHECK(weight.dim() == 2 && weight.scalar_type() == at::kChar && weight.is_contiguous() &&
                  weight.size(1) == rows.size(1),
              "w8a8_gemv: weight must be a contiguous [N, K] int8 tensor with K = ", rows.size(1));
  TORCH_CHECK(colsum.scalar_type() == at::kInt && multiplier.scalar_type() == at::kFloat &&
                  colsum.numel() == weight.size(0) && multiplier.numel() == weight.size(0),
              "w8a8_gemv: colsum [N] int32 and multiplier [N] fp32 expected");
  const at::Tensor x = rows.stride(1) == 1 ? rows : rows.contiguous();
  at::Tensor out = at::empty({x.size(0), weight.size(0)}, x.options());
  const w8a8_weight w{weight.data_ptr<int8_t>(), colsum.data_ptr<int32_t>(), multiplier.data_ptr<float>(),
                      weight.size(1),           weight.size(0),           static_cast<float>(inverse_scale),
                      static_cast<int32_t>(zero_point)};
  const int status = w8a8_gemm(&w, x.data_ptr<float>(), x.stride(0), x.size(0), out.data_ptr<float>(),
                               weight.size(0), at::get_num_threads());
  TORCH_CHECK(status == 0, "int8 GEMV failed on ", x.size(0), " rows (1-", W8A8_MAX_ROWS,
              " allowed, or out of memory)");
  return out;
}

// int4_gemv.Int4Gemv's product: rows [M, Kx] fp32 (unit stride along Kx) -> [M, N] fp32.
at::Tensor w4a8_gemv(const at::Tensor& rows, const at::Tensor& packed, const at::Tensor& scales,
                     const at::Tensor& minima) {
  TORCH_CHECK(rows.dim() == 2 && rows.scalar_type() == at::kFloat, "w4a8_gemv: rows must be [M, K] fp32");
  TORCH_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kByte && packed.is_contiguous() &&
                  scales.dim() == 2 && scales.scalar_type() == at::kFloat && scales.is_contiguous() &&
                  minima.sizes() == scales.sizes() && minima.scalar_type() == at::kFloat && minima.is_contiguous() &&
                  scales.size(0) == packed.size(0) && packed.size(1) * 2 == scales.size(1) * W4A8_GROUP &&
                  rows.size(1) <= packed.size(1) * 2,
              "w4a8_gemv: packed [N, K / 2] uint8, scales and minima [N, K / ", W4A8_GROUP, "] fp32 expected, K >= ",
              rows.size(1));
  const at::Tensor x = rows.stride(1) == 1 ? rows : rows.contiguous();
  at::Tensor out = at::empty({x.size(0), packed.size(0)}, x.options());
  const w4a8_weight w{packed.data_ptr<uint8_t>(), scales.data_ptr<float>(), minima.data_ptr<float>(),
                      packed.size(1) * 2, packed.size(0)};
  const int status = w4a8_gemm(&w, x.data_ptr<float>(), x.size(1), x.stride(0), x.size(0), out.data_ptr<float>(),
                               packed.size(0), at::get_num_threads());
  TORCH_CHECK(status == 0, "4-bit GEMV failed on ", x.size(0), " rows (1-", W4A8_MAX_ROWS,
              " allowed, or out of memory)");
  return out;
}

// compiled._attend_reference, whose docstring gives the shapes.
at::Tensor attend(at::Tensor& keys, at::Tensor& values, const at::Tensor& write, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& q, const at::Tensor& counts,
                  const std::optional<at::Tensor>& order) {
  keys.index_copy_(1, write, k);
  values.index_copy_(1, write, v);
  const at::Tensor n_keys = counts.to(at::kLong).contiguous();
  const int64_t* count = n_keys.data_ptr<int64_t>();
  std::vector<at::Tensor> rows;
  rows.reserve(n_keys.numel());
  for (int64_t j = 0; j < n_keys.numel(); ++j) {
    at::Tensor K, V;  // [Hkv, count, D]
    if (order.has_value()) {
      const at::Tensor slots = order->select(0, j).slice(0, 0, count[j]);
      K = keys.index_select(1, slots);
      V = values.index_select(1, slots);
    } else {
      K = keys.slice(1, 0, count[j]);
      V = values.slice(1, 0, count[j]);
    }
    rows.push_back(at::scaled_dot_product_attention(q.select(0, j).unsqueeze(0), K.unsqueeze(0).to(at::kFloat),
                                                    V.unsqueeze(0).to(at::kFloat)));
  }
  return rows.size() == 1 ? rows[0] : at::cat(rows);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(viasd, m) {
  m.def(
      "w8a8_gemv(Tensor rows, Tensor weight, Tensor colsum, Tensor multiplier, float inverse_scale, int zero_point)"
      " -> Tensor");
  m.def("w4a8_gemv(Tensor rows, Tensor packed, Tensor scales, Tensor minima) -> Tensor");
  m.def(
      "attend(Tensor(a!) keys, Tensor(b!) values, Tensor write, Tensor k, Tensor v, Tensor q, Tensor counts,"
      " Tensor? order) -> Tensor");
}

TORCH_LIBRARY_IMPL(viasd, CPU, m) {
  m.impl("w8a8_gemv", w8a8_gemv);
  m.impl("w4a8_gemv", w4a8_gemv);
  m.impl("attend", attend);
}
