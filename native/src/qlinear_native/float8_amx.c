/* FP8 and FP4 weights times bfloat16 activations on AMX tiles (TDPBF16PS); formats in float8.h.
 *
 * Why: past two activation rows the AVX-512 kernels (float8_mv.c) pay per row for every product, while a
 * TDPBF16PS multiplies 16 channels x 32 columns by up to 16 rows in one instruction. The weight is the A
 * operand (16 channels x 32 columns of bfloat16 per tile: a row of W decodes straight into a tile row, no
 * transpose), the activations the B operand (16 column pairs x M rows, packed once per call), so
 * C[channel][row] = W x^T. A tile's 32 columns may be any 32 columns of K as long as B packs the same ones in
 * the same order (column() below). Each weight row is decoded once per call, 16 channels (M <= 16) or 32
 * (M > 16: two A tiles share each B tile load) and a K segment of at most QF_KC columns (QF_KC / 2 when
 * M > 16, so that the segment's A and B tiles stay in L1) at a time, into an L1 buffer that the tile loads
 * read; every 16-row block of activations uses it. C tiles stay over a scale block's segments where they can
 * (M <= 32), so that the tile unit works while the next segment decodes; a TILESTORED right after the
 * TDPBF16PS it waits on serializes the two (measured 1.5-2x slower).
 *   FP8: the exact bfloat16 of each code (float8_mv.c's VPERMI2B tables: subnormal codes become normal
 *     bfloat16, never a bit-shifted denormal, which TDPBF16PS would read as zero), in VPUNPCKL/HBW order
 *     (k-steps 2s, 2s + 1 hold one 64-column chunk) or, for bk % 64 == 32 and a trailing 32 columns, column
 *     order (VPERMT2B). C is scaled in float32 once per scale block: acc[c][m] += scale[c, block] * C[c][m].
 *     M <= 16: blocks of bk >= QF_KC accumulate over their segments in one C tile, smaller ones go two to a
 *     segment; C tile sets {0, 1} and {2, 3} alternate, a set being stored and scaled only after the next
 *     set's TDPBF16PS are issued, so the tile unit's work overlaps the next decode.
 *   FP4: the block scale is folded into the bfloat16 weight, exactly: an E2M1 code times an e4m3 scale has at
 *     most 6 significant bits (a normal bfloat16 for every scale byte), and times 2**(e - 127) is exact for
 *     2 <= e <= 252. A k-step is 16 bytes, broadcast to the four 128-bit lanes; lane l shifts each word right by
 *     4 l (VPSRLVW), so word j of lane l indexes the code of column 4 j + l, and VPERMW looks it up in a
 *     32-entry table of bfloat16 (code x scale): NVFP4 the two 16-column blocks' rows of qf_nv_tab (index | 16
 *     for words of the second block), MXFP4 one qf_mx_tab row twice (VPERMW reads 5 bits). A channel group
 *     holding an E8M0 byte outside 2..252 is computed by the exact AVX-512 kernel instead. y = g * C.
 * bfloat16 activations below 2**-126 in magnitude (denormals) are read as zero by TDPBF16PS.
 * AMX needs the kernel's permission to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM), asked by qf_amx_ready().
 */
#include "float8.h"
#if QL_X86
#include <stdlib.h>

#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512dq,avx512vbmi,fma")))
/* Bytes ahead in each weight row that the decode prefetches, the hint, and the segment length (columns). Measured
 * on 4096x14336 at M = 1 and 16: prefetch 0 to 256 equal within noise, 512 to 2048 (T0 or T1) 5-20% slower;
 * QF_KC 256 equal, 1024 15-30% slower. */
#ifndef QF_PREFETCH
#define QF_PREFETCH 256
#endif
#ifndef QF_HINT
#define QF_HINT _MM_HINT_T0
#endif
#ifndef QF_KC
#define QF_KC 512
#endif
#ifndef QF_PREFETCH4
#define QF_PREFETCH4 QF_PREFETCH
#endif
#ifndef QF_HINT4
#define QF_HINT4 QF_HINT
#endif

static int amx_state = -1; /* -1 unknown, 0 no, 1 yes */

