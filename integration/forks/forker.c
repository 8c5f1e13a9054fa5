/* A process that forks; the child works, then (with an argument) execs
   /bin/true; the parent works and waits for it. Each prints what it did.
   With the argument "self" it first execs itself without arguments. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

int child_work(int x) { return x * 2; }
int parent_work(int x) { return x + 1; }

int main(int argc, char **argv) {
  int v = 0;
  if (argc > 1 && strcmp(argv[1], "self") == 0)
    execl("/proc/self/exe", argv[0], (char *)0);
  pid_t p = fork();
  if (p == 0) {
    v = child_work(21);
    printf("child %d\n", v);
    fflush(stdout);
    if (argc > 1)
      execl("/bin/true", "true", (char *)0);
    exit(0);
  }
  v = parent_work(41);
  waitpid(p, 0, 0);
  printf("parent %d\n", v);
  return 0;
}
