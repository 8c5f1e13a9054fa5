/* spin [SECONDS]: calls probed() in a tight loop for up to SECONDS
 * (default 30) of wall time, so a hidden probe fires at a high rate while
 * the client interrupts the program (Ctrl-C). Prints "spun <calls>" and
 * exits 0. `keep_going` lets a test end the loop early by `set var`. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

volatile int keep_going = 1;
volatile unsigned long calls;

__attribute__((noinline)) unsigned long probed(unsigned long x) { return x ^ (x >> 3); }

int main(int argc, char **argv)
{
    int seconds = argc > 1 ? atoi(argv[1]) : 30;
    time_t end = time(NULL) + seconds;
    unsigned long acc = 0;
    while (keep_going) {
        acc += probed(calls++);
        if ((calls & 1023) == 0 && time(NULL) >= end)
            break;
    }
    printf("spun %s\n", acc || calls ? "ok" : "none");
    return 0;
}
