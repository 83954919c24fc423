# cython: language_level=3
"""The low-priority compute thread, in C, and llama_decode's abort callback.

A decode beside a busy game runs on a thread in the kernel's SCHED_IDLE class, bound to
one CPU (cpu_share.py says when and why). Such a thread may get almost no CPU for seconds.
Had it been a Python thread, it would take the GIL after every llama.cpp call, and a
thread descheduled while it holds the GIL stops every other thread of the server with it.
So this thread never touches Python: it waits on a semaphore, calls llama_decode or
llama_sampler_sample through the function pointer it was handed, and posts another
semaphore; the caller waits on that with the GIL released and a timeout, and can stop the
decode through the abort flag, which llama.cpp's CPU backend reads between graph nodes
(a C callback: a Python one would take the GIL hundreds of times a token).

One job at a time: the caller (cpu_share.py) holds a lock from submit() to result().
`Batch` mirrors llama.h's llama_batch; cpu_share.py checks it against llama_cpp's ctypes
layout before using this thread.
"""
from libc.stdint cimport int32_t, uintptr_t

cdef extern from *:
    """
    #include <errno.h>
    #include <pthread.h>
    #include <sched.h>
    #include <semaphore.h>
    #include <stdbool.h>
    #include <stdint.h>
    #include <sys/resource.h>
    #include <sys/syscall.h>
    #include <time.h>
    #include <unistd.h>

    typedef struct {
        int32_t n_tokens;
        void *token;
        void *embd;
        void *pos;
        void *n_seq_id;
        void **seq_id;
        void *logits;
    } tf_batch;
    typedef int32_t (*tf_decode_fn)(void *ctx, tf_batch batch);
    typedef int32_t (*tf_sample_fn)(void *chain, void *ctx, int32_t idx);

    static bool tf_abort_flag_set(void *flag) {
        return __atomic_load_n((int *)flag, __ATOMIC_RELAXED) != 0;
    }

    static sem_t tf_go, tf_done, tf_ready;
    static pthread_t tf_thread;
    static clockid_t tf_clock;
    static int tf_started = 0, tf_idle_class = 0, tf_cpu = -1, tf_nice = 19;
    static long tf_tid = 0;
    static int tf_kind;                 /* 0: decode, 1: sample */
    static void *tf_fn, *tf_a, *tf_b;
    static tf_batch tf_bt;
    static int32_t tf_idx, tf_rc;

    static void *tf_loop(void *arg) {
        (void)arg;
        tf_tid = (long)syscall(SYS_gettid);
        setpriority(PRIO_PROCESS, (id_t)tf_tid, tf_nice);
        struct sched_param sp = {0};
        tf_idle_class = sched_setscheduler(0, SCHED_IDLE, &sp) == 0;   /* this thread */
        if (tf_cpu >= 0) {
            cpu_set_t set;
            CPU_ZERO(&set);
            CPU_SET(tf_cpu, &set);
            sched_setaffinity(0, sizeof set, &set);
        }
        pthread_getcpuclockid(pthread_self(), &tf_clock);
        sem_post(&tf_ready);
        for (;;) {
            while (sem_wait(&tf_go) != 0) {}
            tf_rc = tf_kind == 0 ? ((tf_decode_fn)tf_fn)(tf_a, tf_bt)
                                 : ((tf_sample_fn)tf_fn)(tf_a, tf_b, tf_idx);
            sem_post(&tf_done);
        }
        return NULL;
    }

    static int tf_start(int cpu, int nice) {
        if (tf_started) return 0;
        tf_cpu = cpu;
        tf_nice = nice;
        if (sem_init(&tf_go, 0, 0) || sem_init(&tf_done, 0, 0) || sem_init(&tf_ready, 0, 0))
            return errno;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int rc = pthread_create(&tf_thread, &attr, tf_loop, NULL);
        pthread_attr_destroy(&attr);
        if (rc) return rc;
        while (sem_wait(&tf_ready) != 0) {}
        tf_started = 1;
        return 0;
    }

    /* 1 once the job is done, 0 when `timeout_s` passed first */
    static int tf_wait(double timeout_s) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long ns = ts.tv_nsec + (long long)(timeout_s * 1e9);
        ts.tv_sec += ns / 1000000000LL;
        ts.tv_nsec = ns % 1000000000LL;
        for (;;) {
            if (sem_timedwait(&tf_done, &ts) == 0) return 1;
            if (errno == ETIMEDOUT) return 0;
        }
    }

    static double tf_cpu_seconds(void) {
        struct timespec ts;
        if (!tf_started || clock_gettime(tf_clock, &ts) != 0) return -1.0;
        return ts.tv_sec + ts.tv_nsec * 1e-9;
    }
    """
    ctypedef struct tf_batch:
        pass
    bint tf_abort_flag_set(void *flag) noexcept nogil
    int tf_start(int cpu, int nice) noexcept nogil
    int tf_wait(double timeout_s) noexcept nogil
    double tf_cpu_seconds() noexcept nogil
    int tf_started, tf_idle_class, tf_kind
    long tf_tid
    void *tf_fn
    void *tf_a
    void *tf_b
    tf_batch tf_bt
    int32_t tf_idx, tf_rc
    void *tf_go_ptr "(&tf_go)"
    int sem_post(void *sem) nogil
    size_t BATCH_SIZE "sizeof(tf_batch)"
    void *memcpy(void *dst, const void *src, size_t n) nogil


