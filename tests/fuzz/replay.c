/*
 * replay.c - the main() of the corpus replay runners (any compiler, no
 * libFuzzer): feeds every file named on the command line, or found in a
 * directory named there, to LLVMFuzzerTestOneInput once. An invariant that
 * fails aborts, so the meson test fails. No input found is an error too (a
 * replay of nothing proves nothing).
 */
#include "fuzz.h"

#include <dirent.h>
#include <sys/stat.h>

static size_t replay_file(const char *path)
{
    FILE    *f = fopen(path, "rb");
    uint8_t *buf;
    long     len;

    if (f == NULL || fseek(f, 0, SEEK_END) != 0 || (len = ftell(f)) < 0 ||
        fseek(f, 0, SEEK_SET) != 0) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        exit(2);
    }
    buf = malloc((size_t)len + 1);
    if (buf == NULL || fread(buf, 1, (size_t)len, f) != (size_t)len) {
        fprintf(stderr, "replay: cannot read %s\n", path);
        exit(2);
    }
    fclose(f);
    LLVMFuzzerTestOneInput(buf, (size_t)len);
    free(buf);
    return 1;
}

static int replay_name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static size_t replay_dir(const char *dir)
{
    DIR           *d = opendir(dir);
    struct dirent *e;
    char         **names = NULL;
    size_t         n = 0, cap = 0, done = 0;

    if (d == NULL) {
        fprintf(stderr, "replay: cannot open %s\n", dir);
        exit(2);
    }
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') {
            continue;
        }
        if (n == cap) {
            cap   = cap ? cap * 2 : 64;
            names = realloc(names, cap * sizeof(*names));
            if (names == NULL) {
                abort();
            }
        }
        names[n] = malloc(strlen(dir) + strlen(e->d_name) + 2);
        if (names[n] == NULL) {
            abort();
        }
        sprintf(names[n], "%s/%s", dir, e->d_name);
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof(*names), replay_name_cmp);
    for (size_t i = 0; i < n; i++) {
        done += replay_file(names[i]);
        free(names[i]);
    }
    free(names);
    return done;
}

int main(int argc, char **argv)
{
    size_t total = 0;

    for (int i = 1; i < argc; i++) {
        struct stat st;

        if (stat(argv[i], &st) != 0) {
            fprintf(stderr, "replay: %s: not found\n", argv[i]);
            return 2;
        }
        total += S_ISDIR(st.st_mode) ? replay_dir(argv[i])
                                     : replay_file(argv[i]);
    }
    printf("replayed %zu inputs, every invariant held\n", total);
    if (total == 0) {
        fprintf(stderr, "replay: no input found\n");
        return 2;
    }
    return 0;
}
