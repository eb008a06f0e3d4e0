// aten::linalg_lu_factor_ex, linalg_lu_solve, _linalg_solve_ex, linalg_inv_ex,
// linalg_qr, linalg_householder_product and linalg_solve_triangular. Below autograd: torch's derivative formulas keep
// working (they call these ops again, so backward runs the kernels too).
#include <ATen/ATen.h>
#include <ATen/ops/_linalg_solve_ex_cpu_dispatch.h>
#include <ATen/ops/linalg_householder_product_cpu_dispatch.h>
#include <ATen/ops/linalg_inv_ex_cpu_dispatch.h>
#include <ATen/ops/linalg_lu_factor_ex_cpu_dispatch.h>
#include <ATen/ops/linalg_lu_solve_cpu_dispatch.h>
#include <ATen/ops/linalg_qr_cpu_dispatch.h>
#include <ATen/ops/linalg_solve_triangular_cpu_dispatch.h>
#if defined(MPS_EXT_METAL)
#include <ATen/ops/_linalg_solve_ex_mps_dispatch.h>
#include <ATen/ops/linalg_householder_product_mps_dispatch.h>
#include <ATen/ops/linalg_inv_ex_mps_dispatch.h>
#include <ATen/ops/linalg_lu_factor_ex_mps_dispatch.h>
#include <ATen/ops/linalg_qr_mps_dispatch.h>
#include <ATen/ops/linalg_solve_triangular_mps_dispatch.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 14)
#include <ATen/ops/linalg_lu_solve_mps_dispatch.h>
#define MPS_EXT_HAS_MPS_LU_SOLVE 1
#endif
#endif

#include "backend.h"
#include "ops/linalg.h"
#include "overrides/overrides.h"

