/* The statistics of one block of a pair in a single pass: what engine/metrics.py computes for finite values with
 * about twenty numpy passes, fused into one loop over cache-sized sub-blocks. Below them, one tensor's summary for
 * ingest (summary.py), and the "fold64" content hash's sum of a tensor's bytes (ingest/fold64.py), alone or in the
 * same pass as the summary (a summary capture's CPU tensors).
 *
 * Every value is widened to double before any arithmetic, and every sum accumulates in double (in one vector's
 * lanes, added together at the end). Element-wise results are exactly numpy's: |a - b|, the tolerance test
 * |a - b| > |a| * rtol + atol (no fused multiply-add: built with -ffp-contract=off), the decade of each difference
 * (compared at float32 precision: |a - b| and the edges rounded to float32) and the first position of the largest
 * difference. Sums may differ from numpy's in the last bits (another order).
 *
 * Per sub-block, the largest difference is kept as a value only; a sub-block that raises it is scanned again for
 * its first position (rare after the first few). Relative differences assume non-zero references; a sub-block
 * where one is zero gets a non-finite sum and is computed again, over its non-zero references only.
 *
 * The kernel does not look for NaN or Inf: they reach the sums of squares, which the caller checks, and a block
 * where those are not finite is computed again by the general numpy path. So is a block whose sums of squares are
 * out of the range where plain float64 sums are exact up to rounding (engine/scaled_sums.py): past float64's range,
 * or under SAFE_LOW while some value is not zero (squares under float64's smallest normal lost). The numpy path sums
 * those scaled by a power of two. Whether a side holds a non-zero value is known without reading it again (a
 * non-zero reference counts a relative difference; against zero references, a non-zero candidate counts a
 * difference) but for a candidate of tiny values or zeros against a non-zero reference, which is scanned.
 *
 * Vector families. The build (server/build_hooks.py) compiles this file once per family, each time for the family's
 * instruction set (-march) with TD_FAMILY (its name) and TD_LANES (doubles per vector) defined, and once without
 * TD_FAMILY for the few functions that every family shares (at the end); it links them into one library. On
 * x86-64: avx512 (8 lanes; the pair kernel's steps in AVX-512 intrinsics), avx2 (4 lanes, AVX2 and FMA
 * intrinsics for the steps that generic vectors compile badly) and baseline (2 lanes, SSE2); elsewhere baseline
 * alone (2 lanes: NEON on aarch64). Each family exports its kernels with its name appended (td_stats_ff_avx2);
 * engine/fused.py picks the best family this CPU runs (td_family_runs), once. GCC's generic vectors wider than the
 * instruction set's registers compile to mostly scalar code, hence one lane count per family.
 */

#include <stdint.h>
#include <string.h>

#include "kernel_structs.h" /* td_partial and td_summary, shared with engine/layouts.py */

#define SUB 2048 /* elements per sub-block: 8 KiB of float32 differences, kept in L1 for the histogram */
#define SAFE_LOW 0x1p-900 /* engine/scaled_sums.py's SAFE_LOW */
#define EDGES TD_EDGES

#ifdef TD_FAMILY

#define LANES TD_LANES
#define JOIN_(name, family) name##_##family
#define JOIN(name, family) JOIN_(name, family)
#define FAMILY(name) JOIN(name, TD_FAMILY) /* td_stats_ff -> td_stats_ff_avx2 */
#define INLINE static inline __attribute__((always_inline))

typedef double vd __attribute__((vector_size(LANES * 8)));
typedef int64_t vl __attribute__((vector_size(LANES * 8)));
typedef float vf __attribute__((vector_size(LANES * 4)));
typedef float vh __attribute__((vector_size(LANES * 8)));   /* 2 * LANES floats: the histogram's passes */
typedef int32_t vi __attribute__((vector_size(LANES * 8)));
#define HLANES (2 * LANES) /* at most 16, which divides the histogram's lengths */

INLINE vd blend(vl mask, vd yes, vd no) { return (vd)(((vl)yes & mask) | ((vl)no & ~mask)); }
INLINE vd vabs(vd x) { return (vd)((vl)x & ((vl){0} + INT64_MAX)); }
INLINE double hsum(vd x) { double s = 0; for (int i = 0; i < LANES; i++) s += x[i]; return s; }
INLINE int64_t hsuml(vl x) { int64_t s = 0; for (int i = 0; i < LANES; i++) s += x[i]; return s; }
INLINE double hmax(vd x) { double m = x[0]; for (int i = 1; i < LANES; i++) m = x[i] > m ? x[i] : m; return m; }

typedef struct {
    vd sum_abs, sum_sq, dot, norm_a, norm_b;
    vl mismatched;
} lanes_t;

INLINE vd load_double(const double *p) {
    vd x;
    memcpy(&x, p, sizeof x);
    return x;
}
INLINE double one_float(const float *p) { return (double)*p; }
INLINE double one_double(const double *p) { return *p; }

/* The kernels' vector steps: vmax(x, y) and vmin(x, y), x where x > y (x < y) else y, lane by lane (as maxpd and
 * minpd take them, NaN and signed zeros included; a NaN only reaches a block the caller discards), acc + x * y, a
 * count of lanes where x > y (false for NaN, as C's >), |a - b| rounded to float32, and how many of a sub-block's
 * differences (as float32, m a multiple of 16) reach `edge`. GCC 12 widens float32 in halves, blends instead of
 * taking a maximum and has no generic fused multiply-add, so AVX-512 and AVX2 have their own (measured, ns per
 * pair of float32 in generic vectors and in intrinsics: avx512 on an AMD EPYC, 0.60 and 0.36; avx2 on an Intel
 * Xeon, 0.96 and 0.57). The fused multiply-adds round once where generic vectors round twice: the sums of products
 * differ between families in the last bits, no element-wise result does (the tolerance test is never fused). */
