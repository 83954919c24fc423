/* A synthetic game for the CPU-share benchmark (benchmarks/cpu_share.py).
 *
 *   game calibrate                      -> prints the work units one thread does in 1 ms
 *   game run THREADS UNITS CAPPED SECONDS
 *
 * Every frame each of THREADS threads does UNITS units of integer work (a dependent
 * multiply-add chain the compiler cannot shorten), and the frame ends when all of them are
 * done, as a game's job system joins its workers before it presents. CAPPED = 1: the frame
 * then sleeps until its 16.7 ms slot ends (a game capped at 60 frames a second); a frame
 * whose work overruns its slot starts the next one at once. CAPPED = 0: the next frame
 * starts at once (an uncapped game keeps its cores busy). Prints one line: the frame work
 * times in microseconds, space-separated. SIGTERM ends a run early (its frames printed).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FRAME_NS 16666667LL
#define MAX_THREADS 16
#define MAX_FRAMES 100000

static volatile uint64_t sink[MAX_THREADS * 8];
static pthread_barrier_t start_barrier, end_barrier;
static int n_threads;
static long long units;
static volatile int running = 1;
static volatile sig_atomic_t stop_requested = 0;

static void on_term(int sig) { (void)sig; stop_requested = 1; }

static long long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static uint64_t work(long long n, uint64_t x) {
    for (long long i = 0; i < n; i++) {
        for (int k = 0; k < 64; k++) x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    }
    return x;
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t x = (uint64_t)id + 1;
    for (;;) {
        pthread_barrier_wait(&start_barrier);
        if (!running) return NULL;
        x = work(units, x);
        sink[id * 8] = x;
        pthread_barrier_wait(&end_barrier);
    }
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "calibrate") == 0) {
        long long n = 1000, best = 0;
        for (;;) {                       /* grow until one pass takes 50 ms */
            long long t0 = now_ns();
            sink[0] = work(n, 7);
            long long dt = now_ns() - t0;
            if (dt > 50000000LL) { best = n * 1000000LL / dt; break; }
            n *= 2;
        }
        long long top = 0;               /* the fastest of five 50 ms passes */
        for (int r = 0; r < 5; r++) {
            long long t0 = now_ns();
            sink[0] = work(best * 50, 7);
            long long per_ms = best * 50 * 1000000LL / (now_ns() - t0);
            if (per_ms > top) top = per_ms;
        }
        printf("%lld\n", top);
        return 0;
    }
    if (argc != 6 || strcmp(argv[1], "run") != 0) {
        fprintf(stderr, "usage: game calibrate | game run THREADS UNITS CAPPED SECONDS\n");
        return 2;
    }
    n_threads = atoi(argv[2]);
    units = atoll(argv[3]);
    int capped = atoi(argv[4]);
    double seconds = atof(argv[5]);
    if (n_threads < 1 || n_threads > MAX_THREADS || units < 1 || seconds <= 0) {
        fprintf(stderr, "game: THREADS must be 1..%d, UNITS and SECONDS positive\n", MAX_THREADS);
        return 2;
    }
    signal(SIGTERM, on_term);           /* SIGTERM ends the run early, frames printed */
    pthread_barrier_init(&start_barrier, NULL, (unsigned)n_threads);
    pthread_barrier_init(&end_barrier, NULL, (unsigned)n_threads);
    pthread_t th[MAX_THREADS];
    for (int i = 1; i < n_threads; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
    static long long times[MAX_FRAMES];
    int frames = 0;
    uint64_t x = 99;
    long long begin = now_ns(), slot = begin;
    long long end = begin + (long long)(seconds * 1e9);
    while (frames < MAX_FRAMES) {
        long long t0 = now_ns();
        if (t0 >= end || stop_requested) break;
        pthread_barrier_wait(&start_barrier);
        x = work(units, x);
        sink[0] = x;
        pthread_barrier_wait(&end_barrier);
        long long t1 = now_ns();
        times[frames++] = (t1 - t0) / 1000;
        if (capped) {
            slot += FRAME_NS;
            if (slot > t1) {
                struct timespec ts = {slot / 1000000000LL, slot % 1000000000LL};
                clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            } else {
                slot = t1;
            }
        }
    }
    running = 0;
    pthread_barrier_wait(&start_barrier);
    for (int i = 1; i < n_threads; i++) pthread_join(th[i], NULL);
    for (int i = 0; i < frames; i++) printf(i ? " %lld" : "%lld", times[i]);
    printf("\n");
    return 0;
}