namespace mps_ext::overrides {

namespace {

// torch's own kernels for the tensors' device, called directly: going
// through the dispatcher would come back here.
std::tuple<at::Tensor, at::Tensor, at::Tensor> original_lu_factor_ex(const at::Tensor& A, bool pivot,
                                                                     bool check_errors) {
#if defined(MPS_EXT_METAL)
  if (A.device().is_mps()) return at::mps::linalg_lu_factor_ex(A, pivot, check_errors);
#endif
  return at::cpu::linalg_lu_factor_ex(A, pivot, check_errors);
}

at::Tensor original_lu_solve(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left,
                             bool adjoint) {
#if defined(MPS_EXT_METAL)
  if (LU.device().is_mps()) {
#if defined(MPS_EXT_HAS_MPS_LU_SOLVE)
    return at::mps::linalg_lu_solve(LU, pivots, B, left, adjoint);
#else
    // torch 2.13 has no MPS kernel for it: solve on the CPU, bring the result back.
    return at::cpu::linalg_lu_solve(LU.cpu(), pivots.cpu(), B.cpu(), left, adjoint).to(B.device());
#endif
  }
#endif
  return at::cpu::linalg_lu_solve(LU, pivots, B, left, adjoint);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> original_solve_ex(const at::Tensor& A, const at::Tensor& B,
                                                                             bool left, bool check_errors) {
#if defined(MPS_EXT_METAL)
  if (A.device().is_mps()) return at::mps::_linalg_solve_ex(A, B, left, check_errors);
#endif
  return at::cpu::_linalg_solve_ex(A, B, left, check_errors);
}

std::tuple<at::Tensor, at::Tensor> original_inv_ex(const at::Tensor& A, bool check_errors) {
#if defined(MPS_EXT_METAL)
  if (A.device().is_mps()) return at::mps::linalg_inv_ex(A, check_errors);
#endif
  return at::cpu::linalg_inv_ex(A, check_errors);
}

std::tuple<at::Tensor, at::Tensor> original_qr(const at::Tensor& A, c10::string_view mode) {
#if defined(MPS_EXT_METAL)
  if (A.device().is_mps()) return at::mps::linalg_qr(A, mode);
#endif
  return at::cpu::linalg_qr(A, mode);
}

at::Tensor original_householder_product(const at::Tensor& A, const at::Tensor& tau) {
#if defined(MPS_EXT_METAL)
  if (A.device().is_mps()) return at::mps::linalg_householder_product(A, tau);
#endif
  return at::cpu::linalg_householder_product(A, tau);
}

at::Tensor original_solve_triangular(const at::Tensor& A, const at::Tensor& B, bool upper, bool left,
                                     bool unitriangular) {
#if defined(MPS_EXT_METAL)
  if (A.device().is_mps()) return at::mps::linalg_solve_triangular(A, B, upper, left, unitriangular);
#endif
  return at::cpu::linalg_solve_triangular(A, B, upper, left, unitriangular);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lu_factor_ex(const at::Tensor& A, bool pivot, bool check_errors) {
  constexpr const char* op = "aten::linalg_lu_factor_ex";
  if (auto why = ops::lu_factor_ex_unsupported(A, pivot)) {
    const CallingTorch calling = fallback(op, *why);
    return original_lu_factor_ex(A, pivot, check_errors);
  }
  auto out = ops::lu_factor_ex_kernels(A, check_errors);
  hit(op);
  before_torch_ops(A.device());  // torch's composites (linalg.lu_factor, ...) read info as soon as this returns
  return out;
}

at::Tensor lu_solve(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left, bool adjoint) {
  constexpr const char* op = "aten::linalg_lu_solve";
  if (auto why = ops::lu_solve_unsupported(LU, pivots, B, left)) {
    const CallingTorch calling = fallback(op, *why);
    return original_lu_solve(LU, pivots, B, left, adjoint);
  }
  at::Tensor out = ops::lu_solve_kernels(LU, pivots, B, left, adjoint);
  hit(op);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> solve_ex(const at::Tensor& A, const at::Tensor& B,
                                                                    bool left, bool check_errors) {
  constexpr const char* op = "aten::_linalg_solve_ex";
  if (auto why = ops::solve_ex_unsupported(A, B, left)) {
    const CallingTorch calling = fallback(op, *why);
    return original_solve_ex(A, B, left, check_errors);
  }
  auto out = ops::solve_ex_kernels(A, B, left, check_errors);
  hit(op);
  before_torch_ops(A.device());  // torch's composites (linalg.solve, linalg.inv, ...) read info as soon as this returns
  return out;
}

std::tuple<at::Tensor, at::Tensor> inv_ex(const at::Tensor& A, bool check_errors) {
  constexpr const char* op = "aten::linalg_inv_ex";
  if (auto why = ops::inv_ex_unsupported(A)) {
    const CallingTorch calling = fallback(op, *why);
    return original_inv_ex(A, check_errors);
  }
  auto out = ops::inv_ex_kernels(A, check_errors);
  hit(op);
  before_torch_ops(A.device());  // torch's linalg.inv reads info as soon as this returns
  return out;
}

std::tuple<at::Tensor, at::Tensor> qr(const at::Tensor& A, c10::string_view mode) {
  constexpr const char* op = "aten::linalg_qr";
  if (auto why = ops::qr_unsupported(A, mode)) {
    const CallingTorch calling = fallback(op, *why);
    return original_qr(A, mode);
  }
  auto out = ops::qr_kernels(A, mode);
  hit(op);
  return out;
}

at::Tensor householder_product(const at::Tensor& A, const at::Tensor& tau) {
  constexpr const char* op = "aten::linalg_householder_product";
  if (auto why = ops::householder_product_unsupported(A, tau)) {
    const CallingTorch calling = fallback(op, *why);
    return original_householder_product(A, tau);
  }
  at::Tensor out = ops::householder_product_kernels(A, tau);
  hit(op);
  return out;
}

at::Tensor solve_triangular(const at::Tensor& A, const at::Tensor& B, bool upper, bool left, bool unitriangular) {
  constexpr const char* op = "aten::linalg_solve_triangular";
  if (auto why = ops::solve_triangular_unsupported(A, B, left)) {
    const CallingTorch calling = fallback(op, *why);
    return original_solve_triangular(A, B, upper, left, unitriangular);
  }
  at::Tensor out = ops::solve_triangular_kernels(A, B, upper, left, unitriangular);
  hit(op);
  return out;
}

}  // namespace

void register_linalg(OverrideLibrary& lib) {
  lib.impl("linalg_lu_factor_ex", TORCH_FN(lu_factor_ex));
  lib.impl("linalg_lu_solve", TORCH_FN(lu_solve));
  lib.impl("_linalg_solve_ex", TORCH_FN(solve_ex));
  lib.impl("linalg_inv_ex", TORCH_FN(inv_ex));
  lib.impl("linalg_qr", TORCH_FN(qr));
  lib.impl("linalg_householder_product", TORCH_FN(householder_product));
  lib.impl("linalg_solve_triangular", TORCH_FN(solve_triangular));
}

}  // namespace mps_ext::overrides
