/* npu-deploy: strided N-d copy kernel (optional; compiled at first use by _fastcopy.py).
 *
 * npd_copy(dst, src, nd, shape, dst_strides, src_strides, elsize, mode, tile_a, tile_b)
 * copies the box `shape` (rank <= 8, byte strides, may be negative) from src to dst, element by
 * element (elsize bytes, raw bits: 1/2/4/8/16/32 bytes typed, anything else by memcpy).
 *
 *   mode 0 ("rows"):  the last axis is the inner loop; a run contiguous on both sides is one memcpy.
 *   mode 1 ("tiles"): the last axis (a) is innermost in dst, the one before (b) innermost in src;
 *                     they are walked in tile_b x tile_a cache blocks (1-, 2- and 4-byte elements
 *                     with unit strides use SSE2 16x16 / 8x8, 8x8 and 4x4 transposes).
 *   mode | 4:         the same with streaming stores where they apply (tensors beyond the caches).
 * All other axes are looped over outermost (axis 0 slowest).  The caller (Python) checks that every
 * byte touched lies inside both buffers before calling.  Returns 0, or -1 on invalid arguments.
 *
 * npd_tile3(dst, src, nd, shape, dst_strides, src_strides, elsize, dir): small contiguous blocks
 * <-> long contiguous runs (FRACTAL_Z from NCHW and back); see its comment further down.
 *
 * npd_set_isa(level): -1 auto (AVX2 where the CPU reports it), 1 SSE2 only, 2 AVX2. The AVX2 code is
 * compiled per function (target attribute) and chosen at run time, so the file's flags stay baseline.
 *
 * npd_f32_to_f16(dst, src, n): float32 -> float16 as numpy casts (F16C; 1: not available here).
 */
#include <stdint.h>
#include <string.h>
#include <stdlib.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define NPD_MAXND 8
typedef int64_t i64;
typedef struct { uint64_t w[2]; } npd_u128;
typedef struct { uint64_t w[4]; } npd_u256;
typedef struct { uint64_t w[8]; } npd_u512;

#define NPD_DEF(NAME, T)                                                                          \
static void row_##NAME(char *d, const char *s, i64 n, i64 dstep, i64 sstep) {                    \
    for (i64 j = 0; j < n; j++) {                                                                \
        T v;                                                                                     \
        memcpy(&v, s + j * sstep, sizeof(T));                                                    \
        memcpy(d + j * dstep, &v, sizeof(T));                                                    \
    }                                                                                            \
}                                                                                                \
static void tile_##NAME(char *d, const char *s, i64 nb, i64 na, i64 db, i64 da, i64 sb, i64 sa) { \
    for (i64 i = 0; i < nb; i++) {                                                               \
        char *dr = d + i * db;                                                                   \
        const char *sr = s + i * sb;                                                             \
        for (i64 j = 0; j < na; j++) {                                                           \
            T v;                                                                                 \
            memcpy(&v, sr + j * sa, sizeof(T));                                                  \
            memcpy(dr + j * da, &v, sizeof(T));                                                  \
        }                                                                                        \
    }                                                                                            \
}

NPD_DEF(u8, uint8_t)
NPD_DEF(u16, uint16_t)
NPD_DEF(u32, uint32_t)
NPD_DEF(u64, uint64_t)
NPD_DEF(u128, npd_u128)
NPD_DEF(u256, npd_u256)
NPD_DEF(u512, npd_u512)

static void row_any(char *d, const char *s, i64 n, i64 dstep, i64 sstep, i64 es) {
    for (i64 j = 0; j < n; j++) memcpy(d + j * dstep, s + j * sstep, (size_t)es);
}

static void tile_any(char *d, const char *s, i64 nb, i64 na, i64 db, i64 da, i64 sb, i64 sa, i64 es) {
    for (i64 i = 0; i < nb; i++)
        for (i64 j = 0; j < na; j++) memcpy(d + i * db + j * da, s + i * sb + j * sa, (size_t)es);
}

static void row_copy(char *d, const char *s, i64 n, i64 dstep, i64 sstep, i64 es) {
    if (dstep == es && sstep == es) {
        memcpy(d, s, (size_t)(n * es));
        return;
    }
    switch (es) {
    case 1: row_u8(d, s, n, dstep, sstep); break;
    case 2: row_u16(d, s, n, dstep, sstep); break;
    case 4: row_u32(d, s, n, dstep, sstep); break;
    case 8: row_u64(d, s, n, dstep, sstep); break;
    case 16: row_u128(d, s, n, dstep, sstep); break;
    case 32: row_u256(d, s, n, dstep, sstep); break;
    case 64: row_u512(d, s, n, dstep, sstep); break;
    default: row_any(d, s, n, dstep, sstep, es); break;
    }
}

#if defined(__SSE2__)
/* dst column i (8 u16 at d + i*dstride) = element i of the 8 source rows (8 u16 at s + k*sstride) */
#define NPD_ST(p, v) (nt ? _mm_stream_si128((__m128i *)(p), (v)) : _mm_storeu_si128((__m128i *)(p), (v)))
static inline void tr8x8_u16_st(char *d, i64 dstride, const char *s, i64 sstride, int nt) {
    __m128i r0 = _mm_loadu_si128((const __m128i *)(s + 0 * sstride));
    __m128i r1 = _mm_loadu_si128((const __m128i *)(s + 1 * sstride));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(s + 2 * sstride));
    __m128i r3 = _mm_loadu_si128((const __m128i *)(s + 3 * sstride));
    __m128i r4 = _mm_loadu_si128((const __m128i *)(s + 4 * sstride));
    __m128i r5 = _mm_loadu_si128((const __m128i *)(s + 5 * sstride));
    __m128i r6 = _mm_loadu_si128((const __m128i *)(s + 6 * sstride));
    __m128i r7 = _mm_loadu_si128((const __m128i *)(s + 7 * sstride));
    __m128i t0 = _mm_unpacklo_epi16(r0, r1), t1 = _mm_unpackhi_epi16(r0, r1);
    __m128i t2 = _mm_unpacklo_epi16(r2, r3), t3 = _mm_unpackhi_epi16(r2, r3);
    __m128i t4 = _mm_unpacklo_epi16(r4, r5), t5 = _mm_unpackhi_epi16(r4, r5);
    __m128i t6 = _mm_unpacklo_epi16(r6, r7), t7 = _mm_unpackhi_epi16(r6, r7);
    __m128i u0 = _mm_unpacklo_epi32(t0, t2), u1 = _mm_unpackhi_epi32(t0, t2);
    __m128i u2 = _mm_unpacklo_epi32(t1, t3), u3 = _mm_unpackhi_epi32(t1, t3);
    __m128i u4 = _mm_unpacklo_epi32(t4, t6), u5 = _mm_unpackhi_epi32(t4, t6);
    __m128i u6 = _mm_unpacklo_epi32(t5, t7), u7 = _mm_unpackhi_epi32(t5, t7);
    NPD_ST(d + 0 * dstride, _mm_unpacklo_epi64(u0, u4));
    NPD_ST(d + 1 * dstride, _mm_unpackhi_epi64(u0, u4));
    NPD_ST(d + 2 * dstride, _mm_unpacklo_epi64(u1, u5));
    NPD_ST(d + 3 * dstride, _mm_unpackhi_epi64(u1, u5));
    NPD_ST(d + 4 * dstride, _mm_unpacklo_epi64(u2, u6));
    NPD_ST(d + 5 * dstride, _mm_unpackhi_epi64(u2, u6));
    NPD_ST(d + 6 * dstride, _mm_unpacklo_epi64(u3, u7));
    NPD_ST(d + 7 * dstride, _mm_unpackhi_epi64(u3, u7));
}
#endif

#if defined(__SSE2__)
static inline void tr8x8_u16(char *d, i64 dstride, const char *s, i64 sstride) {
    tr8x8_u16_st(d, dstride, s, sstride, 0);
}
static inline void tr8x8_u16_nt(char *d, i64 dstride, const char *s, i64 sstride) {
    tr8x8_u16_st(d, dstride, s, sstride, 1);
}

/* 16- and 32-byte elements with the destination contiguous, written with streaming stores */
static void tile_wide_nt(char *d, const char *s, i64 nb, i64 na, i64 db, i64 sb, i64 sa, i64 es) {
    for (i64 i = 0; i < nb; i++) {
        char *dr = d + i * db;
        const char *sr = s + i * sb;
        for (i64 j = 0; j < na; j++) {
            const char *q = sr + j * sa;
            for (i64 o = 0; o < es; o += 16)
                _mm_stream_si128((__m128i *)(dr + j * es + o), _mm_loadu_si128((const __m128i *)(q + o)));
        }
    }
}

