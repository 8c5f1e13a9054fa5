/* signals N: raises SIGUSR1 N times; a handler counts them. Prints
 * "got <count> of <N>" and exits 0 when every signal reached the handler
 * (1 otherwise). Under a debugger each raise is a stop the client must
 * pass back to the program (gdb: `handle SIGUSR1 nostop noprint pass` or
 * `signal SIGUSR1`), which the proxy must carry through. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

volatile sig_atomic_t handled;

__attribute__((noinline)) long probed(int x) { return x + 1; }

static void on_usr1(int sig) { (void)sig; handled++; }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 3;
    signal(SIGUSR1, on_usr1);
    long acc = 0;
    for (int i = 0; i < n; i++) {
        acc += probed(i);
        raise(SIGUSR1);
    }
    printf("got %d of %d (acc=%ld)\n", (int)handled, n, acc);
    return handled == n ? 0 : 1;
}
