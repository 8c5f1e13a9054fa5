/* sites N: calls f1() .. f6() in turn N times, then done(); prints
 * "sites sum=<sum>" and exits 0. Six functions to probe, for a client that
 * sets breakpoints on more of them than x86-64 has debug registers (4). */
#include <stdio.h>
#include <stdlib.h>

volatile long acc;

__attribute__((noinline)) long f1(long x) { return x + 1; }
__attribute__((noinline)) long f2(long x) { return x * 3; }
__attribute__((noinline)) long f3(long x) { return x ^ 5; }
__attribute__((noinline)) long f4(long x) { return x - 7; }
__attribute__((noinline)) long f5(long x) { return x | 9; }
__attribute__((noinline)) long f6(long x) { return x & 11; }
__attribute__((noinline)) void done(long x) { acc = x; }

int main(int argc, char **argv)
{
    int n = argc > 1 ? atoi(argv[1]) : 10;
    long sum = 0;
    for (int i = 0; i < n; i++)
        sum += f1(i) + f2(i) + f3(i) + f4(i) + f5(i) + f6(i);
    done(sum);
    printf("sites sum=%ld\n", sum);
    return 0;
}