/* the same for 16 x 16 bytes: dst row j (16 u8) = byte j of the 16 source rows */
static inline void tr16x16_u8_st(char *d, i64 dstride, const char *s, i64 sstride, int nt) {
    __m128i r[16], a[16], b[16], c[16];
    for (int k = 0; k < 16; k++) r[k] = _mm_loadu_si128((const __m128i *)(s + k * sstride));
    for (int k = 0; k < 8; k++) {          /* a[2k], a[2k+1]: rows 2k, 2k+1 byte-interleaved, j < 8 / j >= 8 */
        a[2 * k] = _mm_unpacklo_epi8(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm_unpackhi_epi8(r[2 * k], r[2 * k + 1]);
    }
    for (int g = 0; g < 4; g++) {          /* b[4g+q]: rows 4g..4g+3, columns 4q..4q+3 */
        b[4 * g + 0] = _mm_unpacklo_epi16(a[4 * g], a[4 * g + 2]);
        b[4 * g + 1] = _mm_unpackhi_epi16(a[4 * g], a[4 * g + 2]);
        b[4 * g + 2] = _mm_unpacklo_epi16(a[4 * g + 1], a[4 * g + 3]);
        b[4 * g + 3] = _mm_unpackhi_epi16(a[4 * g + 1], a[4 * g + 3]);
    }
    for (int h = 0; h < 2; h++)            /* c[8h+p]: rows 8h..8h+7, columns 2p, 2p+1 */
        for (int q = 0; q < 4; q++) {
            c[8 * h + 2 * q] = _mm_unpacklo_epi32(b[8 * h + q], b[8 * h + 4 + q]);
            c[8 * h + 2 * q + 1] = _mm_unpackhi_epi32(b[8 * h + q], b[8 * h + 4 + q]);
        }
    for (int p = 0; p < 8; p++) {
        NPD_ST(d + (2 * p) * dstride, _mm_unpacklo_epi64(c[p], c[8 + p]));
        NPD_ST(d + (2 * p + 1) * dstride, _mm_unpackhi_epi64(c[p], c[8 + p]));
    }
}
static inline void tr16x16_u8(char *d, i64 dstride, const char *s, i64 sstride) {
    tr16x16_u8_st(d, dstride, s, sstride, 0);
}
static inline void tr16x16_u8_nt(char *d, i64 dstride, const char *s, i64 sstride) {
    tr16x16_u8_st(d, dstride, s, sstride, 1);
}

/* 8 x 8 bytes (64-bit rows): dst row j (8 u8) = byte j of the 8 source rows */
static inline void tr8x8_u8(char *d, i64 dstride, const char *s, i64 sstride) {
    __m128i a0 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + 0 * sstride)),
                                   _mm_loadl_epi64((const __m128i *)(s + 1 * sstride)));
    __m128i a1 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + 2 * sstride)),
                                   _mm_loadl_epi64((const __m128i *)(s + 3 * sstride)));
    __m128i a2 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + 4 * sstride)),
                                   _mm_loadl_epi64((const __m128i *)(s + 5 * sstride)));
    __m128i a3 = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + 6 * sstride)),
                                   _mm_loadl_epi64((const __m128i *)(s + 7 * sstride)));
    __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);   /* rows 0-3 */
    __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);   /* rows 4-7 */
    __m128i c[4] = {_mm_unpacklo_epi32(b0, b2), _mm_unpackhi_epi32(b0, b2),
                    _mm_unpacklo_epi32(b1, b3), _mm_unpackhi_epi32(b1, b3)};     /* columns 2k, 2k+1 */
    for (int k = 0; k < 4; k++) {
        _mm_storel_epi64((__m128i *)(d + (2 * k) * dstride), c[k]);
        _mm_storel_epi64((__m128i *)(d + (2 * k + 1) * dstride), _mm_srli_si128(c[k], 8));
    }
}

/* 16 source rows of 8 bytes -> 8 destination rows of 16 bytes (dst row c = byte c of the 16 source
 * rows): for byte transposes whose destination rows are far apart (NC1HWC0 int8 unpack), 8 rows in
 * flight fit an 8-way L1 set where 16 would thrash it */
static inline void tr16x8_u8_st(char *d, i64 dstride, const char *s, i64 sstride, int nt) {
    __m128i a[8], b0[4], b1[4], e[4][2];
    for (int k = 0; k < 8; k++)
        a[k] = _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(s + (2 * k) * sstride)),
                                 _mm_loadl_epi64((const __m128i *)(s + (2 * k + 1) * sstride)));
    for (int k = 0; k < 4; k++) {          /* rows 4k..4k+3: b0 columns 0-3, b1 columns 4-7 */
        b0[k] = _mm_unpacklo_epi16(a[2 * k], a[2 * k + 1]);
        b1[k] = _mm_unpackhi_epi16(a[2 * k], a[2 * k + 1]);
    }
    for (int h = 0; h < 2; h++) {          /* rows 8h..8h+7: e[q] columns 2q, 2q+1 */
        e[0][h] = _mm_unpacklo_epi32(b0[2 * h], b0[2 * h + 1]);
        e[1][h] = _mm_unpackhi_epi32(b0[2 * h], b0[2 * h + 1]);
        e[2][h] = _mm_unpacklo_epi32(b1[2 * h], b1[2 * h + 1]);
        e[3][h] = _mm_unpackhi_epi32(b1[2 * h], b1[2 * h + 1]);
    }
    for (int q = 0; q < 4; q++) {
        NPD_ST(d + (2 * q) * dstride, _mm_unpacklo_epi64(e[q][0], e[q][1]));
        NPD_ST(d + (2 * q + 1) * dstride, _mm_unpackhi_epi64(e[q][0], e[q][1]));
    }
}

/* nb x na bytes (nb a multiple of 8, na of 16) through tr16x8 */
static void tile_u8_rows8(char *d, const char *s, i64 nb, i64 na, i64 db, i64 sa, int nt) {
    for (i64 i = 0; i < nb; i += 8)
        for (i64 j = 0; j < na; j += 16) tr16x8_u8_st(d + i * db + j, db, s + j * sa + i, sa, nt);
}

/* nb x na bytes (both multiples of 8) whose *source* rows are far apart (NC1HWC0 int8 pack: the C0
 * source rows are H*W bytes apart): 8 source rows at a time across a run of 256 destination rows,
 * so 8 source lines are in flight (one 8-way L1 set), not 16; the destination run (256 rows, a
 * few KiB) stays in L1 until each line is complete */
static void tile_u8_cols8(char *d, const char *s, i64 nb, i64 na, i64 db, i64 sa) {
    for (i64 i0 = 0; i0 < nb; i0 += 256) {
        i64 i1 = nb - i0 < 256 ? nb : i0 + 256;
        for (i64 j = 0; j < na; j += 8)
            for (i64 i = i0; i < i1; i += 8) tr8x8_u8(d + i * db + j, db, s + j * sa + i, sa);
    }
}

/* and for 4 x 4 u32 (fp32, int32) */
static inline void tr4x4_u32_st(char *d, i64 dstride, const char *s, i64 sstride, int nt) {
    __m128i r0 = _mm_loadu_si128((const __m128i *)(s + 0 * sstride));
    __m128i r1 = _mm_loadu_si128((const __m128i *)(s + 1 * sstride));
    __m128i r2 = _mm_loadu_si128((const __m128i *)(s + 2 * sstride));
    __m128i r3 = _mm_loadu_si128((const __m128i *)(s + 3 * sstride));
    __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);
    __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);
    NPD_ST(d + 0 * dstride, _mm_unpacklo_epi64(t0, t1));
    NPD_ST(d + 1 * dstride, _mm_unpackhi_epi64(t0, t1));
    NPD_ST(d + 2 * dstride, _mm_unpacklo_epi64(t2, t3));
    NPD_ST(d + 3 * dstride, _mm_unpackhi_epi64(t2, t3));
}
static inline void tr4x4_u32(char *d, i64 dstride, const char *s, i64 sstride) {
    tr4x4_u32_st(d, dstride, s, sstride, 0);
}
static inline void tr4x4_u32_nt(char *d, i64 dstride, const char *s, i64 sstride) {
    tr4x4_u32_st(d, dstride, s, sstride, 1);
}

/* nb x na elements in K x K register transposes; a ragged edge is covered by one more block
 * overlapping the previous one (rewriting a few elements with the same values: src and dst never
 * overlap). Needs nb >= K and na >= K. */
#define NPD_BLOCKED(K, TR)                                                                         \
    for (i64 i = 0;; i += K) {                                                                     \
        if (i > nb - K) i = nb - K;                                                                \
        for (i64 j = 0;; j += K) {                                                                 \
            if (j > na - K) j = na - K;                                                            \
            TR(d + i * db + j * es, db, s + j * sa + i * es, sa);                                  \
            if (j + K >= na) break;                                                                \
        }                                                                                          \
        if (i + K >= nb) break;                                                                    \
    }
/* the same with the ragged edges copied element by element instead (for small blocks, where an
 * overlapping block would redo most of the work: FRACTAL_Z's H*W = 9) */
#define NPD_BLOCKED_REM(K, TR, T)                                                                  \
    do {                                                                                           \
        i64 nbk = nb - nb % K, nak = na - na % K;                                                  \
        for (i64 i = 0; i < nbk; i += K) {                                                         \
            for (i64 j = 0; j < nak; j += K) TR(d + i * db + j * es, db, s + j * sa + i * es, sa); \
            for (i64 j = nak; j < na; j++)                                                         \
                for (i64 k = 0; k < K; k++) {                                                      \
                    T v;                                                                           \
                    memcpy(&v, s + j * sa + (i + k) * es, sizeof(T));                              \
                    memcpy(d + (i + k) * db + j * es, &v, sizeof(T));                              \
                }                                                                                  \
        }                                                                                          \
        for (i64 i = nbk; i < nb; i++)                                                             \
            for (i64 j = 0; j < na; j++) {                                                         \
                T v;                                                                               \
                memcpy(&v, s + j * sa + i * es, sizeof(T));                                        \
                memcpy(d + i * db + j * es, &v, sizeof(T));                                        \
            }                                                                                      \
    } while (0)
#endif

/* ---------------------------------------------------------------------------------------------
 * AVX2 block transposes for npd_tile3, with runtime dispatch: compiled with a per-function target
 * attribute (the rest of the file, and its flags, stay baseline x86-64 / SSE2) and used only when
 * the CPU reports AVX2 (npd_set_isa: -1 auto, 1 SSE2 only, 2 AVX2 where available).
 *
 * Why: measured on FRACTAL_Z fp16 [1024, 896, 3, 3] (16 MiB, Intel Xeon, 2 cores), the access
 * pattern alone (the same 288-byte block reads and 32-byte run writes, moved without transposing)
 * runs at ~0.75 of a copy, the SSE2 kernel at ~0.5: the in-cache transpose rate (~17 GB/s) adds to
 * the memory time instead of hiding under it. These versions halve the shuffles per block.
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define NPD_AVX2 1
#include <immintrin.h>
static int npd_isa = -1;                   /* -1: not decided yet; 1: SSE2; 2: AVX2 */