/* AMX-BF16 on top of the AVX-512 kernels' requirements: the decode uses their VBMI tables, and FP4 groups with
 * an inexact scale run on them. */
int qf_amx_ready(void) { return ql_amx_ready_once(&amx_state, qf_mv_ready); }

/* Shape of one call: a group is 16 output channels (one A tile: 16 separate weight rows stream at once, which
 * the prefetchers follow; 64 rows at once measured 1.5-2x slower) or, when M > 16, 32 (two A tiles, each B tile
 * load serving two TDPBF16PS: the B stream from L2 bounds large M), mc columns per C/B tile (M when M <= 16,
 * else 16), mt m-tiles, kc the longest K segment decoded at once (16 rows x kc bfloat16 per A tile, in L1). */
typedef struct {
    int64_t mc, mt, ta, kc, steps; /* ta: A tiles (16-channel tiles) per group: 1, or 2 when M > 16 */
    int natural;          /* fp8: every k-step in column order */
    int32_t sidx[16][16]; /* lane l of scale vector j (accumulate): channel (16 j + l) / mc */
} shape;

static shape shape_of(const qf_call *c, int fp8) {
    shape s;
    s.mc = c->m <= 16 ? c->m : 16;
    s.mt = (c->m + 15) / 16;
    s.ta = c->m <= 16 ? 1 : 2;
    s.kc = c->m <= 16 ? QF_KC : QF_KC / 2; /* M > 16: two A tiles and two B tiles per k-step in L1 */
    s.steps = c->k / 32;
    s.natural = fp8 && c->blk < c->k && c->blk % 64 != 0;
    for (int j = 0; j < 16; j++)
        for (int l = 0; l < 16; l++)
            s.sidx[j][l] = (int32_t)((16 * j + l) / s.mc);
    return s;
}

/* Column (within K) of position p (0..31) of k-step st's tile rows. */
static int64_t column(const qf_call *c, const shape *s, int fp8, int64_t st, int p) {
    if (!fp8)
        return st * 32 + 4 * (p % 8) + p / 8;
    if (s->natural || (st == s->steps - 1 && c->k % 64))
        return st * 32 + p;
    return (st / 2) * 64 + 16 * (p / 8) + 8 * (st % 2) + p % 8;
}

/* x -> B tiles [mt][steps][16 pairs][mc rows][2] (zeros past M). */
static void pack_b(const qf_call *c, const shape *s, int fp8, uint16_t *bp) {
    int64_t col[32];
    for (int64_t st = 0; st < s->steps; st++) {
        for (int p = 0; p < 32; p++)
            col[p] = column(c, s, fp8, st, p);
        for (int64_t t = 0; t < s->mt; t++) {
            uint16_t *tile = bp + (t * s->steps + st) * 32 * s->mc;
            for (int64_t mm = 0; mm < s->mc; mm++) {
                const int64_t i = t * 16 + mm;
                const uint16_t *xi = c->x + i * c->ldx;
                for (int p = 0; p < 32; p++)
                    tile[(p / 2) * 2 * s->mc + 2 * mm + p % 2] = i < c->m ? xi[col[p]] : 0;
            }
        }
    }
}

/* Tiles 0-3: C (16 channels x mc float32); 4, 5: A (16 channels x 32 bfloat16); 6, 7: B (16 pairs x mc rows). */
AMX_TARGET static void config_tiles(const shape *s) {
    const uint16_t cb = (uint16_t)(4 * s->mc);
    ql_load_tiles((const uint16_t[8]){cb, cb, cb, cb, 64, 64, cb, cb});
}

