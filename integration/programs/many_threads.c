/* many_threads N: the main thread plus N-1 named threads ("worker-1"...)
 * that each wait in parked() on one condition variable, forever. Prints
 * "ready N" once all have started, then waits too. bench/bench_task_threads.py
 * attaches to it to measure what gdb itself pays for as many real threads as
 * task threads list (the floor of a stop with ~1,028 threads). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static int started;

__attribute__((noinline)) static void parked(void)
{
    pthread_mutex_lock(&lock);
    started++;
    pthread_cond_broadcast(&cond);
    for (;;)
        pthread_cond_wait(&cond, &lock);
}

static void *worker(void *arg)
{
    char name[16];
    snprintf(name, sizeof name, "worker-%ld", (long)arg);
    pthread_setname_np(pthread_self(), name);
    parked();
    return NULL;
}

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 1028;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 << 10);
    for (long i = 1; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, &attr, worker, (void *)i) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    pthread_mutex_lock(&lock);
    while (started < n - 1)
        pthread_cond_wait(&cond, &lock);
    pthread_mutex_unlock(&lock);
    printf("ready %ld\n", n);
    fflush(stdout);
    parked();
    return 0;
}