#if defined(__AVX512F__) && LANES == 8
#include <immintrin.h>
INLINE vd load_float(const float *p) { return (vd)_mm512_cvtps_pd(_mm256_loadu_ps(p)); }
INLINE vd vmax(vd x, vd y) { return (vd)_mm512_max_pd((__m512d)x, (__m512d)y); }
INLINE vd vmin(vd x, vd y) { return (vd)_mm512_min_pd((__m512d)x, (__m512d)y); }
INLINE vd madd(vd acc, vd x, vd y) { return (vd)_mm512_fmadd_pd((__m512d)x, (__m512d)y, (__m512d)acc); }
INLINE vl count_gt(vl count, vd x, vd y) {
    __mmask8 gt = _mm512_cmp_pd_mask((__m512d)x, (__m512d)y, _CMP_GT_OQ);
    return (vl)_mm512_mask_sub_epi64((__m512i)count, gt, (__m512i)count, _mm512_set1_epi64(-1));
}
INLINE vf narrow(vd x) { return (vf)_mm512_cvtpd_ps((__m512d)x); }
INLINE int64_t reaching(const float *diff, int64_t m, float edge) {
    const __m512 e = _mm512_set1_ps(edge);
    const __m512i one = _mm512_set1_epi32(1);
    __m512i c = _mm512_setzero_si512();
    for (int64_t j = 0; j < m; j += 16)
        c = _mm512_mask_add_epi32(c, _mm512_cmp_ps_mask(_mm512_load_ps(diff + j), e, _CMP_GE_OQ), c, one);
    return _mm512_reduce_add_epi32(c);
}
#else
#if defined(__AVX2__) && defined(__FMA__) && LANES == 4
#include <immintrin.h>
INLINE vd load_float(const float *p) { return (vd)_mm256_cvtps_pd(_mm_loadu_ps(p)); }
INLINE vd vmax(vd x, vd y) { return (vd)_mm256_max_pd((__m256d)x, (__m256d)y); }
INLINE vd vmin(vd x, vd y) { return (vd)_mm256_min_pd((__m256d)x, (__m256d)y); }
INLINE vd madd(vd acc, vd x, vd y) { return (vd)_mm256_fmadd_pd((__m256d)x, (__m256d)y, (__m256d)acc); }
INLINE vf narrow(vd x) { return (vf)_mm256_cvtpd_ps((__m256d)x); }
#else
INLINE vd load_float(const float *p) {
    vf x;
    memcpy(&x, p, sizeof x);
    return __builtin_convertvector(x, vd);
}
INLINE vd vmax(vd x, vd y) { return blend(x > y, x, y); }
INLINE vd vmin(vd x, vd y) { return blend(x < y, x, y); }
INLINE vd madd(vd acc, vd x, vd y) { return acc + x * y; }
INLINE vf narrow(vd x) { return __builtin_convertvector(x, vf); }
#endif
INLINE vl count_gt(vl count, vd x, vd y) { return count - (x > y); }
INLINE int64_t reaching(const float *diff, int64_t m, float edge) {
    const vh e = (vh){0} + edge;
    vi c = {0};
    for (int64_t j = 0; j < m; j += HLANES) {
        vh d;
        memcpy(&d, diff + j, sizeof d);
        c -= d >= e;
    }
    int64_t reached = 0;
    for (int k = 0; k < HLANES; k++) reached += c[k];
    return reached;
}
#endif

/* Fold one vector of each side into `L` and the sub-block's own maxima and sums, its differences into `diff`.
 * The relative difference assumes |a| > 0: where a lane's reference is zero, the sub-block's sum of relative
 * differences is not finite and the caller computes that sub-block's relative differences again (rel_exact). */
#define STEP(va, vb)                                                                                             \
    do {                                                                                                         \
        vd d = vabs(va - vb);                                                                                    \
        vf d32 = narrow(d);                                                                                      \
        memcpy(diff + j, &d32, sizeof d32);                                                                      \
        top = vmax(d, top);                                                                                      \
        L.sum_abs += d;                                                                                          \
        L.sum_sq = madd(L.sum_sq, d, d);                                                                         \
        vd r = vabs(va);                                                                                         \
        if (check) L.mismatched = count_gt(L.mismatched, d, r * vrtol + vatol);                                  \
        vd q = d / r;                                                                                            \
        rel += q;                                                                                                \
        rel_top = vmax(q, rel_top);                                                                              \
        L.dot = madd(L.dot, va, vb);                                                                             \
        L.norm_a = madd(L.norm_a, va, va);                                                                       \
        L.norm_b = madd(L.norm_b, vb, vb);                                                                       \
        nz = count_gt(nz, d, zero);                                                                              \
    } while (0)

/* Decades of the sub-block's differences (as float32, m a multiple of 16): one counting pass per edge at or below
 * its largest difference, from the top down, stopping at the first edge that every non-zero difference reaches
 * (as all below it do). */
INLINE void histogram(const float *diff, int64_t m, float top, int64_t nonzero, const float *edges,
                      int64_t *at_least) {
    int i = EDGES - 1;
    while (i >= 0 && edges[i] > top) i--;
    for (; i >= 0; i--) {
        int64_t reached = reaching(diff, m, edges[i]);
        at_least[i] += reached;
        if (reached == nonzero) {
            for (int k = 0; k < i; k++) at_least[k] += nonzero;
            break;
        }
    }
}

