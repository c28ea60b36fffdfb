/*
 * knn_int — internals of knn shared inside index/: the AVX-512 row scans (knn_avx512.c,
 * compiled with AVX-512 flags: the k = 1 argmin and the k-heap's candidates), which knn.c
 * calls only when the CPU has AVX-512F. Not a public API (white-box unit tests may
 * include it).
 */
#ifndef TSR_KNN_INT_H
#define TSR_KNN_INT_H

#include <stddef.h>
#include <stdint.h>

/* The k = 1 L2 scan of one row, n % 16 == 0, n < 2^31 (contract in knn_avx512.c). */
void tsr__knn_argmin_avx512(const float *row, const float *yn, float xn, size_t n,
                            float *best, int64_t *bi, size_t y0);
/* The next block of 16 of one row with a k-heap candidate (contract in knn_avx512.c). */
size_t tsr__knn_next_cand_avx512(const float *row, const float *yn, float xn, size_t j,
                                 size_t n, float thr, int lb, float *v, unsigned *mask);

#endif