/* Decode columns [k0, k1) of the group's 16 channels into abuf [step][16][32] (fp8). */
AMX_TARGET static void decode_fp8(const qf_call *c, const shape *s, int64_t n0, int64_t k0, int64_t k1,
                                  uint16_t *abuf) {
    const uint8_t *lo8 = qf_fp8_lo[c->fmt], *hi8 = qf_fp8_hi[c->fmt];
    const __m512i l0 = _mm512_loadu_si512((const void *)lo8), l1 = _mm512_loadu_si512((const void *)(lo8 + 64));
    const __m512i h0 = _mm512_loadu_si512((const void *)hi8), h1 = _mm512_loadu_si512((const void *)(hi8 + 64));
    const __m512i sign = _mm512_set1_epi8((char)0x80);
    uint8_t ib[2][64];
    qf_column_order(ib);
    const __m512i nat0 = _mm512_loadu_si512(ib[0]), nat1 = _mm512_loadu_si512(ib[1]);
    for (int64_t r = 0; r < 16; r++) {
        const int64_t ch = n0 + r < c->n ? n0 + r : c->n - 1;
        const uint8_t *row = c->w + ch * c->k;
        uint16_t *dst = abuf + r * 32; /* + step * 512 */
        int64_t kk = k0, st = 0;
        for (; kk < k1; kk += 64, st += 2) {
            _mm_prefetch((const char *)(row + kk + QF_PREFETCH), QF_HINT);
            const int full = kk + 64 <= k1;
            const __m512i v = full ? _mm512_loadu_si512((const void *)(row + kk))
                                   : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(row + kk)));
            const __m512i lo = _mm512_permutex2var_epi8(l0, v, l1);
            const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(h0, v, h1), v, sign, 0xF8);
            if (!full || s->natural) {
                _mm512_store_si512((void *)(dst + st * 512), _mm512_permutex2var_epi8(lo, nat0, hi));
                if (full)
                    _mm512_store_si512((void *)(dst + (st + 1) * 512), _mm512_permutex2var_epi8(lo, nat1, hi));
            } else {
                _mm512_store_si512((void *)(dst + st * 512), _mm512_unpacklo_epi8(lo, hi));
                _mm512_store_si512((void *)(dst + (st + 1) * 512), _mm512_unpackhi_epi8(lo, hi));
            }
        }
    }
}

/* The same for fp4, the block scales folded in. */
AMX_TARGET static void decode_fp4(const qf_call *c, const shape *s, int64_t n0, int64_t k0, int64_t k1,
                                  uint16_t *abuf) {
    (void)s;
    const __m512i shift = _mm512_set_epi16(12, 12, 12, 12, 12, 12, 12, 12, 8, 8, 8, 8, 8, 8, 8, 8, 4, 4, 4, 4, 4, 4, 4,
                                           4, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512i block = _mm512_set_epi16(16, 16, 16, 16, 0, 0, 0, 0, 16, 16, 16, 16, 0, 0, 0, 0, 16, 16, 16, 16, 0,
                                           0, 0, 0, 16, 16, 16, 16, 0, 0, 0, 0); /* words j >= 4: second block */
    const __m512i nib = _mm512_set1_epi16(15);
    const int64_t nbk = c->k / c->blk;
    const int nv = c->fmt == QF_NVFP4;
    for (int64_t r = 0; r < 16; r++) {
        const int64_t ch = n0 + r < c->n ? n0 + r : c->n - 1;
        const uint8_t *p = c->w + ch * (c->k / 2) + k0 / 2, *sc = (const uint8_t *)c->scale + ch * nbk + k0 / c->blk;
        uint16_t *dst = abuf + r * 32;
        for (int64_t st = 0; st < (k1 - k0) / 32; st++, p += 16) {
            if (!(st & 3))
                _mm_prefetch((const char *)(p + QF_PREFETCH4), QF_HINT4);
            const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)p));
            __m512i idx = _mm512_srlv_epi16(v, shift), t;
            if (nv) {
                t = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)qf_nv_tab[sc[0]])),
                                       _mm256_loadu_si256((const __m256i *)qf_nv_tab[sc[1]]), 1);
                idx = _mm512_ternarylogic_epi32(idx, nib, block, 0xEA); /* (idx & 15) | block */
                sc += 2;
            } else {
                t = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)qf_mx_tab[*sc++]));
            }
            _mm512_store_si512((void *)(dst + st * 512), _mm512_permutexvar_epi16(idx, t));
        }
    }
}

/* acc (16 x mc float32, flat) += scale (x) C: C the float32 tile of one channel tile and m-tile, stored flat
 * in cb; sv: its 16 channels' scales (fp8), NULL for fp4 (a plain sum). */
