/* npu-deploy: strided N-d copy kernel (optional; compiled at first use by _fastcopy.py).
 *
 * npd_copy(dst, src, nd, shape, dst_strides, src_strides, elsize, mode, tile_a, tile_b)
 * copies the box `shape` (rank <= 8, byte strides, may be negative) from src to dst, element by
 * element (elsize bytes, raw bits: 1/2/4/8/16/32 bytes typed, anything else by memcpy).
 *
 *   mode 0 ("rows"):  the last axis is the inner loop; a run contiguous on both sides is one memcpy.
 *   mode 1 ("tiles"): the last axis (a) is innermost in dst, the one before (b) innermost in src;
 *                     they are walked in tile_b x tile_a cache blocks (2-byte elements with
 *                     unit strides use an SSE2 8x8 transpose where available).
 * All other axes are looped over outermost (axis 0 slowest).  The caller (Python) checks that every
 * byte touched lies inside both buffers before calling.  Returns 0, or -1 on invalid arguments.
 */
#include <stdint.h>
#include <string.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define NPD_MAXND 8
typedef int64_t i64;
typedef struct { uint64_t w[2]; } npd_u128;
typedef struct { uint64_t w[4]; } npd_u256;

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
    default: row_any(d, s, n, dstep, sstep, es); break;
    }
}

#if defined(__SSE2__)
/* dst column i (8 u16 at d + i*dstride) = element i of the 8 source rows (8 u16 at s + k*sstride) */
static inline void tr8x8_u16(char *d, i64 dstride, const char *s, i64 sstride) {
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
    _mm_storeu_si128((__m128i *)(d + 0 * dstride), _mm_unpacklo_epi64(u0, u4));
    _mm_storeu_si128((__m128i *)(d + 1 * dstride), _mm_unpackhi_epi64(u0, u4));
    _mm_storeu_si128((__m128i *)(d + 2 * dstride), _mm_unpacklo_epi64(u1, u5));
    _mm_storeu_si128((__m128i *)(d + 3 * dstride), _mm_unpackhi_epi64(u1, u5));
    _mm_storeu_si128((__m128i *)(d + 4 * dstride), _mm_unpacklo_epi64(u2, u6));
    _mm_storeu_si128((__m128i *)(d + 5 * dstride), _mm_unpackhi_epi64(u2, u6));
    _mm_storeu_si128((__m128i *)(d + 6 * dstride), _mm_unpacklo_epi64(u3, u7));
    _mm_storeu_si128((__m128i *)(d + 7 * dstride), _mm_unpackhi_epi64(u3, u7));
}
#endif

/* one nb x na block: d[i*db + j*da] = s[i*sb + j*sa] */
static void tile_copy(char *d, const char *s, i64 nb, i64 na, i64 db, i64 da, i64 sb, i64 sa, i64 es) {
#if defined(__SSE2__)
    if (es == 2 && da == 2 && sb == 2 && nb >= 8 && na >= 8) {
        i64 nb8 = nb & ~(i64)7, na8 = na & ~(i64)7;
        for (i64 i = 0; i < nb8; i += 8)
            for (i64 j = 0; j < na8; j += 8) tr8x8_u16(d + i * db + j * 2, db, s + j * sa + i * 2, sa);
        if (na8 < na) tile_u16(d + na8 * 2, s + na8 * sa, nb8, na - na8, db, da, sb, sa);
        if (nb8 < nb) tile_u16(d + nb8 * db, s + nb8 * 2, nb - nb8, na, db, da, sb, sa);
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
    default: tile_any(d, s, nb, na, db, da, sb, sa, es); break;
    }
}

int npd_copy(char *dst, const char *src, int nd, const i64 *shape, const i64 *ds, const i64 *ss, i64 es,
             int mode, i64 tile_a, i64 tile_b) {
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
                    tile_copy(d + i * db + j * da, s + i * sb + j * sa, tb, ta, db, da, sb, sa, es);
                }
            }
        }
        /* odometer over the outer axes, last fastest */
        int k = no - 1;
        for (; k >= 0; k--) {
            if (++idx[k] < shape[k]) {
                d += ds[k];
                s += ss[k];
                break;
            }
            d -= (shape[k] - 1) * ds[k];
            s -= (shape[k] - 1) * ss[k];
            idx[k] = 0;
        }
        if (k < 0) break;
    }
    return 0;
}
