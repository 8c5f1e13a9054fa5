/* regview.c — a stop with interesting register contents, for comparing
 * what gdb, gdb/MI and lldb show directly against gdbserver and through
 * asyncrsp.  At `scale`'s entry: xmm0 holds the f64 argument, xmm8-xmm15
 * hold known patterns, x87 holds a long double, fs_base points at the TLS
 * block; `finish` returns an f64 (6.25) in xmm0.
 * Build: gcc -g -O0 -no-pie -o regview regview.c
 */
#include <stdio.h>

static __thread volatile int tls_marker = 42;

__attribute__((noinline)) double scale(double x) { return x * 2.5; }

int main(void) {
  volatile long double ld = 1.0L / 3.0L;  /* leaves x87 registers in use */
  static const unsigned long long pattern[2] = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  __asm__ volatile("movdqu %0, %%xmm8\n\t"
                   "pshufd $0x1b, %%xmm8, %%xmm9\n\t"
                   "paddq %%xmm8, %%xmm9\n\t"
                   "movdqa %%xmm9, %%xmm15\n\t"
                   :: "m"(pattern) : "xmm8", "xmm9", "xmm15");
  volatile double in = 2.5;
  double r = scale(in);
  printf("scale=%g ld=%Lg tls=%d\n", r, ld, tls_marker);
  return 0;
}