AMX_TARGET static inline void accumulate(const shape *s, const float *cb, float *acc, const __m512 *sv,
                                         int64_t mc) {
    for (int64_t j = 0; j < mc; j++) {
        const __m512 cv = _mm512_loadu_ps(cb + 16 * j), av = _mm512_loadu_ps(acc + 16 * j);
        if (sv) {
            const __m512i idx = _mm512_loadu_si512((const void *)s->sidx[j]);
            _mm512_storeu_ps(acc + 16 * j, _mm512_fmadd_ps(_mm512_permutexvar_ps(idx, *sv), cv, av));
        } else {
            _mm512_storeu_ps(acc + 16 * j, _mm512_add_ps(cv, av));
        }
    }
}

/* Does channel group n0 hold an E8M0 scale whose folded table row would be inexact? */
static int mx_inexact(const qf_call *c, int64_t n0, int64_t rows) {
    const int64_t nbk = c->k / c->blk;
    const int64_t end = (n0 + rows < c->n ? n0 + rows : c->n) * nbk;
    const uint8_t *sc = (const uint8_t *)c->scale;
    unsigned bad = 0;
    for (int64_t i = n0 * nbk; i < end; i++)
        bad |= (uint8_t)(sc[i] - 2) > 250; /* not in 2..252 (qf_mx_exact) */
    return bad != 0;
}

/* The 16 channel scales of block b of group n0 (fp8), rows past N repeating row N - 1. */
AMX_TARGET static inline __m512 block_scales(const qf_call *c, int64_t n0, int64_t nb, int64_t b) {
    int32_t off[16];
    for (int l = 0; l < 16; l++)
        off[l] = (int32_t)((n0 + l < c->n ? n0 + l : c->n - 1) * nb + b);
    return _mm512_i32gather_ps(_mm512_loadu_si512((const void *)off), (const float *)c->scale, 4);
}

/* C tile t += A (tile 4) x B (tile 6); tile numbers are immediates. */
AMX_TARGET static inline void tdp_into(int64_t t) {
    switch (t) {
    case 0: _tile_dpbf16ps(0, 4, 6); break;
    case 1: _tile_dpbf16ps(1, 4, 6); break;
    case 2: _tile_dpbf16ps(2, 4, 6); break;
    default: _tile_dpbf16ps(3, 4, 6); break;
    }
}

/* Store C tiles 0 .. n - 1 to cb (16 x mc float32 each). */
AMX_TARGET static inline void store_c(float *cb, int64_t n, int64_t mc) {
    _tile_stored(0, cb, 4 * mc);
    if (n > 1)
        _tile_stored(1, cb + 16 * mc, 4 * mc);
    if (n > 2)
        _tile_stored(2, cb + 32 * mc, 4 * mc);
    if (n > 3)
        _tile_stored(3, cb + 48 * mc, 4 * mc);
}

/* Decode columns [k0, k1) of group n0 into abuf. */
AMX_TARGET static inline void decode(const qf_call *c, const shape *s, int fp8, int64_t n0, int64_t k0, int64_t k1,
                                     uint16_t *abuf) {
    if (fp8)
        decode_fp8(c, s, n0, k0, k1, abuf);
    else
        decode_fp4(c, s, n0, k0, k1, abuf);
}

/* Store C tiles [first, first + n) and scale them into acc (fp8: blocks b .. b + n - 1; fp4: a plain sum). */
AMX_TARGET static void flush_c(const qf_call *c, const shape *s, int fp8, int64_t n0, int64_t nb, int64_t b,
                               int64_t first, int64_t n, float *cb, float *acc) {
    const int64_t mc = s->mc;
    if (first == 0) {
        _tile_stored(0, cb, 4 * mc);
        if (n > 1)
            _tile_stored(1, cb + 16 * mc, 4 * mc);
    } else {
        _tile_stored(2, cb, 4 * mc);
        if (n > 1)
            _tile_stored(3, cb + 16 * mc, 4 * mc);
    }
    for (int64_t t = 0; t < n; t++) {
        const __m512 sv = fp8 ? block_scales(c, n0, nb, b + t) : _mm512_setzero_ps();
        accumulate(s, cb + t * 16 * mc, acc, fp8 ? &sv : NULL, mc);
    }
}

/* M <= 16: one m-tile. Blocks go one (bk >= kc: over several segments) or two (bk < kc) at a time into a set of
 * C tiles, sets {0, 1} and {2, 3} alternating: a set is stored and scaled into acc only after the next one's
 * first segment is decoded and its TDPBF16PS issued, so the tiles' work overlaps the decode. */
