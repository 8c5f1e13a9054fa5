/* Forks while its function `probed` carries the proxy's hidden breakpoint:
 * the child calls it five times and exits 0 if the results are right; the
 * parent prints how the child ended. */
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
__attribute__((noinline)) int probed(int x) { return x * 2 + 1; }
int main(void) {
    int acc = 0;
    for (int i = 0; i < 3; i++) acc += probed(i);
    pid_t pid = fork();
    if (pid == 0) { int a = 0; for (int i = 0; i < 5; i++) a += probed(i); _exit(a == 25 ? 0 : 3); }
    int st = 0; waitpid(pid, &st, 0);
    printf("child: %s %d\n", WIFEXITED(st) ? "exit" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    return 0;
}