/* The first position in a sub-block where |a - b| equals `target`, computed as STEP computes it; -1 if none.
 * Vector by vector, so that differences that grow along the tensor (every sub-block a new maximum) stay cheap. */
#define FIND(TA, TB)                                                                                             \
    INLINE int64_t find_##TA##_##TB(const TA *a, const TB *b, int64_t m, double target) {                         \
        const vd t = (vd){0} + target;                                                                           \
        int64_t k = 0;                                                                                           \
        for (; k + LANES <= m; k += LANES) {                                                                     \
            vl hit = vabs(load_##TA(a + k) - load_##TB(b + k)) == t;                                             \
            int64_t found = 0;                                                                                   \
            for (int i = 0; i < LANES; i++) found |= hit[i];                                                     \
            if (found)                                                                                           \
                for (int i = 0; i < LANES; i++)                                                                  \
                    if (hit[i]) return k + i;                                                                    \
        }                                                                                                        \
        for (; k < m; k++)                                                                                       \
            if (__builtin_fabs(one_##TA(a + k) - one_##TB(b + k)) == target) return k;                           \
        return -1;                                                                                               \
    }

/* Which of the HLANES float32 differences at p (aligned as `diff` is) reach `edge`, as a bit mask: the worst
 * elements' candidates are found a vector at a time, without looking at each lane of the vectors without one. */
#if defined(__AVX512F__) && LANES == 8
INLINE uint32_t hits(const float *p, float edge) {
    return _mm512_cmp_ps_mask(_mm512_load_ps(p), _mm512_set1_ps(edge), _CMP_GE_OQ);
}
#elif defined(__AVX2__) && defined(__FMA__) && LANES == 4
INLINE uint32_t hits(const float *p, float edge) {
    return (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(p), _mm256_set1_ps(edge), _CMP_GE_OQ));
}
#else
INLINE uint32_t hits(const float *p, float edge) {
    vh d;
    memcpy(&d, p, sizeof d);
    vi hit = d >= ((vh){0} + edge);
    uint32_t mask = 0;
    for (int i = 0; i < HLANES; i++) mask |= (uint32_t)(hit[i] & 1) << i;
    return mask;
}
#endif

/* A threshold that at least `k` (at most 16) of a sub-block's `padded` float32 differences (a multiple of 16)
 * reach, in one pass: 16 maxima, each over the positions of one residue mod 16, merged into k groups, and the
 * least of the groups' maxima (each group's is a distinct element). Where differences grow along the tensor, every
 * element of a sub-block is above the heap's floor, and this leaves about k candidates where bisection needed a
 * dozen passes. 0 where k > 16. */
INLINE float kth_of_16_maxima(const float *diff, int64_t padded, int64_t k) {
    enum { Q = 16 / HLANES };
    if (k > 16 || padded < 16) return 0.0f;
    vh top[Q];
    memcpy(top, diff, sizeof top);
    for (int64_t j = 16; j < padded; j += 16)
        for (int q = 0; q < Q; q++) {
            vh d;
            memcpy(&d, diff + j + q * HLANES, sizeof d);
            vi gt = d > top[q];
            top[q] = (vh)(((vi)d & gt) | ((vi)top[q] & ~gt));
        }
    float m[16], group[16];
    memcpy(m, top, sizeof m);
    for (int64_t g = 0; g < k; g++) group[g] = m[g]; /* k groups of strides, each its largest: k elements reach */
    for (int64_t i = k; i < 16; i++) group[i % k] = m[i] > group[i % k] ? m[i] : group[i % k];
    float least = group[0];
    for (int64_t g = 1; g < k; g++) least = group[g] < least ? group[g] : least;
    return least;
}

/* The worst elements (td_partial's heap, kernel_structs.h): whether (d, at) ranks below the heap's entry i (a
 * smaller difference, or the same at a later position), and keeping (d, at, x, y) in place of the smallest once the
 * heap holds top_k. */
INLINE int worse(const td_partial *h, double d, int64_t at, int64_t i) {
    return d < h->top_abs[i] || (d == h->top_abs[i] && at > h->top_at[i]);
}
INLINE void heap_set(td_partial *h, int64_t i, double d, int64_t at, double x, double y) {
    h->top_abs[i] = d;
    h->top_at[i] = at;
    h->top_a[i] = x;
    h->top_b[i] = y;
}
INLINE void keep_worst(td_partial *h, double d, int64_t at, double x, double y) {
    int64_t i;
    if (h->top_n < h->top_k) { /* not full: sift up from the end */
        i = h->top_n++;
        while (i > 0 && worse(h, d, at, (i - 1) / 2)) {
            int64_t p = (i - 1) / 2;
            heap_set(h, i, h->top_abs[p], h->top_at[p], h->top_a[p], h->top_b[p]);
            i = p;
        }
    } else { /* in place of the smallest: sift down */
        i = 0;
        for (;;) {
            int64_t c = 2 * i + 1;
            if (c >= h->top_n) break;
            if (c + 1 < h->top_n && !worse(h, h->top_abs[c], h->top_at[c], c + 1)) c++;
            if (worse(h, d, at, c)) break;
            heap_set(h, i, h->top_abs[c], h->top_at[c], h->top_a[c], h->top_b[c]);
            i = c;
        }
    }
    heap_set(h, i, d, at, x, y);
}
/* The difference an element must exceed to enter the heap: above zero until it is full, then its smallest (a tie
 * with it comes later in the block, so it stays out). */
INLINE double worst_floor(const td_partial *h) { return h->top_n < h->top_k ? 0.0 : h->top_abs[0]; }

/* Offer a sub-block's differences above the heap's floor to it (computed as STEP computes them); called only where
 * the sub-block's largest difference is above the floor. Until the heap is full, every element is looked at. Then the
 * sub-block's float32 differences (`diff`, `padded` of them, zeros after the m real ones) pick the candidates: an
 * element above the floor has a float32 difference of at least the floor's (rounding is monotonic), and where more
 * than 4 * top_k reach that, a higher threshold that at least top_k of them reach is found by bisecting float32 bit
 * patterns (an element below it is smaller than top_k others of the sub-block, so not among the worst), starting
 * from the k-th largest of 16 strided maxima (kth_of_16_maxima) where that is higher. Only candidates are computed
 * again exactly. */
#define WORST(TA, TB)                                                                                            \
    static void worst_##TA##_##TB(const TA *a, const TB *b, const float *diff, int64_t m, int64_t padded,        \
                                  float sub_top, int64_t base, td_partial *out) {                                \
        float t = (float)worst_floor(out);                                                                       \
        if (out->top_n < out->top_k || !(t > 0)) {                                                               \
            for (int64_t k = 0; k < m; k++) {                                                                    \
                double x = one_##TA(a + k), y = one_##TB(b + k), d = __builtin_fabs(x - y);                      \
                if (d > worst_floor(out)) keep_worst(out, d, base + k, x, y);                                    \
            }                                                                                                    \
            return;                                                                                              \
        }                                                                                                        \
        float s = kth_of_16_maxima(diff, padded, out->top_k);                                                    \
        if (s > t) t = s; /* at least top_k of the sub-block reach s: an element below it is not among the worst */ \
        int32_t picked[4 * TD_TOP + 32]; /* the candidates' positions, in one pass where there are few */        \
        int64_t n = 0;                                                                                           \
        for (int64_t j = 0; j < padded && n <= 4 * out->top_k; j += HLANES)                                      \
            for (uint32_t hit = hits(diff + j, t); hit && n <= 4 * out->top_k; hit &= hit - 1)                  \
                picked[n++] = (int32_t)(j + __builtin_ctz(hit));                                                 \
        if (n <= 4 * out->top_k) {                                                                               \
            for (int64_t c = 0; c < n; c++) {                                                                    \
                int64_t k = picked[c];                                                                           \
                if (k >= m) break;                                                                               \
                double x = one_##TA(a + k), y = one_##TB(b + k), d = __builtin_fabs(x - y);                      \
                if (d > worst_floor(out)) keep_worst(out, d, base + k, x, y);                                    \
            }                                                                                                    \
            return;                                                                                              \
        }                                                                                                        \
        int64_t count = reaching(diff, padded, t); /* many: bisect for a higher threshold */                    \
        uint32_t lo, hi;                                                                                         \
        memcpy(&lo, &t, sizeof lo);                                                                              \
        memcpy(&hi, &sub_top, sizeof hi);                                                                        \
        hi += 1;                                                                                                 \
        while (count > 4 * out->top_k && hi - lo > 1) { /* count: how many reach lo, at least top_k */           \
            uint32_t mid = lo + (hi - lo) / 2;                                                                   \
            float u;                                                                                             \
            memcpy(&u, &mid, sizeof u);                                                                          \
            int64_t c = reaching(diff, padded, u);                                                               \
            if (c >= out->top_k) {                                                                               \
                lo = mid;                                                                                        \
                count = c;                                                                                       \
            } else {                                                                                             \
                hi = mid;                                                                                        \
            }                                                                                                    \
        }                                                                                                        \
        memcpy(&t, &lo, sizeof t);                                                                               \
        for (int64_t j = 0; j < m; j += HLANES) {                                                                \
            for (uint32_t hit = hits(diff + j, t); hit; hit &= hit - 1) { /* in order of position */             \
                int64_t i = __builtin_ctz(hit);                                                                  \
                if (j + i >= m) break;                                                                           \
                double x = one_##TA(a + j + i), y = one_##TB(b + j + i), d = __builtin_fabs(x - y);              \
                if (d > worst_floor(out)) keep_worst(out, d, base + j + i, x, y);                                \
            }                                                                                                    \
        }                                                                                                        \
    }