AMX_TARGET static void group_small(const qf_call *c, const shape *s, int fp8, const uint16_t *bp, int64_t n0,
                                   int64_t bk, int64_t nb, uint16_t *abuf, float *cb, float *acc) {
    const int64_t mc = s->mc, k = c->k, per = bk >= s->kc ? 1 : 2; /* blocks per set */
    int64_t pend_b = -1, pend_set = 0, pend_n = 0;
    for (int64_t b0 = 0, g = 0; b0 < nb; b0 += per, g++) {
        const int64_t nblk = nb - b0 < per ? nb - b0 : per, kb1 = (b0 + nblk) * bk < k ? (b0 + nblk) * bk : k;
        const int64_t set = 2 * (g & 1);
        if (set == 0) {
            _tile_zero(0);
            _tile_zero(1);
        } else {
            _tile_zero(2);
            _tile_zero(3);
        }
        for (int64_t k0 = b0 * bk; k0 < kb1; k0 += s->kc) {
            const int64_t k1 = k0 + s->kc < kb1 ? k0 + s->kc : kb1;
            decode(c, s, fp8, n0, k0, k1, abuf);
            for (int64_t st = 0; st < (k1 - k0) / 32; st++) {
                _tile_loadd(6, bp + (k0 / 32 + st) * 32 * mc, 4 * mc);
                _tile_loadd(4, abuf + st * 512, 64);
                tdp_into(set + (nblk == 1 ? 0 : (k0 - b0 * bk + 32 * st) / bk));
            }
            if (pend_b >= 0) {
                flush_c(c, s, fp8, n0, nb, pend_b, pend_set, pend_n, cb, acc);
                pend_b = -1;
            }
        }
        pend_b = b0, pend_set = set, pend_n = nblk;
    }
    flush_c(c, s, fp8, n0, nb, pend_b, pend_set, pend_n, cb, acc);
}

/* TDPBF16PS of k-steps [0, nst) of the decoded segment (channel tiles in abuf and abuf + half) with the m-tile
 * pair at b0 (b0 + tstep: the second, if `two`) into C tiles 2 a + u. */
AMX_TARGET static inline void pair_steps(const uint16_t *abuf, int64_t half, const uint16_t *b0, int64_t tstep,
                                         int64_t nst, int two) {
    for (int64_t st = 0; st < nst; st++) {
        _tile_loadd(4, abuf + st * 512, 64);
        _tile_loadd(6, b0 + st * 512, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_loadd(5, abuf + half + st * 512, 64);
        _tile_dpbf16ps(2, 5, 6);
        if (two) {
            _tile_loadd(7, b0 + tstep + st * 512, 64);
            _tile_dpbf16ps(1, 4, 7);
            _tile_dpbf16ps(3, 5, 7);
        }
    }
}

/* M > 16: two channel tiles (A in tiles 4, 5; decoded to abuf and abuf + half) times m-tiles two at a time (B in
 * tiles 6, 7) into C tiles 2 a + u, stored and scaled into acc [a][m-tile][16][16]. Up to 32 rows the C tiles
 * stay over a whole scale block (its segments' decode overlapping the tiles' work); beyond, every segment's m
 * pairs are stored in turn. */
AMX_TARGET static void group_large(const qf_call *c, const shape *s, int fp8, const uint16_t *bp, int64_t n0,
                                   int64_t bk, int64_t nb, uint16_t *abuf, float *cb, float *acc) {
    const int64_t mt = s->mt, k = c->k, tstep = s->steps * 512, half = s->kc / 32 * 512;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t kb1 = (b + 1) * bk < k ? (b + 1) * bk : k;
        const __m512 sv[2] = {fp8 ? block_scales(c, n0, nb, b) : _mm512_setzero_ps(),
                              fp8 ? block_scales(c, n0 + 16, nb, b) : _mm512_setzero_ps()};
        for (int64_t k0 = b * bk; k0 < kb1; k0 += s->kc) {
            const int64_t k1 = k0 + s->kc < kb1 ? k0 + s->kc : kb1, nst = (k1 - k0) / 32;
            decode(c, s, fp8, n0, k0, k1, abuf);
            decode(c, s, fp8, n0 + 16, k0, k1, abuf + half);
            for (int64_t t = 0; t < mt; t += 2) {
                if (mt > 2 || k0 == b * bk) {
                    _tile_zero(0);
                    _tile_zero(1);
                    _tile_zero(2);
                    _tile_zero(3);
                }
                pair_steps(abuf, half, bp + t * tstep + (k0 / 32) * 512, tstep, nst, t + 1 < mt);
                if (mt > 2 || k1 == kb1) {
                    store_c(cb, 4, 16);
                    for (int64_t a = 0; a < 2; a++)
                        for (int64_t u = 0; u < 2 && t + u < mt; u++)
                            accumulate(s, cb + (2 * a + u) * 256, acc + (a * mt + t + u) * 256, fp8 ? &sv[a] : NULL,
                                       16);
                }
            }
        }
    }
}

