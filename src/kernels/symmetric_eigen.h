// Eigen-decomposition of a small symmetric matrix (a head's key covariance: key whitening, the
// transform codec's PCA). Cyclic Jacobi rotations: slow for large n, but n is a head size
// (<= 256) and this runs once per head at start-up; it converges to double precision.
#pragma once

#include <cstdint>

namespace kvs {

// a[n][n] (row-major, destroyed) = V diag(eig) V^T; V's columns (v[d * n + i]: column i) are the
// eigenvectors, eig[i] their eigenvalues, unsorted.
void SymmetricEigen(double* a, int32_t n, double* eig, double* v);

}  // namespace kvs