/* The relative differences of a sub-block where some reference is zero: only over non-zero references. */
#define REL_EXACT(TA, TB)                                                                                        \
    INLINE void rel_exact_##TA##_##TB(const TA *a, const TB *b, int64_t m, double *sum, double *top,              \
                                      int64_t *count) {                                                          \
        for (int64_t k = 0; k < m; k++) {                                                                        \
            double x = one_##TA(a + k), r = __builtin_fabs(x);                                                   \
            if (r > 0) {                                                                                         \
                double q = __builtin_fabs(x - one_##TB(b + k)) / r;                                              \
                *sum += q;                                                                                       \
                *top = q > *top ? q : *top;                                                                      \
                *count += 1;                                                                                     \
            }                                                                                                    \
        }                                                                                                        \
    }

/* Whether any of x[0..n) is not zero (either sign): bits but the sign's OR-ed, a sub-block at a time. Not inlined:
 * inlined, the kernel's main loop compiled slower for float64 (measured: 0.3 ns more per pair of zeros). */
static __attribute__((noinline)) int nonzero_float(const float *x, int64_t n) {
    for (int64_t start = 0; start < n; start += SUB) {
        int64_t m = n - start < SUB ? n - start : SUB;
        uint32_t bits = 0;
        for (int64_t k = 0; k < m; k++) {
            uint32_t u;
            memcpy(&u, x + start + k, sizeof u);
            bits |= u << 1;
        }
        if (bits) return 1;
    }
    return 0;
}
static __attribute__((noinline)) int nonzero_double(const double *x, int64_t n) {
    for (int64_t start = 0; start < n; start += SUB) {
        int64_t m = n - start < SUB ? n - start : SUB;
        uint64_t bits = 0;
        for (int64_t k = 0; k < m; k++) {
            uint64_t u;
            memcpy(&u, x + start + k, sizeof u);
            bits |= u << 1;
        }
        if (bits) return 1;
    }
    return 0;
}

/* NAME(a, b, n, base, ...) folds the values at flat positions base.. base + n of a block into `out` (which starts
 * as an empty partial: max_abs -1, argmax -1, the rest 0; then folded in order, so that the first largest
 * difference keeps its place), which is how compare/chunk_loop.c reduces a block chunk by chunk. It returns 1 once the
 * partial's sums of squares are not finite (a NaN or an Inf was met, or they overflowed), or are too small to be
 * exact while some value is not zero (norm_a is then set to NaN): the block is then the numpy path's, and a caller
 * may stop early. The partial's sums only grow, so values checked on an earlier call stay checked. */
#define KERNEL(NAME, TA, TB)                                                                                     \
    FIND(TA, TB)                                                                                                 \
    WORST(TA, TB)                                                                                                \
    REL_EXACT(TA, TB)                                                                                            \
    int FAMILY(NAME)(const TA *a, const TB *b, int64_t n, int64_t base, double atol, double rtol, int check,     \
                     const double *edges, td_partial *out) {                                                     \
        float diff[SUB + 16] __attribute__((aligned(64)));                                                       \
        float edges32[EDGES];                                                                                    \
        for (int i = 0; i < EDGES; i++) edges32[i] = (float)edges[i];                                            \
        const vd vatol = (vd){0} + atol, vrtol = (vd){0} + rtol, zero = {0};                                     \
        lanes_t L;                                                                                               \
        memset(&L, 0, sizeof L);                                                                                 \
        const int64_t rel_before = out->rel_count, nonzero_before = out->nonzero;                                \
        for (int64_t start = 0; start < n; start += SUB) {                                                       \
            int64_t m = n - start < SUB ? n - start : SUB;                                                       \
            int64_t whole = m / LANES * LANES;                                                                   \
            vd top = zero - 1.0, rel = zero, rel_top = zero;                                                     \
            vl nz = {0};                                                                                         \
            const TA *pa = a + start;                                                                            \
            const TB *pb = b + start;                                                                            \
            int64_t j = 0;                                                                                       \
            for (; j < whole; j += LANES) {                                                                      \
                vd va = load_##TA(pa + j), vb = load_##TB(pb + j);                                               \
                STEP(va, vb);                                                                                    \
            }                                                                                                    \
            if (j < m) { /* the last, short vector: zeros after the end add nothing (0 / 0 sends the sub-block's \
                            relative differences to rel_exact, which reads only the real values) */              \
                vd va = zero, vb = zero;                                                                         \
                for (int64_t k = 0; k < m - j; k++) { va[k] = (double)pa[j + k]; vb[k] = (double)pb[j + k]; }    \
                STEP(va, vb);                                                                                    \
                j += LANES;                                                                                      \
            }                                                                                                    \
            for (; j % 16; j++) diff[j] = 0.0f; /* zeros reach no edge */                                        \
            int64_t nonzero = hsuml(nz);                                                                         \
            double sub_top = hmax(top);                                                                          \
            out->nonzero += nonzero;                                                                             \
            histogram(diff, j, (float)sub_top, nonzero, edges32, out->at_least);                                 \
            if (sub_top > out->max_abs) { /* a new largest difference: where it first is */                      \
                int64_t k = find_##TA##_##TB(pa, pb, m, sub_top);                                                \
                if (k >= 0) {                                                                                    \
                    out->max_abs = sub_top;                                                                      \
                    out->argmax = base + start + k;                                                              \
                }                                                                                                \
            }                                                                                                    \
            if (out->top_k > 0 && sub_top > worst_floor(out)) /* some element may be among the worst */          \
                worst_##TA##_##TB(pa, pb, diff, m, j, (float)sub_top, base + start, out);                        \
            double rel_sum = hsum(rel);                                                                          \
            if (rel_sum - rel_sum == 0) { /* every reference non-zero */                                         \
                double t = hmax(rel_top);                                                                        \
                out->sum_rel += rel_sum;                                                                         \
                out->max_rel = t > out->max_rel ? t : out->max_rel;                                              \
                out->rel_count += m;                                                                             \
            } else {                                                                                             \
                rel_exact_##TA##_##TB(pa, pb, m, &out->sum_rel, &out->max_rel, &out->rel_count);                 \
            }                                                                                                    \
        }                                                                                                        \
        out->sum_abs += hsum(L.sum_abs);                                                                         \
        out->sum_sq += hsum(L.sum_sq);                                                                           \
        out->dot += hsum(L.dot);                                                                                 \
        out->norm_a += hsum(L.norm_a);                                                                           \
        out->norm_b += hsum(L.norm_b);                                                                           \
        out->mismatched += hsuml(L.mismatched);                                                                  \
        if (out->norm_a - out->norm_a != 0 || out->norm_b - out->norm_b != 0) return 1; /* NaN, Inf, overflow */ \
        /* a non-zero reference counts a relative difference; with none, a non-zero candidate a difference */    \
        int a_nonzero = out->rel_count > rel_before;                                                             \
        int b_nonzero = a_nonzero ? out->norm_b >= SAFE_LOW || nonzero_##TB(b, n) : out->nonzero > nonzero_before; \
        if (out->sum_sq - out->sum_sq != 0 || (out->sum_sq < SAFE_LOW && out->nonzero > 0) ||                    \
            (out->norm_a < SAFE_LOW && a_nonzero) || (out->norm_b < SAFE_LOW && b_nonzero)) {                    \
            out->norm_a = __builtin_nan(""); /* sums that underflowed: scaled by the numpy path */               \
            return 1;                                                                                            \
        }                                                                                                        \
        return 0;                                                                                                \
    }

KERNEL(td_stats_ff, float, float)
KERNEL(td_stats_fd, float, double)
KERNEL(td_stats_df, double, float)
KERNEL(td_stats_dd, double, double)

/* ---- One tensor's summary (ingest): count, mean, M2, min and max of a block, in double --------------------------
 *
 * Sub-blocks of SUB values: a first pass sums and bounds them, a second sums squared deviations from their mean
 * (still in L1), and Chan et al.'s update merges each into the block's totals, as summary.py merges blocks. A NaN or
 * an Inf reaches the sums, so a block whose sums are not finite (one with a NaN or an Inf, or one that overflowed)
 * returns 1 untouched: the numpy path counts and skips those. */

typedef uint16_t vu16 __attribute__((vector_size(LANES * 2)));
typedef uint32_t vu32 __attribute__((vector_size(LANES * 4)));
#ifdef __FLT16_MAX__ /* _Float16: GCC 12 and clang 15 on x86-64, aarch64; without it, float16 summaries use numpy */
typedef _Float16 vhf __attribute__((vector_size(LANES * 2)));
#endif

INLINE vd load_bf16(const uint16_t *p) {
    vu16 x;
    memcpy(&x, p, sizeof x);
    vu32 wide = __builtin_convertvector(x, vu32) << 16; /* bfloat16 is the top half of a float32 */
    return __builtin_convertvector((vf)wide, vd);
}
#ifdef __FLT16_MAX__
INLINE vd load_f16(const _Float16 *p) {
    vhf x;
    memcpy(&x, p, sizeof x);
    return __builtin_convertvector(__builtin_convertvector(x, vf), vd); /* via float32: F16C converts that */
}
#endif
INLINE double scalar_bf16(const uint16_t *p) {
    uint32_t wide = (uint32_t)*p << 16;
    float f;
    memcpy(&f, &wide, sizeof f);
    return f;
}
#define SCALAR(p) ((double)*(p))

/* ---- A tensor's "fold64" hash (ingest/sketches.py's `content_hash`), alone or with its summary -----------------
 *
 * The bytes as little-endian 64-bit words w_i (i from 1), the last one padded with zero bytes; each mixed with its
 * index in wrapping 64-bit arithmetic, x = w * K1 + i * K2, x ^= x >> 31, x *= K3, x ^= x >> 29 (arithmetic shifts,
 * as torch shifts an int64), and the mixed words summed (wrapping). `first` is the 0-based index of the first word
 * (a tensor hashed in pieces). Little-endian machines only: elsewhere the functions are not built and
 * ingest/sketches.py computes the hash with torch. */

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define TD_FOLD64 1
#define FOLD_K1 0x1F3D5B79A3C1E2F7ULL
#define FOLD_K2 0x2545F4914F6CDD1DULL
#define FOLD_K3 0x3C6EF372FE94F82BULL

typedef uint64_t vu64 __attribute__((vector_size(LANES * 8)));

INLINE uint64_t mix1(uint64_t w, uint64_t i) {
    uint64_t x = w * FOLD_K1 + i * FOLD_K2;
    x ^= (uint64_t)((int64_t)x >> 31);
    x *= FOLD_K3;
    x ^= (uint64_t)((int64_t)x >> 29);
    return x;
}

INLINE uint64_t fold_words(const uint8_t *p, int64_t nbytes, int64_t first) {
    int64_t words = nbytes / 8, whole = words / LANES * LANES, j;
    /* i * K2 kept as a running sum (+ LANES * K2 a step, wrapping: the same words): a 64-bit multiply fewer per
     * vector, which AVX2 has no instruction for (it takes three 32-bit multiplies and shifts) */
    vu64 index_k2 = {0}, sum = {0};
    for (int k = 0; k < LANES; k++) index_k2[k] = (uint64_t)(first + 1 + k) * FOLD_K2;
    const vu64 step_k2 = (vu64){0} + (uint64_t)LANES * FOLD_K2;
    for (j = 0; j < whole; j += LANES) {
        vu64 w;
        memcpy(&w, p + 8 * j, sizeof w);
        vu64 x = w * FOLD_K1 + index_k2;
        x ^= (vu64)((vl)x >> 31);
        x *= FOLD_K3;
        x ^= (vu64)((vl)x >> 29);
        sum += x;
        index_k2 += step_k2;
    }
    uint64_t total = 0;
    for (int k = 0; k < LANES; k++) total += sum[k];
    for (; j < words; j++) {
        uint64_t w;
        memcpy(&w, p + 8 * j, sizeof w);
        total += mix1(w, (uint64_t)(first + 1 + j));
    }
    if (nbytes % 8) { /* the tail word, zero-padded */
        uint64_t w = 0;
        memcpy(&w, p + 8 * words, (size_t)(nbytes % 8));
        total += mix1(w, (uint64_t)(first + 1 + words));
    }
    return total;
}

/* The sum of the mixed words of `nbytes` bytes at `p` (the last word padded), the first word being number `first`. */
uint64_t FAMILY(td_fold64)(const uint8_t *p, int64_t nbytes, int64_t first) { return fold_words(p, nbytes, first); }
#endif

/* The summary kernels: with `fold` (not NULL), the fold64 sum of the values' bytes too, each sub-block folded while it
 * is in L1 (one pass over memory). A block whose sums are not finite returns 1: without `fold` at once, with it
 * once every byte is folded (`*fold` is then set, `out` untouched). */
#define SUMMARY(NAME, T, LOAD, ONE)                                                                              \
    INLINE int NAME##_both(const T *x, int64_t n, td_summary *out, uint64_t *fold) {                            \
        const vd inf = (vd){0} + __builtin_inf();                                                                \
        double count = 0, mean = 0, m2 = 0, lo = __builtin_inf(), hi = -__builtin_inf();                        \
        uint64_t folded = 0;                                                                                     \
        int finite = 1;                                                                                          \
        for (int64_t start = 0; start < n; start += SUB) {                                                       \
            int64_t m = n - start < SUB ? n - start : SUB, whole = m / LANES * LANES, j;                         \
            const T *p = x + start;                                                                              \
            if (!finite) {                                                                                       \
                FOLD_STEP(NAME)                                                                                  \
                continue;                                                                                        \
            }                                                                                                    \
            vd sum = {0}, vlo = inf, vhi = -inf;                                                                 \
            j = 0;                                                                                               \
            FOLD_FUSED(T, LOAD)                                                                                  \
            for (; j < whole; j += LANES) {                                                                      \
                vd v = LOAD(p + j);                                                                              \
                sum += v;                                                                                        \
                vlo = vmin(v, vlo);                                                                              \
                vhi = vmax(v, vhi);                                                                              \
            }                                                                                                    \
            double s = hsum(sum), blo = -hmax(-vlo), bhi = hmax(vhi);                                            \
            for (; j < m; j++) {                                                                                 \
                double v = ONE(p + j);                                                                           \
                s += v;                                                                                          \
                blo = v < blo ? v : blo;                                                                         \
                bhi = v > bhi ? v : bhi;                                                                         \
            }                                                                                                    \
            if (s - s != 0) { /* NaN for a NaN or an infinite sum */                                             \
                if (fold == NULL) return 1;                                                                      \
                finite = 0;                                                                                      \
                continue;                                                                                        \
            }                                                                                                    \
            double mu = s / (double)m;                                                                           \
            vd q = {0};                                                                                          \
            for (j = 0; j < whole; j += LANES) {                                                                 \
                vd d = LOAD(p + j) - mu;                                                                         \
                q += d * d;                                                                                      \
            }                                                                                                    \
            double sq = hsum(q);                                                                                 \
            for (; j < m; j++) {                                                                                 \
                double d = ONE(p + j) - mu;                                                                      \
                sq += d * d;                                                                                     \
            }                                                                                                    \
            double total = count + (double)m, delta = mu - mean;                                                 \
            mean += delta * (double)m / total;                                                                   \
            m2 += sq + delta * delta * count * (double)m / total;                                                \
            count = total;                                                                                       \
            lo = blo < lo ? blo : lo;                                                                            \
            hi = bhi > hi ? bhi : hi;                                                                            \
        }                                                                                                        \
        if (fold != NULL) *fold = folded;                                                                        \
        if (!finite) return 1;                                                                                   \
        if (mean - mean != 0 || m2 - m2 != 0) return 1; /* overflowed */                                          \
        out->count = count;                                                                                      \
        out->mean = mean;                                                                                        \
        out->m2 = m2;                                                                                            \
        out->min = lo;                                                                                           \
        out->max = hi;                                                                                           \
        return 0;                                                                                                \
    }                                                                                                            \
    int FAMILY(JOIN(td_summary, NAME))(const T *x, int64_t n, td_summary *out) {                                \
        return NAME##_both(x, n, out, NULL);                                                                     \
    }                                                                                                            \
    SKETCH_EXPORT(NAME, T)