static int npd_avx2_ok(void) {
    if (npd_isa < 0) {
        __builtin_cpu_init();
        npd_isa = __builtin_cpu_supports("avx2") ? 2 : 1;
    }
    return npd_isa == 2;
}

/* level -1: the best the CPU supports; 1: SSE2 only; 2: AVX2 (when the CPU has it). Returns the
 * level in use (1 or 2). */
int npd_set_isa(int level) {
    __builtin_cpu_init();
    int have = __builtin_cpu_supports("avx2") ? 2 : 1;
    npd_isa = level < 0 ? have : (level >= 2 ? have : 1);
    return npd_isa;
}

#define NPD_LOADU2(hi, lo) \
    _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(lo))), \
                            _mm_loadu_si128((const __m128i *)(hi)), 1)

/* in-lane 8x8 transpose of 16-bit elements on 8 registers (each lane transposed independently) */
#define NPD_TR8X8_EPI16_256(r, o)                                                                \
    do {                                                                                         \
        __m256i t0 = _mm256_unpacklo_epi16(r[0], r[1]), t1 = _mm256_unpackhi_epi16(r[0], r[1]);  \
        __m256i t2 = _mm256_unpacklo_epi16(r[2], r[3]), t3 = _mm256_unpackhi_epi16(r[2], r[3]);  \
        __m256i t4 = _mm256_unpacklo_epi16(r[4], r[5]), t5 = _mm256_unpackhi_epi16(r[4], r[5]);  \
        __m256i t6 = _mm256_unpacklo_epi16(r[6], r[7]), t7 = _mm256_unpackhi_epi16(r[6], r[7]);  \
        __m256i u0 = _mm256_unpacklo_epi32(t0, t2), u1 = _mm256_unpackhi_epi32(t0, t2);          \
        __m256i u2 = _mm256_unpacklo_epi32(t1, t3), u3 = _mm256_unpackhi_epi32(t1, t3);          \
        __m256i u4 = _mm256_unpacklo_epi32(t4, t6), u5 = _mm256_unpackhi_epi32(t4, t6);          \
        __m256i u6 = _mm256_unpacklo_epi32(t5, t7), u7 = _mm256_unpackhi_epi32(t5, t7);          \
        o[0] = _mm256_unpacklo_epi64(u0, u4); o[1] = _mm256_unpackhi_epi64(u0, u4);              \
        o[2] = _mm256_unpacklo_epi64(u1, u5); o[3] = _mm256_unpackhi_epi64(u1, u5);              \
        o[4] = _mm256_unpacklo_epi64(u2, u6); o[5] = _mm256_unpackhi_epi64(u2, u6);              \
        o[6] = _mm256_unpacklo_epi64(u3, u7); o[7] = _mm256_unpackhi_epi64(u3, u7);              \
    } while (0)

/* pack: a 16 x B block of halves (row k at s + k*2B) -> B runs of 16 halves (run i at d + i*dstride).
 * Columns in groups of 8: rows k and k+8 share a register (one lane each), so one in-lane 8x8
 * transpose yields 8 whole 32-byte runs. B = 9 (3x3 kernels): column 8 of row j is at byte 18j+16,
 * exactly one per 16-byte window of [16, 288) and at the lane position its run wants, so it is
 * assembled with 16 loads and 7 blends, no shuffles. Other ragged widths: one more group
 * overlapping the previous one (same values rewritten). Needs B >= 8. */
__attribute__((target("avx2")))
static void t3_pack16_avx2(char *d, i64 dstride, const char *s, i64 B) {
    i64 rs = 2 * B, i = 0;
    __m256i r[8], o[8];
    for (;;) {
        for (int k = 0; k < 8; k++) r[k] = NPD_LOADU2(s + (k + 8) * rs + 2 * i, s + k * rs + 2 * i);
        NPD_TR8X8_EPI16_256(r, o);
        for (int c = 0; c < 8; c++) _mm256_storeu_si256((__m256i *)(d + (i + c) * dstride), o[c]);
        i += 8;
        if (i >= B) return;
        if (B == 9) break;
        if (i > B - 8) i = B - 8;
    }
    __m256i acc = NPD_LOADU2(s + 160, s + 16);                       /* j = 0 | j = 8 at halves 0 */
    acc = _mm256_blend_epi16(acc, NPD_LOADU2(s + 176, s + 32), 1 << 1);
    acc = _mm256_blend_epi16(acc, NPD_LOADU2(s + 192, s + 48), 1 << 2);
    acc = _mm256_blend_epi16(acc, NPD_LOADU2(s + 208, s + 64), 1 << 3);
    acc = _mm256_blend_epi16(acc, NPD_LOADU2(s + 224, s + 80), 1 << 4);
    acc = _mm256_blend_epi16(acc, NPD_LOADU2(s + 240, s + 96), 1 << 5);
    acc = _mm256_blend_epi16(acc, NPD_LOADU2(s + 256, s + 112), 1 << 6);
    acc = _mm256_blend_epi16(acc, NPD_LOADU2(s + 272, s + 128), 1 << 7);
    _mm256_storeu_si256((__m256i *)(d + 8 * dstride), acc);
}

/* unpack: B runs of 16 halves (run i at s + i*sstride) -> a 16 x B block (row k at d + k*2B). The
 * same in-lane transposes, each lane stored as 16 bytes of a block row. B = 9: run 8's halves go
 * to bytes 18j+16, one per 16-byte window of [16, 288) at that window's lane position: the run's
 * lanes are stored whole into those windows first, then the rows' first 8 halves overwrite the
 * rest of every window. Other ragged widths: an overlapping group. Needs B >= 8. */
__attribute__((target("avx2")))
static void t3_unpack16_avx2(char *d, const char *s, i64 sstride, i64 B) {
    i64 rs = 2 * B, i = 0;
    __m256i r[8], o[8];
    if (B == 9) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(s + 8 * sstride));
        __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
        for (int w = 0; w < 8; w++) {
            _mm_storeu_si128((__m128i *)(d + 16 + 16 * w), lo);
            _mm_storeu_si128((__m128i *)(d + 160 + 16 * w), hi);
        }
    }
    for (;;) {
        for (int c = 0; c < 8; c++) r[c] = _mm256_loadu_si256((const __m256i *)(s + (i + c) * sstride));
        NPD_TR8X8_EPI16_256(r, o);
        for (int k = 0; k < 8; k++) {
            _mm_storeu_si128((__m128i *)(d + k * rs + 2 * i), _mm256_castsi256_si128(o[k]));
            _mm_storeu_si128((__m128i *)(d + (k + 8) * rs + 2 * i), _mm256_extracti128_si256(o[k], 1));
        }
        i += 8;
        if (i >= B || B == 9) return;
        if (i > B - 8) i = B - 8;
    }
}

/* int8 (C0 = 32): a 32 x B block of bytes (row k at s + k*B) -> B runs of 32 bytes. Rows k and k+16
 * share a register (16-byte loads: only the low 8 bytes are used; row 31 is loaded ending at the
 * block's last byte and shifted, so nothing past the block is read), then the 16 x 8 byte transpose
 * of tr16x8_u8 on both lanes at once gives 8 whole runs. B = 9: column 8 of row j is at byte 9j+8,
 * which a 16-byte load at 8j+8 (rows 0-15) or 8j+152 (rows 16-31) puts at lane byte j: 16 loads and
 * 15 byte blends. Needs B >= 8. */
static const unsigned char npd_u8_lane_mask[16][32] __attribute__((aligned(32))) = {
#define NPD_M(j) {[j] = 0xff, [16 + j] = 0xff}
    NPD_M(0), NPD_M(1), NPD_M(2), NPD_M(3), NPD_M(4), NPD_M(5), NPD_M(6), NPD_M(7),
    NPD_M(8), NPD_M(9), NPD_M(10), NPD_M(11), NPD_M(12), NPD_M(13), NPD_M(14), NPD_M(15)
#undef NPD_M
};

/* the 16 x 8 byte transpose of tr16x8_u8 on both lanes: p[k] holds 8 bytes of rows k (lane 0) and k+16
 * (lane 1); run[j] = byte j of the 32 rows (8 whole 32-byte runs) */
__attribute__((target("avx2")))
static inline void tr32x8_u8_avx2(const __m256i p[16], __m256i run[8]) {
    __m256i a[8], b0[4], b1[4], e[4][2];
    for (int k = 0; k < 8; k++) a[k] = _mm256_unpacklo_epi8(p[2 * k], p[2 * k + 1]);
    for (int k = 0; k < 4; k++) {
        b0[k] = _mm256_unpacklo_epi16(a[2 * k], a[2 * k + 1]);
        b1[k] = _mm256_unpackhi_epi16(a[2 * k], a[2 * k + 1]);
    }
    for (int h = 0; h < 2; h++) {
        e[0][h] = _mm256_unpacklo_epi32(b0[2 * h], b0[2 * h + 1]);
        e[1][h] = _mm256_unpackhi_epi32(b0[2 * h], b0[2 * h + 1]);
        e[2][h] = _mm256_unpacklo_epi32(b1[2 * h], b1[2 * h + 1]);
        e[3][h] = _mm256_unpackhi_epi32(b1[2 * h], b1[2 * h + 1]);
    }
    for (int c = 0; c < 4; c++) {
        run[2 * c] = _mm256_unpacklo_epi64(e[c][0], e[c][1]);
        run[2 * c + 1] = _mm256_unpackhi_epi64(e[c][0], e[c][1]);
    }
}

