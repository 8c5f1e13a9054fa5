/* exitcode CODE: calls probed() once and exits with CODE (default 7). */
#include <stdlib.h>

__attribute__((noinline)) int probed(int x) { return x; }

int main(int argc, char **argv)
{
    int code = argc > 1 ? atoi(argv[1]) : 7;
    return probed(code);
}
