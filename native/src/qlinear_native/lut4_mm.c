/* 4-bit look-up-table weights (bitsandbytes NF4 / FP4) times bfloat16 activations on AMX tiles (TDPBF16PS), for
 * larger M (the AVX-512 kernel, lut4_mv.c, pays per row for every weight); layout in lut4.h.
 *
 * Exact products from bfloat16 tiles: each block's float32 table tab = fl(table * absmax) is split, per entry,
 * into three bfloat16 terms by truncation: hi = tab with its low 16 bits cleared, r = tab - hi (exact: the 16
 * bits below hi), mid = r with its low 16 bits cleared, lo = r - mid (exact, at most 8 significant bits: a
 * bfloat16). So w = hi + mid + lo exactly, and x * hi, x * mid, x * lo are exact in TDPBF16PS for a bfloat16 x;
 * the three A tiles accumulate into the same float32 C tile (sums in float32, three addends per product). A
 * weight below about 2**-110 in magnitude loses the terms that fall below the float32 normal range, and
 * bfloat16 activations below 2**-126 (denormals) are read as zero (TDPBF16PS flushes denormal inputs).
 * Decode of one k-step (32 columns of a channel, 16 code bytes): broadcast to the four 128-bit lanes, VPSRLVW
 * shifts every word of lane l right by 4 l, so word j of lane l holds the code of column 4 j + (1, 0, 3, 2)[l]
 * in its low 4 bits (high nibble first); VPERMW reads 5 bits of each index, so each term's 16 entries sit twice
 * in its 32-word table and the bits above the nibble need no masking: three VPERMW give the three A tile rows.
 * The activations are packed once per call into B tiles in the same column order (pack_b).
 * Shape: the weight is the A operand (16 channels x 32 columns per tile; tiles 4, 5, 6 hold the three terms), x
 * the B operand (tile 7: 16 column pairs x up to 16 rows), C[channel][row] in tiles 0-3, one per m-tile: per
 * k-step, 3 A loads and one B load per m-tile feed 3 TDPBF16PS per m-tile. Channels go 16 at a time; up to four
 * m-tiles (64 rows) keep their C tiles over all of K, more rows decode the group again per 64 (the codes are then
 * in cache; the policy in native_lut4.py stops at 64 rows anyway).
 * Cost, measured one thread on 4096x14336 (blocksize 64): the decode (3 VPERMW and three 64-byte stores per 32
 * weights, plus the tables: about 5.5 ms) and the tiles (TDPBF16PS about 5-6.5 ns each, three per 16 x 32 x 16
 * product: 2 ms at M <= 16, 9-10 ms at M = 64) add up rather than overlap: the tile loads and the decode's
 * stores share L1 bandwidth (the TDPBF16PS alone overlap the decode fully). Decoding a segment's share per k-step
 * (the software pipelining in group()) and TILELOADDT1 for B measured no better.
 */
#include "lut4.h"
#if QL_X86
#include <stdlib.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,fma")))
/* K segment (columns) decoded per step of the pipeline (64: 5-10% slower, 256: 5-15% slower), and the hint of
 * the prefetch of the next group's codes (into L2). */
#ifndef Q4_SEG
#define Q4_SEG 128
#endif
#ifndef Q4_MM_HINT
#define Q4_MM_HINT _MM_HINT_T1
#endif
#define STEP (3 * 512) /* words of one decoded k-step: [3 terms][16 channels][32] */

static int amx_state = -1; /* -1 unknown, 0 no, 1 yes */

/* AMX-TILE and AMX-BF16, with the AVX-512 the decode uses (q4_mv_ready's). */
int q4_amx_ready(void) { return ql_amx_ready_once(&amx_state, q4_mv_ready); }

/* Column (within its k-step) of position p (0..31) of a decoded tile row. */
static int position_column(int p) {
    static const int lane[4] = {1, 0, 3, 2};
    return 4 * (p % 8) + lane[p / 8];
}

/* x -> B tiles [mt][steps][16 pairs][mc rows][2] in position order (zeros past M). */
AMX_TARGET static void pack_b(const q4_call *c, int64_t mc, int64_t mt, uint16_t *bp) {
    const int64_t steps = c->k / 32;
    int16_t perm[32];
    int32_t rowoff[16];
    for (int p = 0; p < 32; p++)
        perm[p] = (int16_t)position_column(p);
    for (int q = 0; q < 16; q++)
        rowoff[q] = (int32_t)(q * mc);
    const __m512i pv = _mm512_loadu_si512((const void *)perm), ro = _mm512_loadu_si512((const void *)rowoff);
    for (int64_t t = 0; t < mt; t++)
        for (int64_t mm = 0; mm < mc; mm++) {
            const int64_t i = t * 16 + mm;
            const uint16_t *xi = (const uint16_t *)c->x + i * c->ldx;
            for (int64_t st = 0; st < steps; st++) {
                int *tile = (int *)(bp + (t * steps + st) * 32 * mc) + mm;
                const __m512i v = i < c->m ? _mm512_loadu_si512((const void *)(xi + 32 * st)) : _mm512_setzero_si512();
                _mm512_i32scatter_epi32(tile, ro, _mm512_permutexvar_epi16(pv, v), 4);
            }
        }
}

