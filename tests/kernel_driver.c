/* Runs one family of a built statistics-kernel library (engine/fused_stats.c) on values from files and prints what
 * it computed, one "name value" line each, for tests/test_kernel_aarch64.py to check against numpy (built for
 * another architecture and run under an emulator there).
 *
 *   kernel_driver LIBRARY FAMILY stats PAIR N ATOL RTOL A B EDGES   (PAIR: ff, fd, df or dd; files of raw values)
 *   kernel_driver LIBRARY FAMILY summary CODE N VALUES                (CODE: f, d, h or b)
 *
 * A pair is folded in two calls, the second at a base (as chunk_pairs.c folds chunks).
 */

#include <dlfcn.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { /* td_partial, checked against td_partial_size() */
    double max_abs;
    int64_t argmax;
    double sum_abs, sum_sq, sum_rel, max_rel;
    int64_t rel_count;
    double dot, norm_a, norm_b;
    int64_t mismatched, nonzero, at_least[16];
} partial;

typedef struct { /* td_summary, checked against td_summary_size() */
    double count, mean, m2, min, max;
} summary;

typedef int (*stats_fn)(const void *, const void *, int64_t, int64_t, double, double, int, const double *, partial *);
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

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: see kernel_driver.c\n");
        return 2;
    }
    void *library = dlopen(argv[1], RTLD_NOW);
    if (library == NULL) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    const char *family = argv[2], *what = argv[3], *code = argv[4];
    int64_t n = strtoll(argv[5], NULL, 10);
    char name[64];
    printf("runs %d\n", ((int (*)(const char *))symbol(library, "td_family_runs"))(family));
    if (strcmp(what, "stats") == 0 && argc == 11) {
        if (((size_fn)symbol(library, "td_partial_size"))() != (int)sizeof(partial)) return 3;
        snprintf(name, sizeof name, "td_stats_%s_%s", code, family);
        stats_fn stats = (stats_fn)symbol(library, name);
        double atol = strtod(argv[6], NULL), rtol = strtod(argv[7], NULL);
        const char *a = read_all(argv[8], (size_t)n * width(code[0]));
        const char *b = read_all(argv[9], (size_t)n * width(code[1]));
        const double *edges = read_all(argv[10], 16 * sizeof(double));
        partial out = {0};
        out.max_abs = -1;
        out.argmax = -1;
        int64_t half = n / 2;
        int code_first = stats(a, b, half, 0, atol, rtol, 1, edges, &out);
        int code_second = stats(a + half * width(code[0]), b + half * width(code[1]), n - half, half, atol, rtol, 1,
                                edges, &out);
        printf("returned %d %d\n", code_first, code_second);
        printf("max_abs %.17g\nargmax %" PRId64 "\nsum_abs %.17g\nsum_sq %.17g\nsum_rel %.17g\nmax_rel %.17g\n",
               out.max_abs, out.argmax, out.sum_abs, out.sum_sq, out.sum_rel, out.max_rel);
        printf("rel_count %" PRId64 "\ndot %.17g\nnorm_a %.17g\nnorm_b %.17g\nmismatched %" PRId64 "\n",
               out.rel_count, out.dot, out.norm_a, out.norm_b, out.mismatched);
        printf("nonzero %" PRId64 "\nat_least", out.nonzero);
        for (int i = 0; i < 16; i++) printf(" %" PRId64, out.at_least[i]);
        printf("\n");
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
