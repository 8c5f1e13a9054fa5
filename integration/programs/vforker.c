/* vforker N: calls probed() N times, vforks a child that execs /bin/true,
 * then calls probed() N more times, waits for the child (after a 0.3 s
 * pause, so a debugger's hidden stops happen) and prints
 * "vforker child=<status> sum=<sum>". For tracepoint capture: the vfork
 * child shares the parent's memory until its exec. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

__attribute__((noinline)) long probed(long x) { return x * 2 + 1; }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += probed(i);
    pid_t pid = vfork();
    if (pid == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    struct timespec pause = {0, 300 * 1000 * 1000};
    nanosleep(&pause, NULL);
    for (int i = 0; i < n; i++)
        sum += probed(i);
    int st = 0;
    waitpid(pid, &st, 0);
    printf("vforker child=%d sum=%ld\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), sum);
    return 0;
}