/* Tiles 0-3: C (16 channels x mc rows, float32) of up to four m-tiles; 4, 5, 6: the A tiles of the three terms
 * (16 channels x 32 columns); 7: B (16 column pairs x mc rows). */
AMX_TARGET static void config_tiles(int64_t mc) {
    const uint16_t cb = (uint16_t)(4 * mc);
    ql_load_tiles((const uint16_t[8]){cb, cb, cb, cb, 64, 64, 64, cb});
}

/* Decode columns [k0, k1) of channels n0 + r0 .. n0 + r1 - 1 (of a group of 16; rows past N repeat row N - 1),
 * channel by channel, into k-step slots of STEP words ([term][16 channels][32]). Each block's three replicated
 * bfloat16 tables are built in registers. */
AMX_TARGET static void decode_seg(const q4_call *c, int64_t n0, int r0, int r1, int64_t k0, int64_t k1,
                                  uint16_t *abuf) {
    const __m512 t = _mm512_loadu_ps(c->table);
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
    const __m512i sel = _mm512_set_epi16(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1, 31, 29, 27, 25,
                                         23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1); /* float32 lane w % 16's high word */
    const __m512i shift = _mm512_set_epi16(12, 12, 12, 12, 12, 12, 12, 12, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4,
                                           4, 0, 0, 0, 0, 0, 0, 0, 0);
    const int64_t kb = c->k / 2, nb = c->k / c->block, bs = c->block / 32, nst = (k1 - k0) / 32;
    int64_t bi[Q4_SEG / 32]; /* step -> its block, or -1 when the previous step's tables still hold */
    for (int64_t st = 0, g = k0 / 32, b = g / bs, in = g - b * bs; st < nst; st++) {
        bi[st] = st == 0 || in == 0 ? b : -1;
        if (++in == bs)
            in = 0, b++;
    }
    for (int r = r0; r < r1; r++) {
        const int64_t ch = n0 + r < c->n ? n0 + r : c->n - 1;
        const uint8_t *row = c->codes + ch * kb;
        const float *am = c->absmax + ch * nb;
        uint16_t *dst = abuf + r * 32;
        __m512i hi = _mm512_setzero_si512(), mid = hi, lo = hi;
        for (int64_t st = 0, col = k0; st < nst; st++, col += 32, dst += STEP) {
            if (bi[st] >= 0) {
                const __m512 ta = _mm512_mul_ps(t, _mm512_set1_ps(am[bi[st]]));
                const __m512 h = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(ta), top));
                const __m512 rest = _mm512_sub_ps(ta, h);
                const __m512 m = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(rest), top));
                hi = _mm512_permutexvar_epi16(sel, _mm512_castps_si512(h));
                mid = _mm512_permutexvar_epi16(sel, _mm512_castps_si512(m));
                lo = _mm512_permutexvar_epi16(sel, _mm512_castps_si512(_mm512_sub_ps(rest, m)));
            }
            if (col % 128 == 0) /* the same columns of the next group's channel */
                _mm_prefetch((const char *)(row + col / 2 + 16 * kb), Q4_MM_HINT);
            const __m128i q = _mm_loadu_si128((const __m128i *)(row + col / 2));
            const __m512i idx = _mm512_srlv_epi16(_mm512_broadcast_i32x4(q), shift);
            _mm512_store_si512((void *)dst, _mm512_permutexvar_epi16(idx, hi));
            _mm512_store_si512((void *)(dst + 512), _mm512_permutexvar_epi16(idx, mid));
            _mm512_store_si512((void *)(dst + 1024), _mm512_permutexvar_epi16(idx, lo));
        }
    }
}

/* C tile u += the three terms' A tiles (4, 5, 6) x B tile 7; tile numbers are immediates. */
#define TDP3(u)                                                                                                   \
    do {                                                                                                          \
        _tile_dpbf16ps(u, 4, 7);                                                                                  \
        _tile_dpbf16ps(u, 5, 7);                                                                                  \
        _tile_dpbf16ps(u, 6, 7);                                                                                  \
    } while (0)

/* TDPBF16PS of one decoded k-step (slot a) with the B tiles of `mts` m-tiles (b: the first m-tile's, tstep words
 * between m-tiles, ldb bytes per B row). */
AMX_TARGET static inline void tdp_step(const uint16_t *a, const uint16_t *b, int64_t tstep, int64_t ldb, int mts) {
    _tile_loadd(4, a, 64);
    _tile_loadd(5, a + 512, 64);
    _tile_loadd(6, a + 1024, 64);
    _tile_loadd(7, b, ldb);
    TDP3(0);
    if (mts > 1) {
        _tile_loadd(7, b + tstep, ldb);
        TDP3(1);
    }
    if (mts > 2) {
        _tile_loadd(7, b + 2 * tstep, ldb);
        TDP3(2);
    }
    if (mts > 3) {
        _tile_loadd(7, b + 3 * tstep, ldb);
        TDP3(3);
    }
}

