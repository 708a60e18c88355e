/* qlinear_native._blocks: GGUF blocks as stored times float32 activations (blocks.c). */
#ifndef QL_BLOCKS_H
#define QL_BLOCKS_H
#include <stdint.h>

typedef enum { QL_Q8_0, QL_Q4_0, QL_Q4_1, QL_Q4_K, QL_Q6_K } ql_block;

int ql_blocks_ready(void);
/* out[M, ldo] = x[M, ldx] @ W^T for W the [N, K/32 blocks] of type t (K-quants: K/256 super-blocks);
 * xs[M, K/32]: each 32-value block's sum of x (read for Q4_0, Q4_1, Q4_K). */
void ql_blocks_mm(ql_block t, const float *x, long long ldx, const float *xs, const uint8_t *w, float *out,
                  long long ldo, long long m, long long k, long long n, int threads);
#endif
