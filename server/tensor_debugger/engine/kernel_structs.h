/* The structures the compiled code shares with Python: one list of fields per structure, the only place their
 * layouts are written. fused_stats.c, compare/chunk_loop.c and the tests' C driver declare the structures from
 * these lists (TD_STRUCT below); engine/layouts.py declares the matching ctypes structures, which
 * tests/engine/test_kernel_structs.py checks against these lists (and the compiler's offsets), and the libraries'
 * *_size() functions are checked against them when they load. A change here needs the same change there.
 *
 * Each list names its fields as FIELD(C type, name) or ARRAY(C type, name, count); a type is one of those
 * layouts.py maps (double, int64_t, int, pointers). Comments stay outside the lists. */

#ifndef TD_KERNEL_STRUCTS_H
#define TD_KERNEL_STRUCTS_H

#include <stdint.h>

#define TD_EDGES 16 /* histogram edges: |a - b| >= 1e-12, 1e-11, ..., 1e3 */
#define TD_TOP 64   /* the most worst elements a partial keeps */

/* One block's statistics of a pair (fused_stats.c): the largest |a - b| (-1 when empty) and its first flat
 * position; sums of |a - b| and (a - b)^2; of |a - b| / |a| where a != 0, their largest and how many; the dot
 * product and both norms; elements outside the tolerance; elements that differ; and per histogram edge, the
 * elements whose |a - b| is at least the edge. Then the worst elements: top_k (set by the caller, 0 to TD_TOP) is how
 * many to keep, top_n how many are kept: a heap of the largest |a - b| above zero (the smallest at 0; on ties, the
 * later position is the smaller), with each one's flat position and both values. */
#define TD_PARTIAL_FIELDS(FIELD, ARRAY)                                                                           \
    FIELD(double, max_abs)                                                                                       \
    FIELD(int64_t, argmax)                                                                                       \
    FIELD(double, sum_abs)                                                                                       \
    FIELD(double, sum_sq)                                                                                        \
    FIELD(double, sum_rel)                                                                                       \
    FIELD(double, max_rel)                                                                                       \
    FIELD(int64_t, rel_count)                                                                                    \
    FIELD(double, dot)                                                                                           \
    FIELD(double, norm_a)                                                                                        \
    FIELD(double, norm_b)                                                                                        \
    FIELD(int64_t, mismatched)                                                                                   \
    FIELD(int64_t, nonzero)                                                                                      \
    ARRAY(int64_t, at_least, TD_EDGES)                                                                          \
    FIELD(int64_t, top_k)                                                                                        \
    FIELD(int64_t, top_n)                                                                                        \
    ARRAY(double, top_abs, TD_TOP)                                                                               \
    ARRAY(int64_t, top_at, TD_TOP)                                                                               \
    ARRAY(double, top_a, TD_TOP)                                                                                 \
    ARRAY(double, top_b, TD_TOP)

/* One block's finite values (fused_stats.c's summary kernels): count, mean, sum of squared deviations, min, max. */
#define TD_SUMMARY_FIELDS(FIELD, ARRAY)                                                                           \
    FIELD(double, count)                                                                                         \
    FIELD(double, mean)                                                                                          \
    FIELD(double, m2)                                                                                            \
    FIELD(double, min)                                                                                           \
    FIELD(double, max)

/* A stretch of one chunk (compare/chunk_loop.c): its file (or, for a chunk in memory, its name), the values of the
 * decoded chunk before the stretch, and the values in it; then, for a chunk fetched from object storage, its bytes
 * as stored and how many (NULL: read the file). */
#define TDC_PIECE_FIELDS(FIELD, ARRAY)                                                                            \
    FIELD(const char *, path)                                                                                    \
    FIELD(int64_t, skip)                                                                                         \
    FIELD(int64_t, count)                                                                                        \
    FIELD(const uint8_t *, bytes)                                                                                \
    FIELD(int64_t, size)

/* One side of a block (compare/chunk_loop.c): its pieces and how many; the decoded size of one whole chunk; the
 * stored values' letter ('f' float32, 'd' float64, 'b' bfloat16 bits, 'h' float16); whether its chunk files are
 * raw values (1) or Blosc frames (0); and the thread's buffers for a chunk's compressed bytes (chunk_bytes + 16),
 * its values (chunk_bytes) and them widened to float32. */
#define TDC_SIDE_FIELDS(FIELD, ARRAY)                                                                             \
    FIELD(const tdc_piece *, pieces)                                                                             \
    FIELD(int64_t, n)                                                                                            \
    FIELD(int64_t, chunk_bytes)                                                                                  \
    FIELD(int, code)                                                                                             \
    FIELD(int, raw)                                                                                              \
    FIELD(uint8_t *, compressed)                                                                                 \
    FIELD(uint8_t *, decoded)                                                                                    \
    FIELD(float *, widened)

#define TD_DECLARE_FIELD(type, name) type name;
#define TD_DECLARE_ARRAY(type, name, count) type name[count];
#define TD_STRUCT(LIST) { LIST(TD_DECLARE_FIELD, TD_DECLARE_ARRAY) }

typedef struct TD_STRUCT(TD_PARTIAL_FIELDS) td_partial;
typedef struct TD_STRUCT(TD_SUMMARY_FIELDS) td_summary;
typedef struct TD_STRUCT(TDC_PIECE_FIELDS) tdc_piece;
typedef struct TD_STRUCT(TDC_SIDE_FIELDS) tdc_side;

#endif
