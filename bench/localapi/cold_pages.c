/* What touching memory costs after the core slept: one byte read from each of PAGES
 * 4 KiB pages, right after the last pass (warm) and after a sleep of GAP_US
 * (cold), in memory backed by 4 KiB pages and by a transparent huge page; the second
 * pass right after a cold one too.  Prints one JSON line of medians, microseconds.
 *
 *     cold_pages [GAP_US [ROUNDS]]
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PAGES 256
#define PAGE 4096
#define HUGE (2UL << 20)
#define MAX_ROUNDS 1000

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *values, int count) {
    qsort(values, (size_t)count, sizeof *values, by_value);
    return values[count / 2];
}

static volatile long sink;

static double touch(const volatile char *memory) {
    double started = now_us();
    long sum = 0;
    for (size_t page = 0; page < PAGES; page++) sum += memory[page * PAGE];
    sink = sum;
    return now_us() - started;
}

/* medians of (first pass, second pass) with `gap_us` of sleep before each round */
static void measure(const volatile char *memory, unsigned gap_us, int rounds, double *first,
                    double *second) {
    static double firsts[MAX_ROUNDS], seconds[MAX_ROUNDS];
    for (int round = 0; round < rounds; round++) {
        if (gap_us) usleep(gap_us);
        firsts[round] = touch(memory);
        seconds[round] = touch(memory);
    }
    *first = median(firsts, rounds);
    *second = median(seconds, rounds);
}

/* 2 MiB aligned inside a 4 MiB mapping, so that a huge page can back it */
static char *mapping(int huge) {
    char *raw = mmap(NULL, 2 * HUGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return NULL;
    char *aligned = (char *)(((unsigned long)raw + HUGE - 1) & ~(HUGE - 1));
    if (madvise(aligned, HUGE, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE) != 0 && huge) return NULL;
    memset(aligned, 1, HUGE);
    return aligned;
}

/* kB of anonymous memory the kernel backs with huge pages, from smaps_rollup */
static long anon_huge_kb(void) {
    FILE *smaps = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kb = -1;
    if (smaps == NULL) return -1;
    while (fgets(line, sizeof line, smaps))
        if (sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) break;
    fclose(smaps);
    return kb;
}

int main(int argc, char **argv) {
    unsigned gap_us = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : 50000;
    int rounds = argc > 2 ? atoi(argv[2]) : 40;
    if (rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr, "rounds must be 1..%d\n", MAX_ROUNDS);
        return 2;
    }
    char *small = mapping(0), *huge = mapping(1);
    if (small == NULL || huge == NULL) {
        perror("mmap/madvise");
        return 1;
    }
    double warm_small, warm_small2, cold_small, cold_small2, warm_huge, warm_huge2, cold_huge,
        cold_huge2;
    measure(small, 0, rounds, &warm_small, &warm_small2);
    measure(small, gap_us, rounds, &cold_small, &cold_small2);
    measure(huge, 0, rounds, &warm_huge, &warm_huge2);
    measure(huge, gap_us, rounds, &cold_huge, &cold_huge2);
    printf("{\"pages\": %d, \"gap_us\": %u, \"rounds\": %d, "
           "\"small_warm_us\": %.1f, \"small_cold_us\": %.1f, \"small_cold_second_us\": %.1f, "
           "\"huge_warm_us\": %.1f, \"huge_cold_us\": %.1f, \"huge_cold_second_us\": %.1f, "
           "\"anon_huge_kb\": %ld}\n",
           PAGES, gap_us, rounds, warm_small, cold_small, cold_small2, warm_huge, cold_huge,
           cold_huge2, anon_huge_kb());
    (void)warm_small2;
    (void)warm_huge2;
    return 0;
}