#ifdef TD_FOLD64
/* SUB values of any dtype here are a whole number of words (SUB * size is a multiple of 8): only the last sub-block
 * may end inside a word. */
#define FOLD_STEP(NAME)                                                                                          \
    if (fold != NULL)                                                                                            \
        folded += fold_words((const uint8_t *)p, m * (int64_t)sizeof *p, start * (int64_t)sizeof *p / 8);
/* With `fold`, the sub-block's sum, minimum and maximum steps (the loop after it, unchanged: the same steps in the
 * same order, so the same floats) taken a vector of words at a time, each vector folded as its values are summed:
 * the sum's additions wait on each other, and the fold's integer work runs between them (the summary of 3.1 MB of
 * float32 in 0.81 of the time of a fold pass before the sum pass, AVX2 on an AMD EPYC: bench/RESULTS.md,
 * 2026-11-28). The words' sum does not depend on their order; the bytes after the last whole vector are folded by
 * `fold_words`. */
#define FOLD_FUSED(T, LOAD)                                                                                      \
    if (fold != NULL) {                                                                                          \
        const int64_t per = LANES * 8 / (int64_t)sizeof(T); /* values in one vector of words: LANES at least */   \
        const int64_t fused = m / per * per;                                                                     \
        const uint64_t word = (uint64_t)(start * (int64_t)sizeof(T) / 8);                                        \
        vu64 index_k2, words_sum = {0};                                                                          \
        for (int k = 0; k < LANES; k++) index_k2[k] = (word + 1 + (uint64_t)k) * FOLD_K2;                        \
        const vu64 step_k2 = (vu64){0} + (uint64_t)LANES * FOLD_K2;                                              \
        for (; j < fused; j += per) {                                                                            \
            for (int64_t i = j; i < j + per; i += LANES) {                                                       \
                vd v = LOAD(p + i);                                                                              \
                sum += v;                                                                                        \
                vlo = vmin(v, vlo);                                                                              \
                vhi = vmax(v, vhi);                                                                              \
            }                                                                                                    \
            vu64 w;                                                                                              \
            memcpy(&w, p + j, sizeof w);                                                                         \
            vu64 f = w * FOLD_K1 + index_k2;                                                                     \
            f ^= (vu64)((vl)f >> 31);                                                                            \
            f *= FOLD_K3;                                                                                        \
            f ^= (vu64)((vl)f >> 29);                                                                            \
            words_sum += f;                                                                                      \
            index_k2 += step_k2;                                                                                 \
        }                                                                                                        \
        for (int k = 0; k < LANES; k++) folded += words_sum[k];                                                  \
        folded += fold_words((const uint8_t *)(p + fused), (m - fused) * (int64_t)sizeof(T),                     \
                             (start + fused) * (int64_t)sizeof(T) / 8);                                          \
    }
