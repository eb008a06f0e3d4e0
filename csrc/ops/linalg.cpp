// Small-matrix linear algebra: validation, kernel choice and launch geometry,
// for both backends. The kernels are in metal/linalg.metal.
//
// Every solve is brought to the form op(M) X = B with X column-major: a right
// solve X A = B is A^H X^H = B^H (LU: adjoint flipped, right-hand sides and
// solutions conjugated) or A^T X^T = B^T (triangles: strides swapped, upper
// and lower exchanged), whose column-major X^T is the row-major X.
#include "ops/linalg.h"

#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>
#include <vector>

#include "backend.h"
#include "overrides/overrides.h"
#include "mps_ext/params.h"
#include "ops/naming.h"
#include "ops/plan_helpers.h"

namespace mps_ext::ops {

namespace {

// Orders up to kTinyN: one thread per system; up to kMaxN: one SIMD group per
// matrix or per right-hand side.
constexpr int64_t kTinyN = 4, kMaxN = 64;
constexpr uint32_t kThreadsPerGroup = 64;  // thread kernels
constexpr uint32_t kSolveSimdGroups = 4;   // simd solves: right-hand sides per threadgroup
constexpr int64_t kInverseMinRhs = 8;      // triangular solves through the inverse from this many columns
constexpr int64_t kMaxElements = std::numeric_limits<int32_t>::max();

using Shape = std::vector<int64_t>;

bool supported_dtype(at::ScalarType t) { return t == at::kFloat || t == at::kComplexFloat; }

Shape batch_of(const at::Tensor& t, int64_t matrix_dims = 2) {
  return Shape(t.sizes().begin(), t.sizes().end() - matrix_dims);
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Batch shapes broadcast together, or nullopt when they cannot.
std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  Shape out(std::max(a.size(), b.size()));
  for (size_t i = 0; i < out.size(); ++i) {
    const int64_t x = i < a.size() ? a[a.size() - 1 - i] : 1, y = i < b.size() ? b[b.size() - 1 - i] : 1;
    if (x != y && x != 1 && y != 1) return std::nullopt;
    out[out.size() - 1 - i] = x == 1 ? y : x;
  }
  return out;
}

Shape concat(Shape a, std::initializer_list<int64_t> tail) {
  a.insert(a.end(), tail);
  return a;
}

// Host names: lu_<kernel>_<type>, trsm_<kernel>_<type> and qr_<kernel>_<type>.
std::string lu_kernel(const char* kernel, at::ScalarType t) { return host_name("lu", kernel, {t}); }
std::string trsm_kernel(const char* kernel, at::ScalarType t) { return host_name("trsm", kernel, {t}); }
std::string qr_kernel(const char* kernel, at::ScalarType t) { return host_name("qr", kernel, {t}); }

// The device every tensor is on and its backend; why not when there is none.
std::optional<std::string> no_backend(std::initializer_list<const at::Tensor*> tensors) {
  const c10::Device device = (*tensors.begin())->device();
  for (const at::Tensor* t : tensors)
    if (t->device() != device) return std::string("tensors on different devices");
  std::string why;
  if (!backend_for(device, &why)) return why;
  return std::nullopt;
}

std::optional<std::string> no_kernels(const at::Tensor& t, std::initializer_list<std::string> kernels,
                                      uint32_t threads) {
  Backend* backend = backend_for(t.device());
  for (const std::string& kernel : kernels)
    if (auto why = backend->unavailable(kernel, threads)) return why;
  return std::nullopt;
}

// The checks every op shares: a square float or complex64 A of order <= 64.
std::optional<std::string> square_unsupported(const at::Tensor& A) {
  if (!supported_dtype(A.scalar_type())) return std::string("dtype ") + c10::toString(A.scalar_type());
  if (A.dim() < 2) return std::string("not a matrix");  // torch raises
  if (A.size(-1) != A.size(-2)) return std::string("not square");
  if (A.size(-1) > kMaxN) return std::string("order above 64");
  return std::nullopt;
}

// QR's checks: a float or complex64 matrix of at most 64 rows and columns.
std::optional<std::string> matrix_unsupported(const at::Tensor& A) {
  if (!supported_dtype(A.scalar_type())) return std::string("dtype ") + c10::toString(A.scalar_type());
  if (A.dim() < 2) return std::string("not a matrix");  // torch raises
  if (A.size(-1) > kMaxN || A.size(-2) > kMaxN) return std::string("size above 64");
  if (A.numel() > kMaxElements) return std::string("more than 2^31 elements");
  return std::nullopt;
}

// A (batch..., rows, cols) operand broadcast to `batch` and seen as a 3-D
// (batch, rows, cols) tensor: a view where possible, one shared matrix
// (batch stride 0) when it has no batch of its own.
struct Operand {
  at::Tensor t;  // bound to the kernel (complex64 as its view_as_real)
  uint64_t bs, rs, cs;
};

Operand operand(const at::Tensor& x, const Shape& batch) {
  const int64_t rows = x.size(-2), cols = x.size(-1);
  const at::Tensor t = numel_of(batch_of(x)) == 1
                           ? x.reshape({1, rows, cols})
                           : x.expand(concat(batch, {rows, cols})).reshape({numel_of(batch), rows, cols});
  const uint64_t bs = t.size(0) == 1 && numel_of(batch) != 1 ? 0 : uint64_t(t.stride(0));
  return {t.is_complex() ? at::view_as_real(t) : t, bs, uint64_t(t.stride(1)), uint64_t(t.stride(2))};
}

at::Tensor bind(const at::Tensor& t) { return t.is_complex() ? at::view_as_real(t) : t; }

LinalgParams params(int64_t n, int64_t k, int64_t batch) {
  LinalgParams p{};
  p.n = uint32_t(n);
  p.k = uint32_t(k);
  p.batch = uint32_t(batch);
  return p;
}

void set_matrix(LinalgParams& p, const Operand& a) {
  p.a_bs = a.bs;
  p.a_rs = a.rs;
  p.a_cs = a.cs;
}

void set_rhs(LinalgParams& p, const Operand& b, bool transposed) {
  p.b_bs = b.bs;
  p.b_rs = transposed ? b.cs : b.rs;
  p.b_cs = transposed ? b.rs : b.cs;
}

// Launch geometry: thread kernels one system per thread; simd solves one
// SIMD group per (system, right-hand side).
Size3 thread_grid(int64_t batch) { return {ceil_div(batch, kThreadsPerGroup)}; }
Size3 solve_grid(int64_t batch, int64_t k) { return {ceil_div(batch * k, kSolveSimdGroups)}; }

// Factors A (its own batch) into a column-major LU: LU = buf.mT.
std::tuple<at::Tensor, at::Tensor, at::Tensor> factor(const at::Tensor& A) {
  const int64_t n = A.size(-1);
  const Shape batch = batch_of(A);
  const at::Tensor buf = at::empty(concat(batch, {n, n}), A.options());
  at::Tensor pivots = at::empty(concat(batch, {n}), A.options().dtype(at::kInt));
  at::Tensor info = at::zeros(batch, A.options().dtype(at::kInt));
  const int64_t systems = numel_of(batch);
  if (systems == 0 || n == 0) return {buf.mT(), pivots, info};
  LinalgParams p = params(n, 0, systems);
  const Operand a = operand(A, batch);
  set_matrix(p, a);
  const bool tiny = n <= kTinyN;
  dispatch(Launch{lu_kernel(tiny ? "factor_thread" : "factor_simd", A.scalar_type()), {},
                  tiny ? thread_grid(systems) : Size3{uint32_t(systems)}, {tiny ? kThreadsPerGroup : 32}}
               .tensor(a.t)
               .tensor(bind(buf))
               .tensor(pivots)
               .tensor(info)
               .bytes(p));
  return {buf.mT(), pivots, info};
}

// Solves with factors (LU, pivots) of its own batch: left, or right through
// the adjoint. Returns X with torch's layout (column-major for left solves).
at::Tensor solve_with_factors(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left,
                              bool adjoint) {
  const int64_t n = LU.size(-1), k = left ? B.size(-1) : B.size(-2);
  const Shape batch = *broadcast(batch_of(LU), batch_of(B));
  const at::Tensor buf = at::empty(concat(batch, {k, n}), B.options());
  const int64_t systems = numel_of(batch);
  if (systems == 0 || n == 0 || k == 0) return left ? buf.mT() : buf;
  // Broadcasting copies the factors on the host: the kernels that wrote them must have run.
  const int64_t own = numel_of(batch_of(LU));
  if (own != 1 && own != systems) before_torch_ops(B.device());
  LinalgParams p = params(n, k, systems);
  const Operand lu = operand(LU, batch), rhs = operand(B, batch);
  set_matrix(p, lu);
  set_rhs(p, rhs, !left);
  const at::Tensor piv = own == 1 ? pivots.reshape({1, n}).contiguous()
                                  : pivots.expand(concat(batch, {n})).reshape({-1, n}).contiguous();
  p.p_bs = piv.size(0) == 1 ? 0 : uint64_t(n);
  p.flags = (adjoint != !left ? kLinalgAdjoint : 0) | (left ? 0 : kLinalgConjRhs);
  const bool tiny = n <= kTinyN;
  dispatch(Launch{lu_kernel(tiny ? "solve_thread" : "solve_simd", B.scalar_type()), {},
                  tiny ? thread_grid(systems) : solve_grid(systems, k),
                  {tiny ? kThreadsPerGroup : 32 * kSolveSimdGroups}}
               .tensor(lu.t)
               .tensor(piv)
               .tensor(rhs.t)
               .tensor(bind(buf))
               .bytes(p));
  return left ? buf.mT() : buf;
}

// The first `cols` columns of H_0 ... H_{k-1} (the reflectors below the
// diagonal of V, tau's of V's batch), column-major as torch returns Q.
at::Tensor householder(const at::Tensor& V, const at::Tensor& tau, int64_t cols) {
  const int64_t m = V.size(-2), k = tau.size(-1);
  const Shape batch = batch_of(V);
  const int64_t systems = numel_of(batch);
  const at::Tensor buf = at::empty(concat(batch, {cols, m}), V.options());
  if (systems == 0 || m == 0 || cols == 0) return buf.mT();
  LinalgParams p = params(cols, k, systems);
  p.m = uint32_t(m);
  const Operand v = operand(V, batch);
  set_matrix(p, v);
  const at::Tensor taus = tau.reshape({systems, k}).contiguous();
  p.p_bs = uint64_t(k);
  dispatch(Launch{qr_kernel("householder_simd", V.scalar_type()), {}, {uint32_t(systems)}, {32}}
               .tensor(v.t)
               .tensor(bind(taus))
               .tensor(bind(buf))
               .bytes(p));
  return buf.mT();
}

bool is_vector_rhs(const at::Tensor& A, const at::Tensor& B) {
  // torch.linalg.solve: B is a vector, or a batch of vectors of A's batch shape.
  return B.dim() == 1 || (B.dim() == A.dim() - 1 && B.sizes().equals(A.sizes().slice(0, A.dim() - 1)));
}

}  // namespace

std::optional<std::string> lu_factor_ex_unsupported(const at::Tensor& A, bool pivot) {
  if (auto why = no_backend({&A})) return why;
  if (auto why = square_unsupported(A)) return why;
  if (!pivot) return std::string("pivot=False");
  if (A.numel() > kMaxElements) return std::string("more than 2^31 elements");
  return no_kernels(A, {lu_kernel(A.size(-1) <= kTinyN ? "factor_thread" : "factor_simd", A.scalar_type())},
                    A.size(-1) <= kTinyN ? kThreadsPerGroup : 32);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lu_factor_ex_kernels(const at::Tensor& A, bool check_errors) {
  auto [LU, pivots, info] = factor(A);
  if (check_errors) {
    before_torch_ops(info.device());  // the check reads info on the host
    at::_linalg_check_errors(info, "torch.linalg.lu_factor_ex", A.dim() == 2);
  }
  return {LU, pivots, info};
}

std::optional<std::string> lu_solve_unsupported(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B,
                                                 bool left) {
  if (auto why = no_backend({&LU, &pivots, &B})) return why;
  if (auto why = square_unsupported(LU)) return why;
  if (B.scalar_type() != LU.scalar_type() || pivots.scalar_type() != at::kInt) return std::string("dtypes differ");
  const int64_t n = LU.size(-1);
  if (B.dim() < 2 || pivots.dim() < 1 || !pivots.sizes().equals(LU.sizes().slice(0, LU.dim() - 1)) ||
      (left ? B.size(-2) : B.size(-1)) != n)
    return std::string("shapes");
  const auto batch = broadcast(batch_of(LU), batch_of(B));
  if (!batch) return std::string("shapes");
  if (numel_of(*batch) * n * std::max(n, B.size(left ? -1 : -2)) > kMaxElements)
    return std::string("more than 2^31 elements");
  if (auto why = no_kernels(LU, {lu_kernel(n <= kTinyN ? "solve_thread" : "solve_simd", LU.scalar_type())},
                            n <= kTinyN ? kThreadsPerGroup : 32 * kSolveSimdGroups))
    return why;
  // torch rejects pivots outside [1, n] (reading them on the host, as here,
  // once the kernel that wrote them, lu_factor's on this stream, has run).
  if (pivots.numel()) {
    before_torch_ops(pivots.device());
    if (at::logical_or(pivots < 1, pivots > n).any().item<bool>()) return std::string("pivots out of range");
  }
  return std::nullopt;
}

at::Tensor lu_solve_kernels(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left,
                            bool adjoint) {
  return solve_with_factors(LU, pivots, B, left, adjoint);
}

std::optional<std::string> solve_ex_unsupported(const at::Tensor& A, const at::Tensor& B, bool left) {
  if (auto why = no_backend({&A, &B})) return why;
  if (auto why = square_unsupported(A)) return why;
  if (B.scalar_type() != A.scalar_type()) return std::string("dtypes differ");
  const int64_t n = A.size(-1);
  const bool vector = is_vector_rhs(A, B);
  if (B.dim() < 1 || (vector && !left)) return std::string("shapes");
  const at::Tensor B_ = vector ? B.unsqueeze(-1) : B;
  if (B_.dim() < 2 || (left ? B_.size(-2) : B_.size(-1)) != n) return std::string("shapes");
  const auto batch = broadcast(batch_of(A), batch_of(B_));
  if (!batch) return std::string("shapes");
  if (numel_of(*batch) * n * std::max(n, B_.size(left ? -1 : -2)) > kMaxElements)
    return std::string("more than 2^31 elements");
  const at::ScalarType t = A.scalar_type();
  if (n <= kTinyN)
    return no_kernels(A, {lu_kernel("solve_fused_thread", t), lu_kernel("factor_thread", t), lu_kernel("solve_thread", t)},
                      kThreadsPerGroup);
  if (auto why = no_kernels(A, {lu_kernel("factor_simd", t)}, 32)) return why;
  return no_kernels(A, {lu_kernel("solve_simd", t)}, 32 * kSolveSimdGroups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> solve_ex_kernels(const at::Tensor& A, const at::Tensor& B,
                                                                            bool left, bool check_errors) {
  const bool vector = is_vector_rhs(A, B);
  const at::Tensor B_ = vector ? B.unsqueeze(-1) : B;
  const int64_t n = A.size(-1), k = left ? B_.size(-1) : B_.size(-2);
  const Shape batch = *broadcast(batch_of(A), batch_of(B_));
  const int64_t systems = numel_of(batch);
  at::Tensor X, LU, pivots, info;
  if (n <= kTinyN && numel_of(batch_of(A)) == systems && systems && n && k) {
    // One thread factors and solves each system: one dispatch.
    const Shape own = batch_of(A);
    const at::Tensor lu_buf = at::empty(concat(own, {n, n}), A.options());
    const at::Tensor x_buf = at::empty(concat(batch, {k, n}), A.options());
    pivots = at::empty(concat(own, {n}), A.options().dtype(at::kInt));
    info = at::empty(own, A.options().dtype(at::kInt));
    LinalgParams p = params(n, k, systems);
    const Operand a = operand(A, batch), rhs = operand(B_, batch);
    set_matrix(p, a);
    set_rhs(p, rhs, !left);
    p.flags = left ? 0 : kLinalgAdjoint | kLinalgConjRhs;
    dispatch(Launch{lu_kernel("solve_fused_thread", A.scalar_type()), {}, thread_grid(systems), {kThreadsPerGroup}}
                 .tensor(a.t)
                 .tensor(rhs.t)
                 .tensor(bind(x_buf))
                 .tensor(bind(lu_buf))
                 .tensor(pivots)
                 .tensor(info)
                 .bytes(p));
    LU = lu_buf.mT();
    X = left ? x_buf.mT() : x_buf;
  } else {
    std::tie(LU, pivots, info) = factor(A);
    X = solve_with_factors(LU, pivots, B_, left, false);
  }
  if (vector) X = X.squeeze(-1);
  if (check_errors) {
    before_torch_ops(info.device());  // the check reads info on the host
    at::_linalg_check_errors(info, "torch.linalg.solve_ex", A.dim() == 2);
  }
  return {X, LU, pivots, info};
}

std::optional<std::string> inv_ex_unsupported(const at::Tensor& A) {
  if (auto why = no_backend({&A})) return why;
  if (auto why = square_unsupported(A)) return why;
  if (A.numel() > kMaxElements) return std::string("more than 2^31 elements");
  const bool tiny = A.size(-1) <= kTinyN;
  return no_kernels(A, {lu_kernel(tiny ? "inverse_thread" : "inverse_simd", A.scalar_type())},
                    tiny ? kThreadsPerGroup : 32);
}

std::tuple<at::Tensor, at::Tensor> inv_ex_kernels(const at::Tensor& A, bool check_errors) {
  const int64_t n = A.size(-1);
  const Shape batch = batch_of(A);
  const int64_t systems = numel_of(batch);
  // One dispatch factors and inverts; the inverse column-major, as torch returns it.
  const at::Tensor buf = at::empty(A.sizes(), A.options());
  const at::Tensor info = at::zeros(batch, A.options().dtype(at::kInt));
  if (systems && n) {
    LinalgParams p = params(n, n, systems);
    const Operand a = operand(A, batch);
    set_matrix(p, a);
    const bool tiny = n <= kTinyN;
    dispatch(Launch{lu_kernel(tiny ? "inverse_thread" : "inverse_simd", A.scalar_type()), {},
                    tiny ? thread_grid(systems) : Size3{uint32_t(systems)}, {tiny ? kThreadsPerGroup : 32}}
                 .tensor(a.t)
                 .tensor(bind(buf))
                 .tensor(info)
                 .bytes(p));
  }
  const at::Tensor inverse = buf.mT();
  if (check_errors) {
    before_torch_ops(info.device());  // the check reads info on the host
    at::_linalg_check_errors(info, "linalg.inv_ex", A.dim() == 2);
  }
  return {inverse, info};
}

std::optional<std::string> qr_unsupported(const at::Tensor& A, c10::string_view mode) {
  if (auto why = no_backend({&A})) return why;
  if (auto why = matrix_unsupported(A)) return why;
  if (mode != "reduced" && mode != "complete" && mode != "r") return std::string("mode");  // torch raises
  return no_kernels(A, {qr_kernel("geqrf_simd", A.scalar_type()), qr_kernel("householder_simd", A.scalar_type())},
                    32);
}

std::tuple<at::Tensor, at::Tensor> qr_kernels(const at::Tensor& A, c10::string_view mode) {
  const int64_t m = A.size(-2), n = A.size(-1), k = std::min(m, n);
  const Shape batch = batch_of(A);
  const int64_t systems = numel_of(batch);
  // R and the reflectors below it (LAPACK's geqrf), column-major.
  const at::Tensor factors = at::empty(concat(batch, {n, m}), A.options());
  const at::Tensor tau = at::empty(concat(batch, {k}), A.options());
  if (systems && m && n) {
    LinalgParams p = params(n, k, systems);
    p.m = uint32_t(m);
    const Operand a = operand(A, batch);
    set_matrix(p, a);
    dispatch(Launch{qr_kernel("geqrf_simd", A.scalar_type()), {}, {uint32_t(systems)}, {32}}
                 .tensor(a.t)
                 .tensor(bind(factors))
                 .tensor(bind(tau))
                 .bytes(p));
  }
  const bool complete = mode == "complete";
  const at::Tensor QR = factors.mT();
  at::Tensor Q = mode == "r" ? at::empty({0}, A.options()) : householder(QR, tau, complete ? m : k);
  const int64_t r_rows = complete ? m : k;
  at::Tensor R = at::empty(concat(batch, {n, r_rows}), A.options()).mT();
  before_torch_ops(A.device());  // triu reads the factors
  at::triu_out(R, QR.narrow(-2, 0, r_rows));
  return {Q, R};
}

std::optional<std::string> householder_product_unsupported(const at::Tensor& A, const at::Tensor& tau) {
  if (auto why = no_backend({&A, &tau})) return why;
  if (auto why = matrix_unsupported(A)) return why;
  if (tau.scalar_type() != A.scalar_type()) return std::string("dtypes differ");
  if (tau.dim() != A.dim() - 1 || !tau.sizes().slice(0, tau.dim() - 1).equals(A.sizes().slice(0, A.dim() - 2)) ||
      A.size(-2) < A.size(-1) || A.size(-1) < tau.size(-1))
    return std::string("shapes");  // torch raises
  return no_kernels(A, {qr_kernel("householder_simd", A.scalar_type())}, 32);
}

at::Tensor householder_product_kernels(const at::Tensor& A, const at::Tensor& tau) {
  return householder(A, tau, A.size(-1));
}

std::optional<std::string> solve_triangular_unsupported(const at::Tensor& A, const at::Tensor& B, bool left) {
  if (auto why = no_backend({&A, &B})) return why;
  if (auto why = square_unsupported(A)) return why;
  if (B.scalar_type() != A.scalar_type()) return std::string("dtypes differ");
  const int64_t n = A.size(-1);
  if (B.dim() < 2 || (left ? B.size(-2) : B.size(-1)) != n) return std::string("shapes");
  const auto batch = broadcast(batch_of(A), batch_of(B));
  if (!batch) return std::string("shapes");
  if (numel_of(*batch) * n * std::max(n, B.size(left ? -1 : -2)) > kMaxElements)
    return std::string("more than 2^31 elements");
  if (A.scalar_type() == at::kFloat && (n == 16 || n == 32 || n == 64))
    if (auto why = no_kernels(A, {trsm_kernel("inverse", at::kFloat)}, uint32_t(n))) return why;
  return no_kernels(A, {trsm_kernel("simd", A.scalar_type())}, 32 * kSolveSimdGroups);
}

at::Tensor solve_triangular_kernels(const at::Tensor& A, const at::Tensor& B, bool upper, bool left,
                                    bool unitriangular) {
  const int64_t n = A.size(-1), k = left ? B.size(-1) : B.size(-2);
  const Shape batch = *broadcast(batch_of(A), batch_of(B));
  const at::Tensor buf = at::empty(concat(batch, {k, n}), B.options());
  const int64_t systems = numel_of(batch);
  if (systems == 0 || n == 0 || k == 0) return left ? buf.mT() : buf;
  LinalgParams p = params(n, k, systems);
  const Operand a = operand(A, batch), rhs = operand(B, batch);
  set_matrix(p, a);
  if (!left) std::swap(p.a_rs, p.a_cs);  // A^T: the other triangle
  set_rhs(p, rhs, !left);
  p.flags = (upper == left ? kLinalgUpper : 0) | (unitriangular ? kLinalgUnit : 0);
  const bool inverse = A.scalar_type() == at::kFloat && (n == 16 || n == 32 || n == 64) && k >= kInverseMinRhs;
  dispatch(Launch{trsm_kernel(inverse ? "inverse" : "simd", A.scalar_type()), {},
                  inverse ? Size3{uint32_t(systems)} : solve_grid(systems, k),
                  {inverse ? uint32_t(n) : 32 * kSolveSimdGroups}}
               .tensor(a.t)
               .tensor(rhs.t)
               .tensor(bind(buf))
               .bytes(p));
  return left ? buf.mT() : buf;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lu_factor_ex(const at::Tensor& A, bool pivot, bool check_errors) {
  return overrides::counted(
      "mps_ext::lu_factor_ex", lu_factor_ex_unsupported(A, pivot), [&] { return lu_factor_ex_kernels(A, check_errors); },
      [&] { return at::linalg_lu_factor_ex(A, pivot, check_errors); });
}

at::Tensor lu_solve(const at::Tensor& LU, const at::Tensor& pivots, const at::Tensor& B, bool left, bool adjoint) {
  return overrides::counted(
      "mps_ext::lu_solve", lu_solve_unsupported(LU, pivots, B, left),
      [&] { return lu_solve_kernels(LU, pivots, B, left, adjoint); },
      [&] { return at::linalg_lu_solve(LU, pivots, B, left, adjoint); });
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> solve_ex(const at::Tensor& A, const at::Tensor& B,
                                                                    bool left, bool check_errors) {
  return overrides::counted(
      "mps_ext::solve_ex", solve_ex_unsupported(A, B, left), [&] { return solve_ex_kernels(A, B, left, check_errors); },
      [&] { return at::_linalg_solve_ex(A, B, left, check_errors); });
}

std::tuple<at::Tensor, at::Tensor> inv_ex(const at::Tensor& A, bool check_errors) {
  return overrides::counted(
      "mps_ext::inv_ex", inv_ex_unsupported(A), [&] { return inv_ex_kernels(A, check_errors); },
      [&] { return at::linalg_inv_ex(A, check_errors); });
}

std::tuple<at::Tensor, at::Tensor> qr(const at::Tensor& A, c10::string_view mode) {
  return overrides::counted(
      "mps_ext::qr", qr_unsupported(A, mode), [&] { return qr_kernels(A, mode); },
      [&] { return at::linalg_qr(A, mode); });
}

at::Tensor householder_product(const at::Tensor& A, const at::Tensor& tau) {
  return overrides::counted(
      "mps_ext::householder_product", householder_product_unsupported(A, tau),
      [&] { return householder_product_kernels(A, tau); }, [&] { return at::linalg_householder_product(A, tau); });
}

at::Tensor solve_triangular(const at::Tensor& A, const at::Tensor& B, bool upper, bool left, bool unitriangular) {
  return overrides::counted(
      "mps_ext::solve_triangular", solve_triangular_unsupported(A, B, left),
      [&] { return solve_triangular_kernels(A, B, upper, left, unitriangular); },
      [&] { return at::linalg_solve_triangular(A, B, upper, left, unitriangular); });
}

}  // namespace mps_ext::ops

TORCH_LIBRARY_FRAGMENT(mps_ext, m) {
  m.def("lu_factor_ex(Tensor A, *, bool pivot=True, bool check_errors=False) -> (Tensor LU, Tensor pivots, Tensor info)");
  m.def("lu_solve(Tensor LU, Tensor pivots, Tensor B, *, bool left=True, bool adjoint=False) -> Tensor");
  m.def("solve_ex(Tensor A, Tensor B, *, bool left=True, bool check_errors=False) -> (Tensor result, Tensor LU, "
        "Tensor pivots, Tensor info)");
  m.def("inv_ex(Tensor A, *, bool check_errors=False) -> (Tensor inverse, Tensor info)");
  m.def("qr(Tensor A, str mode='reduced') -> (Tensor Q, Tensor R)");
  m.def("householder_product(Tensor A, Tensor tau) -> Tensor");
  m.def("solve_triangular(Tensor A, Tensor B, *, bool upper, bool left=True, bool unitriangular=False) -> Tensor");
}

#define MPS_EXT_LINALG_IMPL(key)                                                   \
  TORCH_LIBRARY_IMPL(mps_ext, key, m) {                                            \
    m.impl("lu_factor_ex", TORCH_FN(mps_ext::ops::lu_factor_ex));                  \
    m.impl("lu_solve", TORCH_FN(mps_ext::ops::lu_solve));                          \
    m.impl("solve_ex", TORCH_FN(mps_ext::ops::solve_ex));                          \
    m.impl("inv_ex", TORCH_FN(mps_ext::ops::inv_ex));                              \
    m.impl("qr", TORCH_FN(mps_ext::ops::qr));                                      \
    m.impl("householder_product", TORCH_FN(mps_ext::ops::householder_product));    \
    m.impl("solve_triangular", TORCH_FN(mps_ext::ops::solve_triangular));          \
  }

MPS_EXT_LINALG_IMPL(CPU)
MPS_EXT_LINALG_IMPL(MPS)