BATCH_BYTES = BATCH_SIZE


def abort_callback_address() -> int:
    """`bool callback(void *flag)`: true once *(int *)flag is non-zero."""
    return <uintptr_t>&tf_abort_flag_set


def start(int cpu, int nice) -> bool:
    """Starts the thread (once): nice `nice`, SCHED_IDLE, bound to `cpu` (-1: unbound).
    Returns whether the kernel granted SCHED_IDLE; raises OSError if no thread started."""
    cdef int rc
    with nogil:
        rc = tf_start(cpu, nice)
    if rc:
        raise OSError(rc, "the low-priority compute thread did not start")
    return bool(tf_idle_class)


def native_id() -> int:
    """The thread's kernel id (0 before start)."""
    return tf_tid


def submit_decode(uintptr_t fn, uintptr_t ctx, uintptr_t batch) -> None:
    """fn(ctx, *batch) (llama_decode) on the thread; `batch` is copied now."""
    if not tf_started:
        raise RuntimeError("the low-priority compute thread is not running")
    global tf_kind, tf_fn, tf_a
    tf_kind = 0
    tf_fn = <void *>fn
    tf_a = <void *>ctx
    memcpy(&tf_bt, <void *>batch, BATCH_SIZE)
    sem_post(tf_go_ptr)


def submit_sample(uintptr_t fn, uintptr_t chain, uintptr_t ctx, int32_t idx) -> None:
    """fn(chain, ctx, idx) (llama_sampler_sample) on the thread."""
    if not tf_started:
        raise RuntimeError("the low-priority compute thread is not running")
    global tf_kind, tf_fn, tf_a, tf_b, tf_idx
    tf_kind = 1
    tf_fn = <void *>fn
    tf_a = <void *>chain
    tf_b = <void *>ctx
    tf_idx = idx
    sem_post(tf_go_ptr)


def wait(double timeout_s) -> bool:
    """True once the submitted job is done; False if `timeout_s` passed first."""
    cdef int done
    with nogil:
        done = tf_wait(timeout_s)
    return bool(done)


def result() -> int:
    """What the last job returned (call after wait() said it is done)."""
    return tf_rc


def cpu_seconds() -> float | None:
    """CPU seconds the thread has used (None before it started)."""
    cdef double s = tf_cpu_seconds()
    return None if s < 0 else s
