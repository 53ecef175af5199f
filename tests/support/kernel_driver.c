/* Runs one family of a built statistics-kernel library (engine/fused_stats.c) on values from files, or the chunk loop
 * (compare/chunk_loop.c) with that family's pair kernel on chunk files, and prints what it computed, one "name value"
 * line each, for tests/test_kernel_aarch64.py to check against numpy (built for another architecture and run under
 * an emulator there).
 *
 *   kernel_driver LIBRARY FAMILY stats PAIR N ATOL RTOL A B EDGES   (PAIR: ff, fd, df or dd; files of raw values)
 *   kernel_driver LIBRARY FAMILY summary CODE N VALUES                (CODE: f, d, h or b)
 *   kernel_driver LIBRARY FAMILY loop LOOP CODES ATOL RTOL EDGES SIDE SIDE
 *       (LOOP: the chunk-loop library; CODES: each side's stored values, f, d, b or h, say "fb"; each SIDE:
 *        CHUNK_BYTES N and N pieces PATH SKIP COUNT, as compare/chunk_loop.py fills tdc_side)
 *
 * A pair is folded in two calls, the second at a base (as chunk_loop.c folds chunks).
 */

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../server/tensor_debugger/engine/kernel_structs.h" /* the libraries' structures, from their one source */

typedef td_partial partial;
typedef td_summary summary;
typedef tdc_piece piece;
typedef tdc_side side;

typedef int (*stats_fn)(const void *, const void *, int64_t, int64_t, double, double, int, const double *, partial *);
typedef int (*pair_fn)(side *, side *, stats_fn, double, double, int, const double *, partial *, int *, int64_t *);
typedef int (*summary_fn)(const void *, int64_t, summary *);
typedef int (*size_fn)(void);

static void *symbol(void *library, const char *name) {
    void *found = dlsym(library, name);
    if (found == NULL) {
        fprintf(stderr, "no %s in the library\n", name);
        exit(2);
    }
    return found;
}

static void *read_all(const char *path, size_t bytes) {
    FILE *f = fopen(path, "rb");
    void *data = malloc(bytes ? bytes : 1);
    if (f == NULL || data == NULL || fread(data, 1, bytes, f) != bytes) {
        fprintf(stderr, "cannot read %zu bytes of %s\n", bytes, path);
        exit(2);
    }
    fclose(f);
    return data;
}

static size_t width(char code) { return code == 'd' ? 8 : code == 'f' ? 4 : 2; }

static void *open_library(const char *path) {
    void *library = dlopen(path, RTLD_NOW);
    if (library == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        exit(2);
    }
    return library;
}

static void print_partial(const partial *out) {
    printf("max_abs %.17g\nargmax %" PRId64 "\nsum_abs %.17g\nsum_sq %.17g\nsum_rel %.17g\nmax_rel %.17g\n",
           out->max_abs, out->argmax, out->sum_abs, out->sum_sq, out->sum_rel, out->max_rel);
    printf("rel_count %" PRId64 "\ndot %.17g\nnorm_a %.17g\nnorm_b %.17g\nmismatched %" PRId64 "\n",
           out->rel_count, out->dot, out->norm_a, out->norm_b, out->mismatched);
    printf("nonzero %" PRId64 "\nat_least", out->nonzero);
    for (int i = 0; i < TD_EDGES; i++) printf(" %" PRId64, out->at_least[i]);
    printf("\n");
}

/* One side from argv[*at]: CHUNK_BYTES N, then N pieces PATH SKIP COUNT; *at moves past it. */
static side read_side(int argc, char **argv, int *at, char code) {
    side s = {0};
    if (*at + 2 > argc) exit(2);
    s.chunk_bytes = strtoll(argv[*at], NULL, 10);
    s.n = strtoll(argv[*at + 1], NULL, 10);
    *at += 2;
    if (s.n < 0 || *at + 3 * s.n > argc) exit(2);
    piece *pieces = calloc((size_t)s.n + 1, sizeof *pieces);
    for (int64_t p = 0; p < s.n; p++, *at += 3) {
        pieces[p].path = argv[*at];
        pieces[p].skip = strtoll(argv[*at + 1], NULL, 10);
        pieces[p].count = strtoll(argv[*at + 2], NULL, 10);
    }
    s.pieces = pieces;
    s.code = code;
    s.compressed = malloc((size_t)s.chunk_bytes + 16); /* BLOSC_HEADER */
    s.decoded = malloc((size_t)s.chunk_bytes);
    s.widened = malloc(2 * (size_t)s.chunk_bytes); /* 2-byte values as float32 */
    if (pieces == NULL || s.compressed == NULL || s.decoded == NULL || s.widened == NULL) exit(2);
    return s;
}