/* float32 x16 -> bfloat16 x16, round to nearest even, NaN kept quiet (ql_bf16, 16 lanes). */
AMX_TARGET static inline __m256i bf16x16(__m512 v) {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF),
                                                           _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)),
                                                  _mm512_set1_epi32(0x7F800000));
    const __m512i q = _mm512_mask_or_epi32(r, nan, u, _mm512_set1_epi32(0x400000)); /* NaN: unrounded, quieted */
    return _mm512_cvtepi32_epi16(_mm512_srli_epi32(q, 16));
}

/* C tiles (cb: mts tiles of 16 channels x mc rows) -> out rows m0 .., channels n0 .. n0 + 15 (those < N). */
AMX_TARGET static void put_tiles(const q4_call *c, const float *cb, int64_t mc, int mts, int64_t m0, int64_t n0) {
    const __m512i gi = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32((int)mc));
    const __mmask16 keep = c->n - n0 >= 16 ? 0xFFFF : (__mmask16)((1u << (c->n - n0)) - 1);
    for (int u = 0; u < mts; u++)
        for (int64_t i = 0; i < mc && m0 + 16 * u + i < c->m; i++) {
            const __m512 v = _mm512_i32gather_ps(gi, cb + u * 16 * mc + i, 4);
            const int64_t row = m0 + 16 * u + i;
            if (c->x_f32)
                _mm512_mask_storeu_ps((float *)c->out + row * c->ldo + n0, keep, v);
            else
                _mm256_mask_storeu_epi16((uint16_t *)c->out + row * c->ldo + n0, keep, bf16x16(v));
        }
}

/* Channels n0 .. n0 + 15 for all rows, in blocks of up to four m-tiles whose C tiles stay in the tile registers
 * over all of K. The TDPBF16PS of segment g's k-steps alternate with the decode of a share of segment g + 1's
 * channels (two segment buffers in abuf). Blocks past the first decode again (the group's codes are in cache). */
AMX_TARGET static void group(const q4_call *c, int64_t mc, int64_t mt, const uint16_t *bp, int64_t n0,
                             uint16_t *abuf, float *cb) {
    const int64_t tstep = c->k * mc, ldb = 4 * mc, sslots = Q4_SEG / 32 * STEP, k = c->k;
    for (int64_t t0 = 0; t0 < mt; t0 += 4) {
        const int mts = mt - t0 < 4 ? (int)(mt - t0) : 4;
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
        decode_seg(c, n0, 0, 16, 0, Q4_SEG < k ? Q4_SEG : k, abuf);
        for (int64_t k0 = 0, g = 0; k0 < k; k0 += Q4_SEG, g++) {
            const int64_t nst = ((k0 + Q4_SEG < k ? k0 + Q4_SEG : k) - k0) / 32;
            const int64_t c0next = k0 + Q4_SEG, c1next = c0next + Q4_SEG < k ? c0next + Q4_SEG : k;
            const uint16_t *seg = abuf + (g & 1) * sslots;
            uint16_t *next = abuf + ((g + 1) & 1) * sslots;
            const uint16_t *b = bp + t0 * tstep + k0 * mc;
            int r = 0;
            for (int64_t st = 0; st < nst; st++, b += 32 * mc) {
                tdp_step(seg + st * STEP, b, tstep, ldb, mts);
                const int r1 = (int)(16 * (st + 1) / nst);
                if (c0next < k)
                    decode_seg(c, n0, r, r1, c0next, c1next, next);
                r = r1;
            }
        }
        _tile_stored(0, cb, 4 * mc);
        _tile_stored(1, cb + 16 * mc, 4 * mc);
        _tile_stored(2, cb + 32 * mc, 4 * mc);
        _tile_stored(3, cb + 48 * mc, 4 * mc);
        put_tiles(c, cb, mc, mts, t0 * 16, n0);
    }
}

AMX_TARGET int q4_mm(const q4_call *c) {
    const int64_t mc = c->m <= 16 ? c->m : 16, mt = (c->m + 15) / 16, units = (c->n + 15) / 16;
    const int threads = ql_threads(c->threads, units);
    uint16_t *bp = aligned_alloc(64, (size_t)(mt * c->k * mc) * 2 + 64);
    if (!bp)
        return -1;
    pack_b(c, mc, mt, bp);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        int64_t lo, hi;
        ql_thread_share(units, &lo, &hi);
        uint16_t *abuf = aligned_alloc(64, (size_t)(2 * Q4_SEG / 32 * STEP) * 2);
        float *cb = aligned_alloc(64, 4 * 256 * sizeof(float));
        if (abuf && cb) {
            config_tiles(mc);
            for (int64_t u = lo; u < hi; u++)
                group(c, mc, mt, bp, u * 16, abuf, cb);
            _tile_release();
        } else {
            failed = 1;
        }
        free(abuf);
        free(cb);
    }
    free(bp);
    return failed ? -1 : 0;
}
#else
int q4_amx_ready(void) { return 0; }
#endif
