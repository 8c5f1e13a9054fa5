/* one_worker: main starts one worker thread and spins until the worker has
 * called unlock_main() (after tick() a few times); main then calls
 * unlock_worker() and joins it. With a hidden probe on tick/unlock_main the
 * worker stops at it while main runs: the case of GDB's own
 * stop-reply-no-thread-multi.exp with a stub that names no thread
 * (gdbserver --disable-packet=T) in non-stop mode. Exits 0. */
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

volatile int worker_blocked = 1;
volatile int main_blocked = 1;
volatile long ticks;

__attribute__((noinline)) void tick(void) { ticks++; }

__attribute__((noinline)) void unlock_worker(void) { worker_blocked = 0; }

__attribute__((noinline)) void unlock_main(void) { main_blocked = 0; }

static void *worker(void *data)
{
    (void)data;
    for (int i = 0; i < 3; i++)
        tick();
    unlock_main();
    while (worker_blocked)
        ;
    /* main is at the client's breakpoint in unlock_worker, which gdb steps
     * over next: the worker's last hidden stop comes after that step ends.
     * Two threads stopped at the same moment with a stub that names no
     * thread cannot be told apart (a known limit of non-stop mode, README);
     * without this wait the test hung about 1 run in 20 when the step and
     * the probe hit crossed. */
    usleep(200000);
    tick();
    return NULL;
}

int main(void)
{
    pthread_t thr;
    alarm(60);
    if (pthread_create(&thr, NULL, worker, NULL) != 0)
        abort();
    while (main_blocked)
        ;
    unlock_worker();
    if (pthread_join(thr, NULL) != 0)
        abort();
    return 0;
}
