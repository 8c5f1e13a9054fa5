/* threads: the main thread plus three named worker threads ("worker-1"..3)
 * that each call probed() a few times, meet at a barrier, then wait in
 * park() until the main thread sets `release`. A breakpoint on `parked`
 * therefore stops with all four threads alive, for `info threads`, thread
 * switching and `bt`. Prints "threads done <sum>" and exits 0. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

volatile int release;
volatile long results[4];
static pthread_barrier_t barrier;

__attribute__((noinline)) long probed(int x) { return (long)x * 3; }

__attribute__((noinline)) void parked(int id) { results[id] += id; }

__attribute__((noinline)) static void park(int id)
{
    while (!release)
        usleep(1000);
    results[id] += probed(id);
}

static void *worker(void *arg)
{
    int id = (int)(long)arg;
    char name[16];
    snprintf(name, sizeof name, "worker-%d", id);
    pthread_setname_np(pthread_self(), name);
    for (int i = 0; i < 5; i++)
        results[id] += probed(i);
    pthread_barrier_wait(&barrier);
    park(id);
    return NULL;
}

int main(void)
{
    pthread_t tid[4];
    pthread_barrier_init(&barrier, NULL, 4);
    for (long i = 1; i <= 3; i++)
        pthread_create(&tid[i], NULL, worker, (void *)i);
    pthread_barrier_wait(&barrier);
    usleep(20000); /* let the workers reach park() */
    parked(0);
    release = 1;
    for (int i = 1; i <= 3; i++)
        pthread_join(tid[i], NULL);
    printf("threads done %ld\n", results[0] + results[1] + results[2] + results[3]);
    return 0;
}