/* Channels n0 .. n0 + 16 ta - 1 for all rows; scratch: abuf (ta x kc/32 steps of 16 x 32 bfloat16), cb (4 tiles
 * of 16 x 16 float32), acc (ta x mt x 16 x mc float32). Returns -1 when a fallback ran out of memory. */
AMX_TARGET static int group(const qf_call *c, const shape *s, int fp8, const uint16_t *bp, int64_t n0,
                            uint16_t *abuf, float *cb, float *acc) {
    const int64_t mt = s->mt, mc = s->mc, tile = 16 * mc, rows = 16 * s->ta;
    if (!fp8 && c->fmt == QF_MXFP4 && mx_inexact(c, n0, rows))
        return qf_fp4_mv_range(c, n0, n0 + rows < c->n ? n0 + rows : c->n);
    memset(acc, 0, (size_t)(s->ta * mt * tile) * sizeof(float));
    const int64_t bk = fp8 ? (c->blk < c->k ? c->blk : c->k) : c->k, nb = (c->k + bk - 1) / bk;
    if (s->ta == 1)
        group_small(c, s, fp8, bp, n0, bk, nb, abuf, cb, acc);
    else
        group_large(c, s, fp8, bp, n0, bk, nb, abuf, cb, acc);
    const float g = fp8 ? 1.0f : c->g;
    for (int64_t l = 0; l < rows && n0 + l < c->n; l++)
        for (int64_t i = 0; i < c->m; i++)
            qf_put(c, i, n0 + l, g * acc[((l / 16) * mt + i / 16) * tile + (l % 16) * mc + i % 16]);
    return 0;
}

AMX_TARGET static int run(const qf_call *c, int fp8) {
    const shape s = shape_of(c, fp8);
    const int64_t units = (c->n + 16 * s.ta - 1) / (16 * s.ta);
    const int threads = ql_threads(c->threads, units);
    uint16_t *bp = aligned_alloc(64, (size_t)(s.mt * s.steps * 32 * s.mc) * 2);
    if (!bp)
        return -1;
    pack_b(c, &s, fp8, bp);
    int failed = 0;
#pragma omp parallel num_threads(threads) reduction(| : failed)
    {
        int64_t lo, hi;
        ql_thread_share(units, &lo, &hi);
        uint16_t *abuf = aligned_alloc(64, (size_t)(s.ta * s.kc / 32 * 512) * 2);
        float *cb = aligned_alloc(64, (size_t)(4 * 256) * sizeof(float));
        float *acc = aligned_alloc(64, (size_t)(s.ta * s.mt * 16 * s.mc) * sizeof(float));
        if (abuf && cb && acc) {
            config_tiles(&s);
            for (int64_t u = lo; u < hi; u++)
                failed |= group(c, &s, fp8, bp, u * 16 * s.ta, abuf, cb, acc) != 0;
            _tile_release();
        } else {
            failed = 1;
        }
        free(abuf);
        free(cb);
        free(acc);
    }
    free(bp);
    return failed ? -1 : 0;
}

int qf_fp8_amx(const qf_call *c) { return run(c, 1); }
int qf_fp4_amx(const qf_call *c) { return run(c, 0); }
#else
int qf_amx_ready(void) { return 0; }
#endif
