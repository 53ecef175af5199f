/* A block of a pair compared chunk by chunk, in one call without the GIL: each side's chunk files read, Blosc-decoded
 * into a buffer that stays in cache, narrow floats widened, and the statistics kernel (engine/fused_stats.c, handed
 * in as a function pointer) folded over the stretch where both sides' chunks overlap.
 *
 * Decoding into the same small buffers, chunk after chunk, and reducing while the values are still in cache does
 * the work of ChunkReader (which decodes whole blocks into fresh arrays) plus the kernel's in less CPU time, with no
 * Python between chunks (measured in a prototype on 2 x 1 GiB of float32, 2 threads: 2.3 GB per CPU-second, 1.8
 * reading arrays first; README, Performance, has the benchmark's figures).
 *
 * Chunks are decoded by C-Blosc2's public API (blosc2_create_dctx, blosc2_decompress_ctx), which reads the Blosc 1
 * frames numcodecs writes. The build links C-Blosc2 in statically, from the libblosc2.a and headers that the blosc2
 * package ships for other programs to build against (a build requirement in pyproject.toml; nothing of it is needed
 * at run time). A side stored raw (no compressor) has its chunk files read straight into the values' buffer. A piece
 * may instead carry its chunk's bytes in memory (fetched from object storage by store/object_chunks.py), decoded
 * from there with the same checks (a raw chunk's bytes are read in place). A chunk
 * that is missing, short, or not one Blosc frame of one chunk stops the call with a code,
 * as does a NaN or an Inf (whose block only the numpy path counts); the caller then reads the block the ordinary
 * way, which fills missing chunks, names the broken file and counts NaN.
 */

#include <blosc2.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../engine/kernel_structs.h" /* tdc_piece and tdc_side, shared with engine/layouts.py */

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

enum { TDC_OK = 0, TDC_MISSING = 1, TDC_IO = 2, TDC_NOT_A_CHUNK = 3, TDC_DECODE = 4, TDC_DTYPE = 5,
       TDC_NOT_FINITE = 6 };
#define BLOSC_HEADER 16 /* c-blosc 1: version, versionlz, flags, typesize, nbytes, blocksize, cbytes */


/* One C-Blosc2 decompression context per thread (a context is not thread-safe; the library's global one takes a
 * lock), freed when its thread ends. */
static pthread_key_t context_key;
static pthread_once_t context_once = PTHREAD_ONCE_INIT;
static void drop_context(void *context) { blosc2_free_ctx((blosc2_context *)context); }
static void make_context_key(void) {
    blosc2_init(); /* idempotent */
    (void)pthread_key_create(&context_key, drop_context);
}

static blosc2_context *thread_context(void) {
    (void)pthread_once(&context_once, make_context_key);
    blosc2_context *context = (blosc2_context *)pthread_getspecific(context_key);
    if (context == NULL) {
        blosc2_dparams dparams = BLOSC2_DPARAMS_DEFAULTS; /* one internal thread: the caller's threads do the rest */
        context = blosc2_create_dctx(dparams);
        if (context != NULL && pthread_setspecific(context_key, context) != 0) {
            blosc2_free_ctx(context);
            context = NULL;
        }
    }
    return context;
}
typedef int (*tdc_kernel)(const void *a, const void *b, int64_t n, int64_t base, double atol, double rtol, int check,
                          const double *edges, void *out);

static int read_file(const char *path, uint8_t *into, int64_t minimum, int64_t capacity, int64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? TDC_MISSING : TDC_IO;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return TDC_IO;
    }
    if (st.st_size < minimum || st.st_size > capacity) {
        close(fd);
        return TDC_NOT_A_CHUNK;
    }
    int64_t done = 0;
    while (done < st.st_size) {
        ssize_t got = read(fd, into + done, (size_t)(st.st_size - done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            close(fd);
            return TDC_IO;
        }
        done += got;
    }
    close(fd);
    *size = done;
    return TDC_OK;
}

static uint32_t le32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Whether `size` bytes, starting with `frame`, are one Blosc frame of one chunk of `side`: the frame must say it
 * holds exactly one chunk and be exactly as long as the bytes (Blosc 1 takes the compressed length from the header,
 * so a short file is refused here). */
static int one_frame(const tdc_side *side, const uint8_t *frame, int64_t size) {
    return size >= BLOSC_HEADER && (int64_t)le32(frame + 4) == side->chunk_bytes && (int64_t)le32(frame + 12) == size;
}

static int decompress(tdc_side *side, const uint8_t *frame, int64_t size) {
    blosc2_context *context = thread_context();
    if (context == NULL ||
        blosc2_decompress_ctx(context, frame, (int32_t)size, side->decoded, (int32_t)side->chunk_bytes)
            != side->chunk_bytes)
        return TDC_DECODE;
    return TDC_OK;
}

/* The chunk of `piece` decoded: *values points at its values (side->decoded, or a raw chunk's bytes in memory). */
static int decode_chunk(tdc_side *side, const tdc_piece *piece, const uint8_t **values) {
    int64_t size = 0;
    *values = side->decoded;
    if (piece->bytes != NULL) { /* fetched: the object's bytes, as a file would hold them */
        size = piece->size;
        if (side->raw) {
            if (size != side->chunk_bytes) return TDC_NOT_A_CHUNK;
            if ((uintptr_t)piece->bytes % sizeof(double) == 0) *values = piece->bytes; /* in place */
            else memcpy(side->decoded, piece->bytes, (size_t)size); /* the kernel reads aligned values */
            return TDC_OK;
        }
        return one_frame(side, piece->bytes, size) ? decompress(side, piece->bytes, size) : TDC_NOT_A_CHUNK;
    }
    if (side->raw) /* the file is the chunk's values: exactly one chunk long */
        return read_file(piece->path, side->decoded, side->chunk_bytes, side->chunk_bytes, &size);
    int status = read_file(piece->path, side->compressed, BLOSC_HEADER, side->chunk_bytes + BLOSC_HEADER, &size);
    if (status != TDC_OK) return status;
    return one_frame(side, side->compressed, size) ? decompress(side, side->compressed, size) : TDC_NOT_A_CHUNK;
}