/* td_sketch_f(x, n, out, fold): td_summary_f's summary and the fold64 sum of the same values' bytes, in one pass. */
#define SKETCH_EXPORT(NAME, T)                                                                                   \
    int FAMILY(JOIN(td_sketch, NAME))(const T *x, int64_t n, td_summary *out, uint64_t *fold) {                  \
        return NAME##_both(x, n, out, fold);                                                                     \
    }
#else
#define FOLD_STEP(NAME)
#define FOLD_FUSED(T, LOAD)
#define SKETCH_EXPORT(NAME, T)
#endif

SUMMARY(f, float, load_float, SCALAR)
SUMMARY(d, double, load_double, SCALAR)
#ifdef __FLT16_MAX__
SUMMARY(h, _Float16, load_f16, SCALAR)
#endif
SUMMARY(b, uint16_t, load_bf16, scalar_bf16)

/* engine/where.py's `block_masses` of a C-contiguous block of `rows` rows of `last` values a side, float32 or float64:
 * per row, the sum of its squared differences (each side widened to double, then subtracted and squared: numpy's
 * `_squares`) in numpy's order for a contiguous row (`pairwise`, below), into `row_sums`; per column, the sum down the
 * rows in row order, into `down`; `row` is scratch for `last` doubles. Returns 1 where a row's sum is not finite (a
 * square that is not finite, or a row that overflows): the caller then takes numpy's path, which counts those. */
