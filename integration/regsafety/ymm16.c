/* ymm16.c — keeps a known value in ymm16 across a debugger stop at bp_site.
 *
 * The reproducer of research/gdbserver-xsave-corruption.md §1.6.  probe()
 * puts the ZMM_Hi256 component in its init state (vzeroupper), loads 32
 * bytes into ymm16 (the Hi16_ZMM component) and stores them back after the
 * `bp_site` label.  A debugger that stops the thread at bp_site and resumes
 * it must leave ymm16 alone; gdbserver 13.1 talking to a client that sent
 * `xmlRegisters=i386` writes the XSAVE area back with AVX-512 at Intel's
 * offsets, which on AMD CPUs with AVX-512 zeroes zmm16-zmm19.
 *
 * It also counts the iterations in which bp_site held an int3 (0xcc) when
 * probe() was called: "armed A/N" proves a breakpoint (a client's, or a
 * proxy's hidden one) really was in place, since a hidden stop is otherwise
 * invisible to the program and to the client.
 *
 * Usage: ymm16 [ITERATIONS [RESULT_FILE]]   (default 1000)
 * Prints "preserved N/N" or "lost K/N" (also into RESULT_FILE, so a test gets
 * it whoever holds the program's stdout) and exits 0 or 1.
 * Build: gcc -O1 -mavx512f -mavx512vl -no-pie -o ymm16 ymm16.c
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) void probe(const uint8_t *src, uint8_t *dst) {
  __asm__ volatile("vzeroupper\n\t"                 /* ZMM_Hi256 -> init state        */
                   "vmovdqu64 (%0), %%ymm16\n\t"     /* live value in ymm16 (Hi16_ZMM) */
                   ".globl bp_site\n\t.type bp_site, @function\nbp_site:\n\tnop\n\t"  /* STT_FUNC: --probe matches functions */
                   "vmovdqu64 %%ymm16, (%1)\n\t"
                   :: "r"(src), "r"(dst) : "memory", "xmm16");
}

extern const unsigned char bp_site[];

int main(int argc, char **argv) {
  long n = argc > 1 ? strtol(argv[1], NULL, 10) : 1000;
  uint8_t src[32], dst[32];
  long lost = 0, armed = 0;
  for (long i = 0; i < n; i++) {
    for (int j = 0; j < 32; j++) src[j] = (uint8_t)(0xA5 ^ (i * 31 + j * 7) ^ (j << 3)) | 1;
    memset(dst, 0, sizeof dst);
    armed += *(volatile const unsigned char *)bp_site == 0xcc;
    probe(src, dst);
    if (memcmp(src, dst, sizeof dst) != 0) lost++;
  }
  char line[64];
  if (lost) snprintf(line, sizeof line, "lost %ld/%ld armed %ld/%ld\n", lost, n, armed, n);
  else snprintf(line, sizeof line, "preserved %ld/%ld armed %ld/%ld\n", n, n, armed, n);
  fputs(line, stdout);
  fflush(stdout);
  if (argc > 2) {
    FILE *f = fopen(argv[2], "w");
    if (f) { fputs(line, f); fclose(f); }
  }
  return lost ? 1 : 0;
}
