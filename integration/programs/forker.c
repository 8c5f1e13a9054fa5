/* forker N fork|exec: calls probed() N times, then
 *   fork: forks; parent and child each call probed() N more times; the child
 *         then keeps calling probed() for about 1.5 s (so a test can look at
 *         its memory while it runs) and exits 0; the parent waits for it and
 *         prints "forker child=<status> sum=<sum>".
 *   exec: execs itself (the same file) as "forker N done", which calls
 *         probed() N times and prints "forker exec'd sum=<sum>".
 * Exits 0. For the uprobe tests: a forked child must not keep the parent's
 * probes, and an exec must not leave them in the new image. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long probed(long x) { return x * 2 + 1; }

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    const char *mode = argc > 2 ? argv[2] : "fork";
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += probed(i);
    if (strcmp(mode, "exec") == 0) {
        fflush(stdout);
        execl("/proc/self/exe", argv[0], argv[1], "done", (char *)NULL);
        perror("execl");
        return 1;
    }
    if (strcmp(mode, "done") == 0) {
        printf("forker exec'd sum=%ld\n", sum);
        return 0;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("fork");
        return 1;
    }
    for (int i = 0; i < n; i++)
        sum += probed(i);
    if (child == 0) {
        double end = now() + 1.5;
        struct timespec ms = {0, 1000000};
        while (now() < end) {
            sum += probed(1);
            nanosleep(&ms, NULL);
        }
        _exit(sum ? 0 : 3);
    }
    int status = 0;
    waitpid(child, &status, 0);
    printf("forker child=%d sum=%ld\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), sum);
    return 0;
}
