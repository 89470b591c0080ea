/* What a fork costs a program with a socket: the parent's fork() call, the time
 * until the child runs its first line (under the shim: its session attached and
 * its copies of the parent's sockets claimed), and the child's exit until
 * waitpid returns. Averages over N forks; the child only calls _exit.
 *
 *   fork_cost N ADDR     (ADDR: where the parent's listener binds; "none": no
 *                          socket, the fork of a process without a session)
 *
 * docs/benchmarks.md quotes it on the kernel and under `usnet run`.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: fork_cost N ADDR|none\n");
        return 2;
    }
    int n = atoi(argv[1]);
    /* Where the child writes when it started. */
    double *started = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (started == MAP_FAILED)
        return 1;
    if (strcmp(argv[2], "none") != 0) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET};
        if (inet_pton(AF_INET, argv[2], &a.sin_addr) != 1 ||
            bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, 8) != 0) {
            perror("listener");
            return 1;
        }
    }
    double in_fork = 0, to_child = 0, to_reaped = 0;
    for (int i = 0; i < n; i++) {
        double t0 = now();
        pid_t p = fork();
        if (p == 0) {
            *started = now();
            _exit(0);
        }
        if (p < 0) {
            perror("fork");
            return 1;
        }
        double t1 = now();
        waitpid(p, NULL, 0);
        double t2 = now();
        in_fork += t1 - t0;
        to_child += *started - t0;
        to_reaped += t2 - *started;
    }
    printf("parent's fork %.0f us, child running %.0f us, exit to reaped %.0f us\n",
           in_fork / n * 1e6, to_child / n * 1e6, to_reaped / n * 1e6);
    return 0;
}
