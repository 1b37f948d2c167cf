// Tensor contractions on the CPU: OpenBLAS GEMM plus the bias / GELU epilogue.
#include <cblas.h>

#include <cmath>
#include <vector>

#include "ops/cpu/reference.h"
#include "ops/cpu/scalar.h"

namespace anatomy::ref {

namespace {

CBLAS_TRANSPOSE blas_trans(Trans t) { return t == Trans::N ? CblasNoTrans : CblasTrans; }

template <class T>
void gemm(T* c, const T* a, Trans ta, const T* b, Trans tb, int64_t m, int64_t n, int64_t k,
          T alpha, T beta) {
  // Row-major leading dimensions are the stored widths: A is [M,K] or [K,M], B [K,N] or [N,K].
  const int64_t lda = ta == Trans::N ? k : m;
  const int64_t ldb = tb == Trans::N ? n : k;
  if constexpr (std::is_same_v<T, float>) {
    cblas_sgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), m, n, k, alpha, a, lda, b, ldb, beta,
                c, n);
  } else {
    cblas_dgemm(CblasRowMajor, blas_trans(ta), blas_trans(tb), m, n, k, alpha, a, lda, b, ldb, beta,
                c, n);
  }
}

}  // namespace

template <class T>
void matmul(T* c, const T* a, Trans ta, const T* b, Trans tb, int64_t m, int64_t n, int64_t k,
            T alpha, T beta, Epilogue epilogue, const T* bias, T* gelu_in) {
  ANATOMY_CHECK(epilogue != Epilogue::BiasGrad,
                "ref::matmul: BiasGrad is the GEMM then ref::bias_grad (the backend's call)");
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // BLAS may skip the beta scaling for an empty reduction; make C = beta * C_old explicit.
    for (int64_t i = 0; i < m * n; ++i) c[i] = beta == T(0) ? T(0) : beta * c[i];
  } else {
    gemm(c, a, ta, b, tb, m, n, k, alpha, beta);
  }
  if (epilogue == Epilogue::None) return;
#pragma omp parallel for if (m * n > kParallelWork)
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * n;
    for (int64_t j = 0; j < n; ++j) {
      T pre = row[j] + bias[j];
      if (epilogue == Epilogue::BiasGelu) {
        gelu_in[i * n + j] = pre;
        row[j] = gelu_value(pre);
      } else {
        row[j] = pre;
      }
    }
  }
}

template <class T>
void bias_grad(T* db, const T* dy, int64_t rows, int64_t n) {
  column_sums(db, rows, n, [dy, n](int64_t r, int64_t j) { return double(dy[r * n + j]); });
}

#define ANATOMY_INSTANTIATE(T)                                                                   \
  template void matmul<T>(T*, const T*, Trans, const T*, Trans, int64_t, int64_t, int64_t, T, T, \
                          Epilogue, const T*, T*);                                               \
  template void bias_grad<T>(T*, const T*, int64_t, int64_t);
ANATOMY_INSTANTIATE(float)
ANATOMY_INSTANTIATE(double)
#undef ANATOMY_INSTANTIATE

}  // namespace anatomy::ref
