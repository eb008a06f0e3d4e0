// Small-matrix linear algebra with torch.linalg semantics: LU factorization,
// LU solve, solve, inverse and triangular solve for batches of float or complex64
// systems of order n <= 64, and QR of m x n matrices with m, n <= 64. The
// kernels are in metal/linalg.metal and metal/qr.metal.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>

namespace mps_ext::ops {

// Each *_unsupported says why the kernels cannot run this call (device,
// dtype, order above 64, inputs torch would reject...), or nullopt when they
// can; each *_kernels runs them (requires the matching *_unsupported to be
// nullopt) with the semantics of the aten op of the same name.
std::optional<std::string> lu_factor_ex_unsupported(const at::Tensor& A, bool pivot);
std::tuple<at::Tensor, at::Tensor, at::Tensor> lu_factor_ex_kernels(const at::Tensor& A, bool check_errors);

std::optional<std::string> lu_solve_unsupported(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B,
                                                 bool left);
at::Tensor lu_solve_kernels(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left,
                            bool adjoint);

std::optional<std::string> solve_ex_unsupported(const at::Tensor& A, const at::Tensor& B, bool left);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> solve_ex_kernels(const at::Tensor& A, const at::Tensor& B,
                                                                            bool left, bool check_errors);

std::optional<std::string> inv_ex_unsupported(const at::Tensor& A);
std::tuple<at::Tensor, at::Tensor> inv_ex_kernels(const at::Tensor& A, bool check_errors);

std::optional<std::string> qr_unsupported(const at::Tensor& A, c10::string_view mode);
std::tuple<at::Tensor, at::Tensor> qr_kernels(const at::Tensor& A, c10::string_view mode);

std::optional<std::string> householder_product_unsupported(const at::Tensor& A, const at::Tensor& tau);
at::Tensor householder_product_kernels(const at::Tensor& A, const at::Tensor& tau);

std::optional<std::string> solve_triangular_unsupported(const at::Tensor& A, const at::Tensor& B, bool left);
at::Tensor solve_triangular_kernels(const at::Tensor& A, const at::Tensor& B, bool upper, bool left,
                                    bool unitriangular);

// The mps_ext:: ops: the kernels where they apply, torch's ops otherwise.
std::tuple<at::Tensor, at::Tensor, at::Tensor> lu_factor_ex(const at::Tensor& A, bool pivot, bool check_errors);
at::Tensor lu_solve(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left, bool adjoint);
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> solve_ex(const at::Tensor& A, const at::Tensor& B,
                                                                    bool left, bool check_errors);
std::tuple<at::Tensor, at::Tensor> inv_ex(const at::Tensor& A, bool check_errors);
std::tuple<at::Tensor, at::Tensor> qr(const at::Tensor& A, c10::string_view mode);
at::Tensor householder_product(const at::Tensor& A, const at::Tensor& tau);
at::Tensor solve_triangular(const at::Tensor& A, const at::Tensor& B, bool upper, bool left, bool unitriangular);

}  // namespace mps_ext::ops