CLONES static void widen_bf16(const uint16_t *from, float *to, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)from[i] << 16; /* bfloat16 is the top half of a float32 */
        memcpy(to + i, &bits, sizeof bits);
    }
}

#ifdef __FLT16_MAX__
typedef _Float16 vh16 __attribute__((vector_size(32)));
typedef float vf16 __attribute__((vector_size(64)));
CLONES static void widen_f16(const _Float16 *from, float *to, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) { /* sixteen at a time: F16C or AVX-512 converts them, not a call per value */
        vh16 x;
        memcpy(&x, from + i, sizeof x);
        vf16 y = __builtin_convertvector(x, vf16);
        memcpy(to + i, &y, sizeof y);
    }
    for (; i < n; i++) to[i] = (float)from[i];
}
#endif

/* The values of piece `p` of `side` as the kernel reads them (float32 or float64), decoded and widened. */
static int load_piece(tdc_side *side, int64_t p, const void **values) {
    const tdc_piece *piece = side->pieces + p;
    const uint8_t *decoded = NULL;
    int status = decode_chunk(side, piece, &decoded);
    if (status != TDC_OK) return status;
    switch (side->code) {
    case 'f': *values = (const float *)decoded + piece->skip; return TDC_OK;
    case 'd': *values = (const double *)decoded + piece->skip; return TDC_OK;
    case 'b':
        widen_bf16((const uint16_t *)decoded + piece->skip, side->widened, piece->count);
        *values = side->widened;
        return TDC_OK;
#ifdef __FLT16_MAX__
    case 'h':
        widen_f16((const _Float16 *)decoded + piece->skip, side->widened, piece->count);
        *values = side->widened;
        return TDC_OK;
#endif
    default: return TDC_DTYPE;
    }
}

static int64_t width(int code) { return code == 'd' ? 8 : 4; } /* bytes of a value as the kernel reads it */

/* Once `*left` values of the current piece are used up, load `side`'s next piece: TDC_OK (with *values, *left),
 * -1 past the last piece, or a TDC_ code. */
static int next_piece(tdc_side *side, int64_t *p, const void **values, int64_t *left) {
    if (*left != 0) return TDC_OK;
    if (++*p == side->n) return -1;
    int status = load_piece(side, *p, values);
    if (status == TDC_OK) *left = side->pieces[*p].count;
    return status;
}

/* Fold the block whose values are `a`'s pieces, in order, against `b`'s (both hold the same number of values) into
 * `out` (a reset td_partial): the pieces are merged like two sorted lists, one kernel call per overlap. Returns 0,
 * or a TDC_ code with the failing piece's side ('a' or 'b', 0 for a NaN or an Inf) and index in *failed_side and
 * *failed_piece. */
int tdc_pair(tdc_side *a, tdc_side *b, tdc_kernel kernel, double atol, double rtol,
             int check, const double *edges, void *out, int *failed_side, int64_t *failed_piece) {
    const void *va = 0, *vb = 0;
    int64_t pa = -1, pb = -1, left_a = 0, left_b = 0, done = 0;
    for (;;) {
        int status_a = next_piece(a, &pa, &va, &left_a);
        int status_b = status_a == TDC_OK ? next_piece(b, &pb, &vb, &left_b) : TDC_OK;
        if (status_a == -1 || status_b == -1) break;
        if (status_a != TDC_OK || status_b != TDC_OK) {
            *failed_side = status_a != TDC_OK ? 'a' : 'b';
            *failed_piece = status_a != TDC_OK ? pa : pb;
            return status_a != TDC_OK ? status_a : status_b;
        }
        int64_t m = left_a < left_b ? left_a : left_b;
        const uint8_t *xa = (const uint8_t *)va + (a->pieces[pa].count - left_a) * width(a->code);
        const uint8_t *xb = (const uint8_t *)vb + (b->pieces[pb].count - left_b) * width(b->code);
        if (kernel(xa, xb, m, done, atol, rtol, check, edges, out) != 0) { /* a NaN or an Inf: read no more */
            *failed_side = 0;
            *failed_piece = -1;
            return TDC_NOT_FINITE;
        }
        done += m;
        left_a -= m;
        left_b -= m;
    }
    return TDC_OK;
}

/* Read and decode every piece of `side`, nothing else: the benchmark's measure of the store's raw read speed. */
int tdc_read(tdc_side *side, int64_t *failed_piece) {
    for (int64_t p = 0; p < side->n; p++) {
        const uint8_t *values = NULL;
        int status = decode_chunk(side, side->pieces + p, &values);
        if (status != TDC_OK) {
            *failed_piece = p;
            return status;
        }
    }
    return TDC_OK;
}

/* Whether 'h' (float16) pieces are widened here: only where the compiler has _Float16. */
int tdc_float16(void) {
#ifdef __FLT16_MAX__
    return 1;
#else
    return 0;
#endif
}

int tdc_side_size(void) { return (int)sizeof(tdc_side); }
