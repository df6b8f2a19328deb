#pragma once
// CPU reference kernels for index_select / gather and their accumulating backwards.
#include "ember/backend/cpu/elementwise.hpp"

namespace ember::cpu {

template <class T>
void index_select(const T* x, const int64_t* idx, T* out, int64_t outer, int64_t src_n, int64_t idx_n,
                  int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < idx_n; ++j) {
      const T* src = x + (o * src_n + idx[j]) * inner;
      T* dst = out + (o * idx_n + j) * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = src[i];
    }
}

template <class T>
void index_add(const T* gy, const int64_t* idx, T* gx, int64_t outer, int64_t src_n, int64_t idx_n, int64_t inner) {
  using C = calc_t<T>;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < idx_n; ++j) {
      const T* src = gy + (o * idx_n + j) * inner;
      T* dst = gx + (o * src_n + idx[j]) * inner;
      for (int64_t i = 0; i < inner; ++i) dst[i] = from_calc<T>(static_cast<C>(dst[i]) + static_cast<C>(src[i]));
    }
}

template <class T>
void gather(const T* x, const int64_t* idx, T* out, int64_t outer, int64_t src_n, int64_t idx_n, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < idx_n; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t k = (o * idx_n + j) * inner + i;
        out[k] = x[(o * src_n + idx[k]) * inner + i];
      }
}

template <class T>
void scatter_add(const T* gy, const int64_t* idx, T* gx, int64_t outer, int64_t src_n, int64_t idx_n, int64_t inner) {
  using C = calc_t<T>;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t j = 0; j < idx_n; ++j)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t k = (o * idx_n + j) * inner + i;
        T& d = gx[(o * src_n + idx[k]) * inner + i];
        d = from_calc<T>(static_cast<C>(d) + static_cast<C>(gy[k]));
      }
}

}  // namespace ember::cpu