__attribute__((target("avx2")))
static void t3_pack8_avx2(char *d, i64 dstride, const char *s, i64 B) {
    i64 i = 0;
    __m256i p[16], run[8];
    for (;;) {
        const char *q = s + i;
        for (int k = 0; k < 15; k++) p[k] = NPD_LOADU2(q + (k + 16) * B, q + k * B);
        {
            /* row 31 (hi) ends 8 - ... bytes before the block end: load the 16 bytes ending at the
             * row's 8th byte and shift them down */
            __m128i hi = _mm_srli_si128(_mm_loadu_si128((const __m128i *)(q + 31 * B - 8)), 8);
            p[15] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(q + 15 * B))),
                                            hi, 1);
        }
        tr32x8_u8_avx2(p, run);
        for (int j = 0; j < 8; j++) _mm256_storeu_si256((__m256i *)(d + (i + j) * dstride), run[j]);
        i += 8;
        if (i >= B) return;
        if (B == 9) break;
        if (i > B - 8) i = B - 8;
    }
    __m256i acc = NPD_LOADU2(s + 152, s + 8);
    for (int j = 1; j < 16; j++)
        acc = _mm256_blendv_epi8(acc, NPD_LOADU2(s + 8 * j + 152, s + 8 * j + 8),
                                 _mm256_load_si256((const __m256i *)npd_u8_lane_mask[j]));
    _mm256_storeu_si256((__m256i *)(d + 8 * dstride), acc);
}

/* the same 32 x w transpose from rows at any stride ss (w a multiple of 8): w runs of 32 bytes, written
 * contiguously at d: nt 0 ordinary stores, 1 streaming stores (d 32-byte aligned), 2 streaming stores
 * of 16-byte halves (d 16-byte aligned: numpy's large buffers start 16 bytes into a page) */
__attribute__((target("avx2")))
static void pack8_rows_avx2(char *d, const char *s, i64 ss, i64 w, int nt) {
    __m256i p[16], run[8];
    for (i64 i = 0; i < w; i += 8) {
        const char *q = s + i;
        for (int k = 0; k < 16; k++) p[k] = NPD_LOADU2(q + (k + 16) * ss, q + k * ss);
        tr32x8_u8_avx2(p, run);
        char *o = d + i * 32;
        for (int j = 0; j < 8; j++) {
            if (nt == 2) {                     /* d 16-byte aligned only: halves */
                _mm_stream_si128((__m128i *)(o + 32 * j), _mm256_castsi256_si128(run[j]));
                _mm_stream_si128((__m128i *)(o + 32 * j + 16), _mm256_extracti128_si256(run[j], 1));
            } else if (nt) {
                _mm256_stream_si256((__m256i *)(o + 32 * j), run[j]);
            } else {
                _mm256_storeu_si256((__m256i *)(o + 32 * j), run[j]);
            }
        }
    }
}

/* 8 source rows of 32 bytes (row c at s + c*sstride) -> 32 destination rows of 8 bytes (row k at
 * d + k*dstride, byte c = byte k of source row c): in-lane 8 x 16 -> 16 x 8 byte transposes, two
 * destination rows per lane of each result */