/* The chunk loop over two sides' chunk files with FAMILY's pair kernel for the widened values (float64 stays,
 * the rest are float32), as compare/chunk_loop.py calls it. */
static int loop(void *library, const char *family, int argc, char **argv) {
    void *chunks = open_library(argv[4]);
    const char *codes = argv[5];
    if (strlen(codes) != 2) return 2;
    if (((size_fn)symbol(library, "td_partial_size"))() != (int)sizeof(partial)) return 3;
    if (((size_fn)symbol(chunks, "tdc_side_size"))() != (int)sizeof(side)) return 3;
    char name[64];
    snprintf(name, sizeof name, "td_stats_%c%c_%s", codes[0] == 'd' ? 'd' : 'f', codes[1] == 'd' ? 'd' : 'f', family);
    stats_fn kernel = (stats_fn)symbol(library, name);
    double atol = strtod(argv[6], NULL), rtol = strtod(argv[7], NULL);
    const double *edges = read_all(argv[8], TD_EDGES * sizeof(double));
    int at = 9;
    side a = read_side(argc, argv, &at, codes[0]);
    side b = read_side(argc, argv, &at, codes[1]);
    if (at != argc) return 2;
    partial out = {0};
    out.max_abs = -1;
    out.argmax = -1;
    int failed_side = 0;
    int64_t failed_piece = -1;
    int status = ((pair_fn)symbol(chunks, "tdc_pair"))(&a, &b, kernel, atol, rtol, 1, edges, &out, &failed_side,
                                                       &failed_piece);
    printf("float16 %d\n", ((int (*)(void))symbol(chunks, "tdc_float16"))());
    printf("returned %d %c %" PRId64 "\n", status, failed_side ? failed_side : '-', failed_piece);
    print_partial(&out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: see kernel_driver.c\n");
        return 2;
    }
    void *library = open_library(argv[1]);
    const char *family = argv[2], *what = argv[3], *code = argv[4];
    printf("runs %d\n", ((int (*)(const char *))symbol(library, "td_family_runs"))(family));
    if (strcmp(what, "loop") == 0 && argc >= 13) return loop(library, family, argc, argv);
    int64_t n = strtoll(argv[5], NULL, 10);
    char name[64];
    if (strcmp(what, "stats") == 0 && argc == 11) {
        if (((size_fn)symbol(library, "td_partial_size"))() != (int)sizeof(partial)) return 3;
        snprintf(name, sizeof name, "td_stats_%s_%s", code, family);
        stats_fn stats = (stats_fn)symbol(library, name);
        double atol = strtod(argv[6], NULL), rtol = strtod(argv[7], NULL);
        const char *a = read_all(argv[8], (size_t)n * width(code[0]));
        const char *b = read_all(argv[9], (size_t)n * width(code[1]));
        const double *edges = read_all(argv[10], TD_EDGES * sizeof(double));
        partial out = {0};
        out.max_abs = -1;
        out.argmax = -1;
        int64_t half = n / 2;
        int code_first = stats(a, b, half, 0, atol, rtol, 1, edges, &out);
        int code_second = stats(a + half * width(code[0]), b + half * width(code[1]), n - half, half, atol, rtol, 1,
                                edges, &out);
        printf("returned %d %d\n", code_first, code_second);
        print_partial(&out);
        return 0;
    }
    if (strcmp(what, "summary") == 0 && argc == 7) {
        if (((size_fn)symbol(library, "td_summary_size"))() != (int)sizeof(summary)) return 3;
        snprintf(name, sizeof name, "td_summary_%s_%s", code, family);
        summary out = {0};
        int refused = ((summary_fn)symbol(library, name))(read_all(argv[6], (size_t)n * width(code[0])), n, &out);
        printf("returned %d\ncount %.17g\nmean %.17g\nm2 %.17g\nmin %.17g\nmax %.17g\n", refused, out.count,
               out.mean, out.m2, out.min, out.max);
        return 0;
    }
    fprintf(stderr, "usage: see kernel_driver.c\n");
    return 2;
}
