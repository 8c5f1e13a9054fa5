/* watch: a global `counter` modified in a loop (for watchpoints); each
 * iteration also calls probed(). Prints "counter=<value>" and exits 0. */
#include <stdio.h>

volatile int counter;
int table[8] = {1, 2, 3, 4, 5, 6, 7, 8};
const char greeting[] = "hello, transparency";

__attribute__((noinline)) int probed(int x) { return x + table[x & 7]; }

int main(void)
{
    for (int i = 0; i < 5; i++)
        counter = counter + probed(i);
    printf("counter=%d\n", counter);
    return 0;
}