__attribute__((target("avx2")))
static inline void tr8x32_u8_avx2(char *d, i64 dstride, const char *s, i64 sstride) {
    __m256i y[8], a[8], b[8], c[8];
    for (int k = 0; k < 8; k++) y[k] = _mm256_loadu_si256((const __m256i *)(s + k * sstride));
    for (int k = 0; k < 4; k++) {          /* a[2k]: rows 0-7 of columns 2k, 2k+1; a[2k+1]: rows 8-15 */
        a[2 * k] = _mm256_unpacklo_epi8(y[2 * k], y[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_epi8(y[2 * k], y[2 * k + 1]);
    }
    for (int h = 0; h < 2; h++) {          /* b[4h+q]: columns 4h..4h+3, rows 4q..4q+3 */
        b[4 * h + 0] = _mm256_unpacklo_epi16(a[4 * h + 0], a[4 * h + 2]);
        b[4 * h + 1] = _mm256_unpackhi_epi16(a[4 * h + 0], a[4 * h + 2]);
        b[4 * h + 2] = _mm256_unpacklo_epi16(a[4 * h + 1], a[4 * h + 3]);
        b[4 * h + 3] = _mm256_unpackhi_epi16(a[4 * h + 1], a[4 * h + 3]);
    }
    for (int q = 0; q < 4; q++) {          /* c[2q], c[2q+1]: rows 4q..4q+1, 4q+2..4q+3, 8 columns */
        c[2 * q] = _mm256_unpacklo_epi32(b[q], b[4 + q]);
        c[2 * q + 1] = _mm256_unpackhi_epi32(b[q], b[4 + q]);
    }
    for (int m = 0; m < 8; m++) {          /* c[m]: rows 2m, 2m+1 (lane 0) and 16+2m, 17+2m (lane 1) */
        __m128i lo = _mm256_castsi256_si128(c[m]), hi = _mm256_extracti128_si256(c[m], 1);
        char *o = d + 2 * m * dstride;
        _mm_storel_epi64((__m128i *)o, lo);
        _mm_storeh_pd((double *)(o + dstride), _mm_castsi128_pd(lo));
        _mm_storel_epi64((__m128i *)(o + 16 * dstride), hi);
        _mm_storeh_pd((double *)(o + 17 * dstride), _mm_castsi128_pd(hi));
    }
}

/* int8 unpack: B runs of 32 bytes (run i at s + i*sstride) -> a 32 x B block (row k at d + k*B),
 * 8 runs at a time through tr8x32_u8_avx2; B = 9: column 8 byte by byte. Needs B >= 8. */
__attribute__((target("avx2")))
static void t3_unpack8_avx2(char *d, const char *s, i64 sstride, i64 B) {
    i64 i = 0;
    for (;;) {
        tr8x32_u8_avx2(d + i, B, s + i * sstride, sstride);
        i += 8;
        if (i >= B) return;
        if (B == 9) break;
        if (i > B - 8) i = B - 8;
    }
    unsigned char t[32];
    memcpy(t, s + 8 * sstride, 32);
    for (int k = 0; k < 32; k++) d[k * 9 + 8] = (char)t[k];
}

/* tile_u8_cols8 through AVX2 (nb a multiple of 32, na of 8; NC1HWC0 int8 pack): 8 source rows
 * (one L1 set's worth of lines in flight, as there) of 32 bytes per transpose instead of 8 */
__attribute__((target("avx2")))
static void tile_u8_cols8_avx2(char *d, const char *s, i64 nb, i64 na, i64 db, i64 sa) {
    for (i64 i0 = 0; i0 < nb; i0 += 256) {
        i64 i1 = nb - i0 < 256 ? nb : i0 + 256;
        for (i64 j = 0; j < na; j += 8)
            for (i64 i = i0; i < i1; i += 32) tr8x32_u8_avx2(d + i * db + j, db, s + j * sa + i, sa);
    }
}

/* one npd_tile3 block through AVX2 when it applies (2-byte elements with A = 16 or bytes with
 * A = 32, B >= 8, ordinary stores); 0 when the caller must use the SSE2 path */
static inline int t3_block_avx2(char *d, const char *s, i64 A, i64 B, i64 es, i64 bstride, int dir, int nt) {
    if (nt || B < 8 || !((es == 2 && A == 16) || (es == 1 && A == 32)) || !npd_avx2_ok()) return 0;
    if (es == 2) {
        if (dir == 0) t3_pack16_avx2(d, bstride, s, B);
        else t3_unpack16_avx2(d, s, bstride, B);
    } else {
        if (dir == 0) t3_pack8_avx2(d, bstride, s, B);
        else t3_unpack8_avx2(d, s, bstride, B);
    }
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * npd_f32_to_f16(dst, src, n): n float32 -> float16, bit for bit what numpy's astype gives: F16C's
 * conversion rounds to nearest even (imm 0, whatever MXCSR says), overflows to infinity, writes
 * subnormals; only a NaN differs (F16C sets the quiet bit of a signalling NaN), so a vector holding
 * one redoes its NaN lanes the numpy way: sign, exponent all ones, the top 10 payload bits, and a
 * payload of 1 where those are all zero (a NaN must stay a NaN). Returns 1, doing nothing, where the
 * CPU has no F16C or AVX2 (npd_set_isa(1) included): the caller casts with numpy then. The weight
 * casts of convert ran at 1.5-1.8 GB/s in numpy (0.6 s of CPU for a 912 MiB float32 model).
 */
static int npd_f16c = -1;

static int npd_f16c_ok(void) {
    if (npd_f16c < 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        __asm__ volatile("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(1), "c"(0));
        npd_f16c = (c >> 29) & 1;                /* CPUID.1:ECX.F16C; AVX state: npd_avx2_ok */
    }
    return npd_f16c && npd_avx2_ok();
}

static uint16_t npd_nan_half(uint32_t f) {
    uint16_t sig = (uint16_t)((f & 0x007fffffu) >> 13);
    return (uint16_t)(((f >> 16) & 0x8000u) | 0x7c00u | (sig ? sig : 1u));
}

__attribute__((target("avx2,f16c")))
static void npd_f16_run(uint16_t *d, const float *s, i64 n) {
    i64 i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(s + i);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(v, 0));
        int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        for (int k = 0; nan; k++, nan >>= 1)
            if (nan & 1) {
                uint32_t f;
                memcpy(&f, s + i + k, 4);
                d[i + k] = npd_nan_half(f);
            }
    }
    if (i < n) {                                 /* the last 1-7: through a zero-padded vector */
        float t[8] = {0};
        uint16_t h[8];
        memcpy(t, s + i, (size_t)(n - i) * 4);
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(_mm256_loadu_ps(t), 0));
        for (i64 k = 0; k < n - i; k++) {
            uint32_t f;
            memcpy(&f, t + k, 4);
            d[i + k] = ((f & 0x7f800000u) == 0x7f800000u && (f & 0x007fffffu)) ? npd_nan_half(f) : h[k];
        }
    }
}

int npd_f32_to_f16(uint16_t *dst, const float *src, i64 n) {
    if (n < 0) return -1;
    if (!npd_f16c_ok()) return 1;
    npd_f16_run(dst, src, n);
    return 0;
}
#else
int npd_set_isa(int level) {
    (void)level;
    return 1;
}
int npd_f32_to_f16(uint16_t *dst, const float *src, i64 n) {
    (void)dst; (void)src; (void)n;
    return 1;
}
static inline int t3_block_avx2(char *d, const char *s, i64 A, i64 B, i64 es, i64 bstride, int dir, int nt) {
    (void)d; (void)s; (void)A; (void)B; (void)es; (void)bstride; (void)dir; (void)nt;
    return 0;
}
#endif

/* one nb x na block: d[i*db + j*da] = s[i*sb + j*sa] */
static void tile_copy(char *d, const char *s, i64 nb, i64 na, i64 db, i64 da, i64 sb, i64 sa, i64 es);

/* fewer than 64 bytes, inline (a library memcpy call per piece edge cost more than the pieces'
 * streaming stores: FRACTAL_Z fp16 pack at 256 MiB 0.47 of a copy, inline 0.65) */
static inline void npd_small_copy(char *d, const char *s, i64 n) {
#if defined(__SSE2__)
    for (; n >= 16; n -= 16, d += 16, s += 16) _mm_storeu_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
#endif
    for (; n >= 4; n -= 4, d += 4, s += 4) {
        uint32_t v;
        memcpy(&v, s, 4);
        memcpy(d, &v, 4);
    }
    for (; n > 0; n--) *d++ = *s++;
}

#if defined(__SSE2__)
/* n bytes (a multiple of 16) from s to d (16-byte aligned) by streaming stores */
static inline void npd_stream(char *d, const char *s, i64 n) {
    if (((uintptr_t)s & 15) == 0)
        for (i64 o = 0; o < n; o += 16) _mm_stream_si128((__m128i *)(d + o), _mm_load_si128((const __m128i *)(s + o)));
    else
        for (i64 o = 0; o < n; o += 16) _mm_stream_si128((__m128i *)(d + o), _mm_loadu_si128((const __m128i *)(s + o)));
}
#endif

/* n contiguous bytes from s to d: the whole 64-byte lines by streaming stores, the partial lines at
 * either end by ordinary ones */
static inline void npd_stream_run(char *d, const char *s, i64 n) {
#if defined(__SSE2__)
    i64 head = (i64)((64 - ((uintptr_t)d & 63)) & 63);
    if (head > n) head = n;
    npd_small_copy(d, s, head);
    d += head; s += head; n -= head;
    i64 body = n & ~(i64)63;
    npd_stream(d, s, body);
    npd_small_copy(d + body, s + body, n - body);
#else
    memcpy(d, s, (size_t)n);
#endif
}

/* a tile buffer at least 512 bytes (mod 4096) past the destination: loads from it must not share
 * the low 12 address bits of the streaming stores just issued (4K aliasing) */
static inline char *npd_unaliased(char *mem, const char *d) {
    uintptr_t want = ((uintptr_t)d + 512) & 4032;
    return mem + ((want - ((uintptr_t)mem & 4095)) & 4095);
}

#define NPD_TSTAGE 131072
#define NPD_ROWCHUNK 2048     /* bytes of each source row staged at a time (1024-4096 within 10 %) */

/* nt: write the destination with streaming (non-temporal) stores where the stores are 16-byte
 * aligned and cover whole lines in quick succession (tensors far larger than the caches: no read
 * for ownership, no eviction of the source) */
static void tile_copy_nt(char *d, const char *s, i64 nb, i64 na, i64 db, i64 da, i64 sb, i64 sa, i64 es,
                         int nt) {
#if defined(__SSE2__)
    if (nt && (es == 16 || es == 32 || es == 64) && da == es && (((uintptr_t)d | (uintptr_t)db) & 15) == 0) {
        tile_wide_nt(d, s, nb, na, db, sb, sa, es);
        return;
    }
    if (nt && es == 2 && da == 2 && sb == 2 && nb >= 8 && na >= 8 && (na & 7) == 0 && (nb & 7) == 0
        && (((uintptr_t)d | (uintptr_t)db) & 15) == 0) {
        for (i64 i = 0; i < nb; i += 8)
            for (i64 j = 0; j < na; j += 8) tr8x8_u16_nt(d + i * db + j * 2, db, s + j * sa + i * 2, sa);
        return;
    }
    if (nt && es == 1 && da == 1 && sb == 1 && db > 64 && (nb & 7) == 0 && (na & 15) == 0 && nb && na
        && (((uintptr_t)d | (uintptr_t)db) & 15) == 0) {
        tile_u8_rows8(d, s, nb, na, db, sa, 1);
        return;
    }
    /* bytes: only when the block's rows are close (pack: 16 rows within 1 KiB), so each line is
     * completed at once; 16 distant rows (unpack) would leave 16 half-written lines in flight */
    if (nt && es == 1 && da == 1 && sb == 1 && (nb & 15) == 0 && (na & 15) == 0 && nb && na && db <= 64
        && sa <= 64 && (((uintptr_t)d | (uintptr_t)db) & 15) == 0) {
        for (i64 i = 0; i < nb; i += 16)
            for (i64 j = 0; j < na; j += 16) tr16x16_u8_nt(d + i * db + j, db, s + j * sa + i, sa);
        return;
    }
    if (nt && es == 4 && da == 4 && sb == 4 && (nb & 3) == 0 && (na & 3) == 0 && nb && na
        && (((uintptr_t)d | (uintptr_t)db) & 15) == 0) {
        for (i64 i = 0; i < nb; i += 4)
            for (i64 j = 0; j < na; j += 4) tr4x4_u32_nt(d + i * db + j * 4, db, s + j * sa + i * 4, sa);
        return;
    }
    if (nt && es == 2 && da == 2 && sb == 2 && nb > 8 && (nb & 7) != 0 && na >= 8 && (na & 7) == 0
        && (((uintptr_t)d | (uintptr_t)db) & 15) == 0) {
        /* FRACTAL_Z pack (nb = H*W = 9 rows of C0 halves): the 8x8 blocks, then each remaining row
         * gathered 8 elements at a time, all streamed */
        i64 nb8 = nb & ~(i64)7;
        for (i64 i = 0; i < nb8; i += 8)
            for (i64 j = 0; j < na; j += 8) tr8x8_u16_nt(d + i * db + j * 2, db, s + j * sa + i * 2, sa);
        for (i64 i = nb8; i < nb; i++)
            for (i64 j = 0; j < na; j += 8) {
                const char *q = s + j * sa + i * 2;
                uint16_t e[8];
                for (int k = 0; k < 8; k++) memcpy(&e[k], q + k * sa, 2);
                _mm_stream_si128((__m128i *)(d + i * db + j * 2),
                                 _mm_setr_epi16((short)e[0], (short)e[1], (short)e[2], (short)e[3], (short)e[4],
                                                (short)e[5], (short)e[6], (short)e[7]));
            }
        return;
    }
    if (nt && da == es && db == na * es && nb * db <= NPD_TSTAGE && nb * db >= 4096) {
        /* the destination tile is one contiguous run (NC1HWC0 int8 pack: H*W x C0 bytes) but the
         * transposes above cannot stream it (8-byte stores, or rows of the source far apart):
         * transpose into a buffer in L2, then stream the run out in whole lines. At 256 MiB on the
         * benchmark host NC1HWC0 int8 pack went from 0.42 of a copy (ordinary stores) to 0.61. */
        static __thread char tst[NPD_TSTAGE + 4096] __attribute__((aligned(64)));
        char *st = npd_unaliased(tst, d);
        if (es == 1 && sb == 1 && sa > 64 && db <= 64 && na <= 32 && (nb & 31) == 0 && (na & 7) == 0) {
            /* the source rows are far apart (NC1HWC0 int8 pack: 32 channel planes, H*W bytes each):
             * read each row's piece of the tile through in one burst into a row buffer whose row
             * stride is not a multiple of 4096 (the planes' own strides put all 32 rows in one L1
             * set, and 8 ways cannot hold them), then transpose from there. AMD EPYC Zen 4, C harness,
             * [8, 64, 128, 256]: 16 MiB 0.48 -> 0.76 of a copy, 256 MiB 0.49 -> 0.60 */
            static __thread char trb[32 * (NPD_ROWCHUNK + 64)] __attribute__((aligned(64)));
            const i64 rbs = NPD_ROWCHUNK + 64;
            int whole = 0, direct = 0;
#if defined(NPD_AVX2)
            whole = na == 32 && npd_avx2_ok();       /* 32 rows -> whole 32-byte runs */
            direct = !whole ? 0 : ((uintptr_t)d & 31) == 0 ? 1 : ((uintptr_t)d & 15) == 0 ? 2 : 0;
#endif
            for (i64 c0 = 0; c0 < nb; c0 += NPD_ROWCHUNK) {
                i64 w = nb - c0 < NPD_ROWCHUNK ? nb - c0 : NPD_ROWCHUNK;
                for (i64 k = 0; k < na; k++) memcpy(trb + k * rbs, s + k * sa + c0, (size_t)w);
#if defined(NPD_AVX2)
                if (whole) {
                    /* streamed from the registers when d is 16-byte aligned, else through the
                     * tile buffer */
                    pack8_rows_avx2(direct ? d + c0 * 32 : st + c0 * 32, trb, rbs, w, direct);
                    continue;
                }
#endif
                tile_copy(st + c0 * db, trb, w, na, db, da, 1, rbs, 1);
            }
            if (direct) return;
        } else {
            tile_copy(st, s, nb, na, db, da, sb, sa, es);
        }
        npd_stream_run(d, st, nb * db);
        return;
    }
#else
    (void)nt;
#endif
    tile_copy(d, s, nb, na, db, da, sb, sa, es);
}

static void tile_copy(char *d, const char *s, i64 nb, i64 na, i64 db, i64 da, i64 sb, i64 sa, i64 es) {
#if defined(__SSE2__)
    if (es == 1 && da == 1 && sb == 1 && db > 64 && (nb & 7) == 0 && (na & 15) == 0 && nb && na) {
        tile_u8_rows8(d, s, nb, na, db, sa, 0);
        return;
    }
    if (es == 1 && da == 1 && sb == 1 && sa > 64 && db <= 64 && (nb & 7) == 0 && (na & 7) == 0 && nb && na) {
#if defined(NPD_AVX2)
        if ((nb & 31) == 0 && npd_avx2_ok()) {
            tile_u8_cols8_avx2(d, s, nb, na, db, sa);
            return;
        }
#endif
        tile_u8_cols8(d, s, nb, na, db, sa);
        return;
    }
    if (es == 1 && da == 1 && sb == 1 && nb >= 16 && na >= 16) {
        NPD_BLOCKED(16, tr16x16_u8)
        return;
    }
    if (es == 1 && da == 1 && sb == 1 && nb >= 8 && na >= 8) {
        NPD_BLOCKED_REM(8, tr8x8_u8, uint8_t);
        return;
    }
    if (es == 4 && da == 4 && sb == 4 && nb >= 4 && na >= 4) {
        NPD_BLOCKED(4, tr4x4_u32)
        return;
    }
    if (es == 2 && da == 2 && sb == 2 && nb >= 8 && na >= 8) {
        i64 nb8 = nb & ~(i64)7;
        if (nb8 < nb && (na & 7) == 0) {
            /* ragged nb only (FRACTAL_Z pack: nb = H*W = 9): 8x8 blocks, then each remaining
             * destination row gathered 8 elements at a time (measured faster than an overlap) */
            for (i64 i = 0; i < nb8; i += 8)
                for (i64 j = 0; j < na; j += 8) tr8x8_u16(d + i * db + j * 2, db, s + j * sa + i * 2, sa);
            for (i64 i = nb8; i < nb; i++)
                for (i64 j = 0; j < na; j += 8) {
                    const char *q = s + j * sa + i * 2;
                    uint16_t e[8];
                    for (int k = 0; k < 8; k++) memcpy(&e[k], q + k * sa, 2);
                    __m128i v = _mm_cvtsi32_si128(e[0]);
                    v = _mm_insert_epi16(v, e[1], 1);
                    v = _mm_insert_epi16(v, e[2], 2);
                    v = _mm_insert_epi16(v, e[3], 3);
                    v = _mm_insert_epi16(v, e[4], 4);
                    v = _mm_insert_epi16(v, e[5], 5);
                    v = _mm_insert_epi16(v, e[6], 6);
                    v = _mm_insert_epi16(v, e[7], 7);
                    _mm_storeu_si128((__m128i *)(d + i * db + j * 2), v);
                }
            return;
        }
        if ((nb & 7) == 0 && (na & 7) != 0 && na < 32) {
            /* ragged na only, small (FRACTAL_Z unpack: na = H*W = 9): 8x8 blocks, then the last
             * columns element by element (an overlapping block would redo 7/8 of a block) */
            NPD_BLOCKED_REM(8, tr8x8_u16, uint16_t);
            return;
        }
        /* 8x8 blocks; a ragged edge is covered by one more block overlapping the previous one
         * (rewriting a few elements with the same values: src and dst never overlap) */
        for (i64 i = 0;; i += 8) {
            if (i > nb - 8) i = nb - 8;
            for (i64 j = 0;; j += 8) {
                if (j > na - 8) j = na - 8;
                tr8x8_u16(d + i * db + j * 2, db, s + j * sa + i * 2, sa);
                if (j + 8 >= na) break;
            }
            if (i + 8 >= nb) break;
        }
        return;
    }
#endif
    switch (es) {
    case 1: tile_u8(d, s, nb, na, db, da, sb, sa); break;
    case 2: tile_u16(d, s, nb, na, db, da, sb, sa); break;
    case 4: tile_u32(d, s, nb, na, db, da, sb, sa); break;
    case 8: tile_u64(d, s, nb, na, db, da, sb, sa); break;
    case 16: tile_u128(d, s, nb, na, db, da, sb, sa); break;
    case 32: tile_u256(d, s, nb, na, db, da, sb, sa); break;
    case 64: tile_u512(d, s, nb, na, db, da, sb, sa); break;
    default: tile_any(d, s, nb, na, db, da, sb, sa, es); break;
    }
}

/* Advance the odometer over the outer axes (last fastest), moving both pointers; 0 when done. */
static inline int odometer_next(i64 *idx, int no, const i64 *shape, const i64 *ds, const i64 *ss,
                                char **d, const char **s) {
    for (int k = no - 1; k >= 0; k--) {
        if (++idx[k] < shape[k]) {
            *d += ds[k];
            *s += ss[k];
            return 1;
        }
        *d -= (shape[k] - 1) * ds[k];
        *s -= (shape[k] - 1) * ss[k];
        idx[k] = 0;
    }
    return 0;
}

int npd_copy(char *dst, const char *src, int nd, const i64 *shape, const i64 *ds, const i64 *ss, i64 es,
             int mode, i64 tile_a, i64 tile_b) {
    int nt = (mode & 4) != 0;              /* bit 2: streaming stores (see tile_copy_nt) */
    mode &= ~4;
    if (nd < 1 || nd > NPD_MAXND || es < 1 || (mode == 1 && nd < 2) || (mode != 0 && mode != 1))
        return -1;
    for (int k = 0; k < nd; k++) {
        if (shape[k] < 0) return -1;
        if (shape[k] == 0) return 0;
    }
    if (tile_a < 1) tile_a = 1;
    if (tile_b < 1) tile_b = 1;
    int inner = mode == 1 ? 2 : 1;         /* axes handled inside the outer loop */
    int no = nd - inner;                   /* outer axes 0 .. no-1 */
    i64 idx[NPD_MAXND] = {0};
    char *d = dst;
    const char *s = src;
    i64 na = shape[nd - 1], da = ds[nd - 1], sa = ss[nd - 1];
    i64 nb = 0, db = 0, sb = 0;
    if (mode == 1) {
        nb = shape[nd - 2];
        db = ds[nd - 2];
        sb = ss[nd - 2];
    }
    for (;;) {
        if (mode == 0) {
            row_copy(d, s, na, da, sa, es);
        } else {
            for (i64 i = 0; i < nb; i += tile_b) {
                i64 tb = nb - i < tile_b ? nb - i : tile_b;
                for (i64 j = 0; j < na; j += tile_a) {
                    i64 ta = na - j < tile_a ? na - j : tile_a;
                    tile_copy_nt(d + i * db + j * da, s + i * sb + j * sa, tb, ta, db, da, sb, sa, es, nt);
                }
            }
        }
        if (!odometer_next(idx, no, shape, ds, ss, &d, &s)) break;
    }
#if defined(__SSE2__)
    if (nt) _mm_sfence();                  /* streaming stores are weakly ordered */
#endif
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * npd_tile3(dst, src, nd, shape, dst_strides, src_strides, elsize, dir)
 *
 * Many small contiguous blocks transposed into long contiguous runs, or back.  The last three axes
 * are (r, a, b); the others are looped over outermost (axis 0 slowest):
 *   the "block" side has b unit-strided and a stride B*elsize: per r one contiguous A x B block;
 *   the "run" side has a unit-strided and r stride A*elsize: per b one contiguous run of R*A.
 * dir 0: src is the block side, dst the run side (FRACTAL_Z pack: per n one C0 x H*W block of the
 * NCHW weight, per h*w one run of N*C0); dir 1: the reverse (unpack). dir | 4: streaming stores on
 * the run side where they apply (2-byte elements, 16-byte aligned runs).  Per r one A x B <-> B x A
 * transpose (SSE2 8x8 blocks for 2-byte elements), walked without the generic kernel's tile loops,
 * with a software prefetch of the block side a few rows ahead; 16 x B halves and 32 x B bytes through
 * the AVX2 transposes above where the CPU has them.  dir | 8 with an r-chunk: the staged walk
 * (npd_t3_staged above) for tensors beyond the caches.  (Measured and rejected on the benchmark
 * machine: staging r-tiles through an L1 buffer, with memcpy or non-temporal stores; n-tiles outside
 * the c1 loop; prefetch distances 8-64 rows: all slower or within the noise.)
 * Returns 0, or -1 when the strides do not have this structure.
 */
#define NPD_T3_READ_AHEAD 8     /* rows; measured on FRACTAL_Z [1024, 1024, 3, 3] fp16: pack +10 points */
#define NPD_T3_WRITE_AHEAD 4    /* rows; unpack +5 points (4, 8 and 16 tried) */

/* software prefetch of the n bytes at p (the block rows are a page or more apart: the hardware
 * prefetchers do not follow them) */
static inline void npd_prefetch(const char *p, i64 n, int write) {
#if defined(__GNUC__)
    for (i64 o = 0; o < n; o += 64) {
        if (write) __builtin_prefetch(p + o, 1);
        else __builtin_prefetch(p + o, 0);
    }
    if (write) __builtin_prefetch(p + n - 1, 1);
    else __builtin_prefetch(p + n - 1, 0);
#else
    (void)p; (void)n; (void)write;
#endif
}

/* one r of npd_tile3 (see below) */
static inline void npd_t3_one(char *d, const char *s, i64 r, i64 R, i64 A, i64 B, i64 es, i64 rstride,
                              i64 bstride, i64 blk, int dir, int nt, int ahead) {
    if (dir == 0) {
        if (ahead && r + NPD_T3_READ_AHEAD < R) npd_prefetch(s + (r + NPD_T3_READ_AHEAD) * rstride, blk, 0);
        if (!t3_block_avx2(d + r * A * es, s + r * rstride, A, B, es, bstride, 0, nt))
            tile_copy_nt(d + r * A * es, s + r * rstride, B, A, bstride, es, es, B * es, es, nt);
    } else {
        if (ahead && r + NPD_T3_WRITE_AHEAD < R) npd_prefetch(d + (r + NPD_T3_WRITE_AHEAD) * rstride, blk, 1);
        if (!t3_block_avx2(d + r * rstride, s + r * A * es, A, B, es, bstride, 1, nt))
            tile_copy(d + r * rstride, s + r * A * es, A, B, B * es, es, es, bstride, es);
    }
}

/* n bytes from s to d, ordinary stores */
static inline void npd_put(char *d, const char *s, i64 n) { memcpy(d, s, (size_t)n); }

/* A destination run written piece by piece in address order with streaming stores of whole
 * 64-byte lines only (the staged unpack's block rows). A streaming store to part of a line costs the memory controller a
 * read-modify-write, and an ordinary one a read for ownership: when the run is not line-aligned
 * (numpy's large arrays start 16 bytes past a page) every piece would begin and end inside a line.
 * So the bytes of a line the next piece completes wait here, and the line goes out whole; only the
 * run's first and last partial lines take ordinary stores. (The pack does without: with one run per
 * outer index and b, thousands of these would be touched per tile, and their loads measured slower
 * than staging again the one or two r the shared line needs: see npd_put_lines.) */
typedef struct {
    char *end;              /* where the pending bytes end (the next piece must start here) */
    int n;                  /* pending bytes: the start of the line ending at `end` + 64 - n */
    unsigned char line[64] __attribute__((aligned(16)));
} npd_lw;

static inline void lw_flush(npd_lw *w) {
    if (w->n) npd_small_copy(w->end - w->n, (const char *)w->line, w->n);
    w->n = 0;
}

static inline void lw_put(npd_lw *w, char *d, const char *s, i64 n) {
#if defined(__SSE2__)
    if (w->n && w->end != d) lw_flush(w);
    if (w->n && (w->n & 15) == 0 && n >= 64 - w->n) {
        /* complete the pending line straight from both sources, 16 bytes at a time (copying the
         * piece's part into `line` first would stall each load on the stores just made) */
        char *l = d - w->n;
        for (int o = 0; o < w->n; o += 16)
            _mm_stream_si128((__m128i *)(l + o), _mm_load_si128((const __m128i *)(w->line + o)));
        for (int o = w->n; o < 64; o += 16)
            _mm_stream_si128((__m128i *)(l + o), _mm_loadu_si128((const __m128i *)(s + o - w->n)));
        i64 k = 64 - w->n;
        d += k; s += k; n -= k;
        w->n = 0;
    }
    if (w->n) {                                   /* complete the pending line */
        i64 k = 64 - w->n < n ? 64 - w->n : n;
        npd_small_copy((char *)w->line + w->n, s, k);
        w->n += (int)k;
        d += k; s += k; n -= k;
        w->end = d;
        if (w->n < 64) return;
        char *l = d - 64;
        for (int o = 0; o < 64; o += 16)
            _mm_stream_si128((__m128i *)(l + o), _mm_load_si128((const __m128i *)(w->line + o)));
        w->n = 0;
    }
    i64 head = (i64)((64 - ((uintptr_t)d & 63)) & 63);
    if (head > n) head = n;
    npd_small_copy(d, s, head);                   /* the run's first partial line */
    d += head; s += head; n -= head;
    i64 body = n & ~(i64)63;
    npd_stream(d, s, body);
    d += body; s += body; n -= body;
    npd_small_copy((char *)w->line, s, n);        /* waits for the next piece */
    w->n = (int)n;
    w->end = d + n;
#else
    memcpy(d, s, (size_t)n);
    (void)w;
#endif
}

/* The staged walk of npd_tile3 (dir bit 3), for tensors far beyond the caches. Tiles of rc
 * consecutive r (and, unpacking, oc consecutive indices of the innermost outer axis when the block
 * side's rows continue across it) go through a buffer in L1, so that main memory sees only whole
 * runs: pack transposes the tile's blocks (read along the block side's rows) into the buffer and
 * writes each run piece (rc*A elements per b) with one streaming burst; unpack gathers the run
 * pieces into the buffer (the next tile's pieces prefetched meanwhile), transposes them into a
 * second buffer and writes the block rows with streaming stores. Without it the run side sees one
 * A-element write per (r, b): on a 2 x 256 MiB FRACTAL_Z fp16 pack on the benchmark host 0.23 of a
 * copy, staged 0.6-0.7 (rc 4-8), unpack 0.37 -> 0.42-0.47 (rc 32, oc 2). */
#define NPD_STAGE 32768

/* pack, one run piece of the staged walk: the run bytes [p0, p1) (p0 >= base, the run's start) are
 * in `st`, which holds the run from address `sbase` on. With nt, whole 64-byte lines by streaming
 * stores: the lines from the one holding p0 (its bytes before p0 were staged again from the
 * previous tile's last r) up to the one holding p1, which the next tile writes; the run's first
 * and last partial lines (first and last tile) by ordinary stores. */
static inline void npd_put_lines(char *base, char *p0, char *p1, int last, const char *st, char *sbase, int nt) {
#if defined(__SSE2__)
    if (nt) {
        char *lo = (char *)((uintptr_t)p0 & ~(uintptr_t)63);
        char *hi = last ? p1 : (char *)((uintptr_t)p1 & ~(uintptr_t)63);
        if (lo < base) {                                  /* the run's first partial line */
            char *e = lo + 64 < hi ? lo + 64 : hi;
            if (e > base) npd_small_copy(base, st + (base - sbase), e - base);
            lo += 64;
        }
        char *full = last ? (char *)((uintptr_t)p1 & ~(uintptr_t)63) : hi;
        if (full > lo) npd_stream(lo, st + (lo - sbase), full - lo);
        if (last && full < p1 && full >= lo)          /* the run's last partial line */
            npd_small_copy(full, st + (full - sbase), p1 - full);
        return;
    }
#else
    (void)base; (void)last; (void)nt;
#endif
    memcpy(p0, st + (p0 - sbase), (size_t)(p1 - p0));
}

/* pack, whole rows (dir bit 4, with the staged walk): a tile's rc r are staged for every index of the
 * innermost outer axis before any run piece is written, so that each source row (FRACTAL_Z: one n's
 * C x H x W weights) is read from start to end in one go rather than one block per outer index
 * interleaved with the writes. On an AMD EPYC host (single-core reads of 9 GB/s; reads of 288-byte
 * strips from rows 64 KB apart 5 GB/s) FRACTAL_Z fp16 pack [4096, 3584, 3, 3] went from 0.33 of a
 * copy to 0.44-0.51 in the C harness (rc 16-24). Returns 0 when the buffer would exceed
 * NPD_WHOLE_MAX (the caller stages per outer index then). */
#define NPD_WHOLE_MAX (8 << 20)

/* pack with streaming stores: how many r before its own each tile stages again (the bytes of the
 * line it shares with the previous tile), 0 when every run piece starts on a line */
static inline i64 npd_t3_back(const char *dst, int no, const i64 *ds, i64 bstride, i64 rc, i64 run) {
    int aligned = ((uintptr_t)dst & 63) == 0 && (bstride & 63) == 0 && ((rc * run) & 63) == 0;
    for (int k = 0; k < no; k++) aligned = aligned && (ds[k] & 63) == 0;
    return aligned ? 0 : (63 + run - 1) / run;
}

static int npd_t3_whole(char *dst, const char *src, int no, const i64 *shape, const i64 *ds, const i64 *ss,
                        i64 R, i64 A, i64 B, i64 es, i64 rstride, i64 bstride, i64 rc, int nt) {
    i64 run = A * es, blk = A * B * es;
    i64 L = shape[no - 1], dL = ds[no - 1], sL = ss[no - 1];
    i64 back = nt ? npd_t3_back(dst, no, ds, bstride, rc, run) : 0;
    i64 pe = (rc + back) * run, per = B * pe + 64;      /* + a line: the outer indices' regions off one set */
    if (L * per > NPD_WHOLE_MAX || (rc + back) * blk > NPD_WHOLE_MAX) return 0;
    char *mem = (char *)malloc((size_t)(L * per + 64));    /* (C99: no aligned_alloc) */
    if (!mem) return 0;
    char *buf = (char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    i64 idx[NPD_MAXND] = {0};
    for (i64 r0 = 0; r0 < R; r0 += rc) {
        i64 rn = R - r0 < rc ? R - r0 : rc;
        i64 e = r0 < back ? r0 : back, pr = (rn + e) * run;   /* staged r: r0 - e .. r0 + rn - 1 */
        int last = r0 + rn >= R;
        for (int k = 0; k < no; k++) idx[k] = 0;
        char *d = dst;
        const char *s = src;
        for (;;) {
            for (i64 rr = 0; rr < rn + e; rr++) {    /* stage: each source row read through */
                const char *sr = s + (r0 - e + rr) * rstride;
                for (i64 k0 = 0; k0 < L; k0++) {
                    const char *b = sr + k0 * sL;
                    char *st = buf + k0 * per + rr * run;
                    if (!t3_block_avx2(st, b, A, B, es, pr, 0, 0))
                        tile_copy(st, b, B, A, pr, es, es, B * es, es);
                }
            }
            for (i64 k0 = 0; k0 < L; k0++) {         /* then every run piece, whole lines */
                char *dk = d + k0 * dL;
                const char *st = buf + k0 * per;
                for (i64 b = 0; b < B; b++) {
                    char *base = dk + b * bstride;
                    npd_put_lines(base, base + r0 * run, base + (r0 + rn) * run, last, st + b * pr,
                                  base + (r0 - e) * run, nt);
                }
            }
            if (!odometer_next(idx, no - 1 > 0 ? no - 1 : 0, shape, ds, ss, &d, &s)) break;
        }
    }
    free(mem);
#if defined(__SSE2__)
    if (nt) _mm_sfence();
#endif
    return 1;
}

static void npd_t3_staged(char *dst, const char *src, int no, const i64 *shape, const i64 *ds, const i64 *ss,
                          i64 R, i64 A, i64 B, i64 es, i64 rstride, i64 bstride, i64 rc, int dir, int nt) {
    static __thread char stage_mem[2][NPD_STAGE + 4096] __attribute__((aligned(64)));
    char *stage[2] = {stage_mem[0], stage_mem[1]};
    i64 run = A * es, blk = A * B * es;
    i64 L = no > 0 ? shape[no - 1] : 1;
    i64 dL = no > 0 ? ds[no - 1] : 0, sL = no > 0 ? ss[no - 1] : 0;
    i64 oc = 1;
    if (dir == 1 && no > 0 && dL == blk) oc = L < 2 ? 1 : 2;   /* block rows continue across L */
    /* pack with streaming stores: each tile stages `back` more r before its own (the bytes of the
     * line it shares with the previous tile), unless every run piece starts on a line */
    i64 back = dir == 0 && nt ? npd_t3_back(dst, no, ds, bstride, rc, run) : 0;
    while (rc > 1 && oc * (rc + back) * blk > NPD_STAGE) rc >>= 1;
    if (oc * (rc + back) * blk > NPD_STAGE) {
        oc = 1;
        if ((rc + back) * blk > NPD_STAGE) { back = 0; nt = 0; }
    }
    /* unpack with streaming stores: a line writer per r of the tile (its block row continues
     * across the tiles of L) */
    npd_lw lw_rows[256];
    if (dir == 1 && nt) memset(lw_rows, 0, sizeof(npd_lw) * (size_t)(rc < 256 ? rc : 256));
    i64 idx[NPD_MAXND] = {0};
    for (i64 r0 = 0; r0 < R; r0 += rc) {
        i64 rn = R - r0 < rc ? R - r0 : rc, piece = rn * run;
        i64 e = r0 < back ? r0 : back, pe = (rn + e) * run;     /* staged r: r0 - e .. r0 + rn - 1 */
        int last = r0 + rn >= R;
        for (int k = 0; k < no; k++) idx[k] = 0;
        char *d = dst;
        const char *s = src;
        for (;;) {        /* over the outer axes but the innermost, which the tiles walk */
            for (i64 k0 = 0; k0 < L; k0 += oc) {
                i64 kn = L - k0 < oc ? L - k0 : oc;
                char *dk = d + k0 * dL;
                const char *sk = s + k0 * sL;
                /* the buffer that feeds the streaming stores sits off the destination's 4K alias
                 * (measured: 0.45 of a copy instead of 0.63-0.66 where it did not) */
                stage[dir] = npd_unaliased(stage_mem[dir], dk + (dir == 0 ? (r0 - e) * run : r0 * rstride));
                if (dir == 0) {
                    for (i64 rr = 0; rr < rn + e; rr++) {
                        const char *b = sk + (r0 - e + rr) * rstride;
                        if (!t3_block_avx2(stage[0] + rr * run, b, A, B, es, pe, 0, 0))
                            tile_copy(stage[0] + rr * run, b, B, A, pe, es, es, B * es, es);
                    }
                    for (i64 b = 0; b < B; b++) {
                        char *base = dk + b * bstride;
                        npd_put_lines(base, base + r0 * run, base + (r0 + rn) * run, last, stage[0] + b * pe,
                                      base + (r0 - e) * run, nt);
                    }
                } else {
                    for (i64 kk = 0; kk < kn; kk++)
                        for (i64 b = 0; b < B; b++)
                            memcpy(stage[0] + (kk * B + b) * piece, sk + kk * sL + b * bstride + r0 * run, (size_t)piece);
                    int ahead = k0 + 2 * oc <= L;
                    i64 lines = (piece + 63) / 64, tot = oc * B * lines, per = (tot + rn - 1) / rn;
                    for (i64 rr = 0; rr < rn; rr++) {
#if defined(__GNUC__)
                        if (ahead)      /* the next tile's run pieces, spread over this tile's transposes */
                            for (i64 q = rr * per; q < (rr + 1) * per && q < tot; q++) {
                                i64 pl = q / lines;
                                __builtin_prefetch(sk + (oc + pl / B) * sL + (pl % B) * bstride + r0 * run
                                                   + (q % lines) * 64, 0, 2);
                            }
#endif
                        for (i64 kk = 0; kk < kn; kk++) {
                            char *o = stage[1] + (rr * kn + kk) * blk;
                            const char *i = stage[0] + kk * B * piece + rr * run;
                            if (!t3_block_avx2(o, i, A, B, es, piece, 1, 0))
                                tile_copy(o, i, A, B, B * es, es, es, piece, es);
                        }
                    }
                    for (i64 rr = 0; rr < rn; rr++) {
                        char *row = dk + (r0 + rr) * rstride;
                        if (nt && rr < 256) lw_put(&lw_rows[rr], row, stage[1] + rr * kn * blk, kn * blk);
                        else npd_put(row, stage[1] + rr * kn * blk, kn * blk);
                    }
                }
            }
            if (!odometer_next(idx, no - 1 > 0 ? no - 1 : 0, shape, ds, ss, &d, &s)) break;
        }
        if (dir == 1 && nt)
            for (i64 rr = 0; rr < rn && rr < 256; rr++) lw_flush(&lw_rows[rr]);
    }
#if defined(__SSE2__)
    if (nt) _mm_sfence();
#endif
}

int npd_tile3(char *dst, const char *src, int nd, const i64 *shape, const i64 *ds, const i64 *ss, i64 es,
              int dir) {
    int nt = (dir & 4) != 0;               /* bit 2: streaming stores on the run side (pack) */
    int staged = (dir & 8) != 0;           /* bit 3: the staged walk (npd_t3_staged) */
    int whole = (dir & 16) != 0;           /* bit 4: with it, pack whole rows (npd_t3_whole) */
    i64 rc = (dir >> 8) & 0xff;            /* bits 8-15: r-chunk; 0 = r innermost (see below) */
    dir &= 3;
    if (nd < 3 || nd > NPD_MAXND || es < 1 || (dir != 0 && dir != 1)) return -1;
    for (int k = 0; k < nd; k++) {
        if (shape[k] < 0) return -1;
        if (shape[k] == 0) return 0;
    }
    i64 R = shape[nd - 3], A = shape[nd - 2], B = shape[nd - 1];
    const i64 *bs = dir == 0 ? ss : ds;      /* block side strides */
    const i64 *rs = dir == 0 ? ds : ss;      /* run side strides */
    if (bs[nd - 1] != es || bs[nd - 2] != B * es || rs[nd - 2] != es || rs[nd - 3] != A * es) return -1;
    i64 rstride = bs[nd - 3], bstride = rs[nd - 1], blk = A * B * es;
    int no = nd - 3;
    i64 idx[NPD_MAXND] = {0};
    char *d = dst;
    const char *s = src;
    if (staged && rc > 0 && whole && dir == 0 && no > 0 &&
        npd_t3_whole(dst, src, no, shape, ds, ss, R, A, B, es, rstride, bstride, rc, nt))
        return 0;
    if (staged && rc > 0) {
        npd_t3_staged(dst, src, no, shape, ds, ss, R, A, B, es, rstride, bstride, rc, dir, nt);
        return 0;
    }
    if (rc > 0) {
        /* r-chunks outermost: rc consecutive r (whole lines of the run side when rc * A * es is a
         * multiple of 64) for every index of the outer axes, then the next chunk. The block side
         * is then walked along its rows (FRACTAL_Z: the NCHW weight read row by row), the run
         * side written a line per stream at a time. */
        for (i64 r0 = 0; r0 < R; r0 += rc) {
            i64 r1 = R - r0 < rc ? R : r0 + rc;
            for (int k = 0; k < no; k++) idx[k] = 0;
            d = dst;
            s = src;
            for (;;) {
                for (i64 r = r0; r < r1; r++) npd_t3_one(d, s, r, R, A, B, es, rstride, bstride, blk, dir, nt, 0);
                if (!odometer_next(idx, no, shape, ds, ss, &d, &s)) break;
            }
        }
#if defined(__SSE2__)
        if (nt) _mm_sfence();
#endif
        return 0;
    }
    for (;;) {
        if (dir == 0) {     /* run[b][r*A + a] = blk_r[a][b]; prefetch the source block 8 rows ahead */
            for (i64 r = 0; r < R; r++) {
                if (r + NPD_T3_READ_AHEAD < R) npd_prefetch(s + (r + NPD_T3_READ_AHEAD) * rstride, blk, 0);
                if (!t3_block_avx2(d + r * A * es, s + r * rstride, A, B, es, bstride, 0, nt))
                    tile_copy_nt(d + r * A * es, s + r * rstride, B, A, bstride, es, es, B * es, es, nt);
            }
        } else {            /* blk_r[a][b] = run[b][r*A + a]; prefetch (for writing) the block 4 rows ahead */
            for (i64 r = 0; r < R; r++) {
                if (r + NPD_T3_WRITE_AHEAD < R) npd_prefetch(d + (r + NPD_T3_WRITE_AHEAD) * rstride, blk, 1);
                if (!t3_block_avx2(d + r * rstride, s + r * A * es, A, B, es, bstride, 1, nt))
                    tile_copy(d + r * rstride, s + r * A * es, A, B, B * es, es, es, bstride, es);
            }
        }
        if (!odometer_next(idx, no, shape, ds, ss, &d, &s)) break;
    }
#if defined(__SSE2__)
    if (nt) _mm_sfence();
#endif
    return 0;
}
