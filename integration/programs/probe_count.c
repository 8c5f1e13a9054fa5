/* probe_count N [T]: calls probed(i) N times in total, from T threads
 * (default 1: the main thread only), prints "sum=<sum> calls=<N>" and exits 0.
 * The probe-count tests plant a hidden probe on `probed` and expect exactly N
 * hits; the sum proves every call really ran (and ran correctly). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

volatile long total;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((noinline)) long probed(int x)
{
    return (long)x * 2 + 1;
}

struct share { int from, count; long sum; };

static void *worker(void *arg)
{
    struct share *s = arg;
    for (int i = 0; i < s->count; i++)
        s->sum += probed(s->from + i);
    return NULL;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    int t = argc > 2 ? atoi(argv[2]) : 1;
    if (t < 1 || t > 64 || n < 0) {
        fprintf(stderr, "usage: probe_count N [THREADS<=64]\n");
        return 2;
    }
    pthread_t tid[64];
    struct share sh[64];
    int from = 0;
    for (int i = 0; i < t; i++) {
        sh[i].from = from;
        sh[i].count = n / t + (i < n % t);
        sh[i].sum = 0;
        from += sh[i].count;
    }
    if (t == 1) {
        worker(&sh[0]);
    } else {
        for (int i = 0; i < t; i++)
            pthread_create(&tid[i], NULL, worker, &sh[i]);
        for (int i = 0; i < t; i++)
            pthread_join(tid[i], NULL);
    }
    pthread_mutex_lock(&lock);
    for (int i = 0; i < t; i++)
        total += sh[i].sum;
    pthread_mutex_unlock(&lock);
    printf("sum=%ld calls=%d\n", total, n);
    return 0;
}