#define PW_BLOCK 128
/* numpy's add.reduce of `n` contiguous doubles from 0 (its DOUBLE_pairwise_sum): under 8 values one after another;
 * up to PW_BLOCK in 8 running sums then the rest; past it, two halves (a multiple of 8 first) summed apart. */
static double pairwise(const double *a, int64_t n) {
    if (n < 8) {
        double res = 0.;
        for (int64_t i = 0; i < n; i++) res += a[i];
        return res;
    }
    if (n <= PW_BLOCK) {
        double r[8];
        int64_t i;
        for (int k = 0; k < 8; k++) r[k] = a[k];
        for (i = 8; i < n - (n % 8); i += 8)
            for (int k = 0; k < 8; k++) r[k] += a[i + k];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pairwise(a, n2) + pairwise(a + n2, n - n2);
}

#define WHERE(NAME, T)                                                                                           \
    int FAMILY(NAME)(const T *a, const T *b, int64_t rows, int64_t last, double *row_sums, double *down,         \
                     double *row) {                                                                              \
        for (int64_t i = 0; i < rows; i++) {                                                                     \
            const T *x = a + i * last, *y = b + i * last;                                                        \
            if (i == 0)                                                                                          \
                for (int64_t j = 0; j < last; j++) {                                                             \
                    double d = (double)x[j] - (double)y[j];                                                      \
                    row[j] = d * d;                                                                              \
                    down[j] = row[j];                                                                            \
                }                                                                                                \
            else                                                                                                 \
                for (int64_t j = 0; j < last; j++) {                                                             \
                    double d = (double)x[j] - (double)y[j];                                                      \
                    row[j] = d * d;                                                                              \
                    down[j] += row[j];                                                                           \
                }                                                                                                \
            double s = pairwise(row, last);                                                                      \
            if (s - s != 0) return 1; /* NaN for a NaN or an infinite sum */                                     \
            row_sums[i] = s;                                                                                     \
        }                                                                                                        \
        return 0;                                                                                                \
    }

WHERE(td_where_ff, float)
WHERE(td_where_dd, double)

#else /* ---- Shared by every family ---------------------------------------------------------------------------- */

/* Whether this CPU runs the family named `name` (compiled for x86-64-v4, -v3, or the baseline). */
int td_family_runs(const char *name) {
    if (strcmp(name, "baseline") == 0) return 1;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
#if defined(__clang__) /* clang 18 and older know no levels: their features, but for movbe and xsave */
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("bmi") &&
             __builtin_cpu_supports("bmi2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("lzcnt");
    int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
#else
    int v3 = __builtin_cpu_supports("x86-64-v3"), v4 = __builtin_cpu_supports("x86-64-v4");
#endif
    if (strcmp(name, "avx2") == 0) return v3 != 0;
    if (strcmp(name, "avx512") == 0) return v4 != 0;
#endif
    return 0;
}

int td_summary_size(void) { return (int)sizeof(td_summary); }

/* The layout of td_partial, so the loader can refuse a library built from another version of this file. */
int td_partial_size(void) { return (int)sizeof(td_partial); }

#endif
