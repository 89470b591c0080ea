/* fork_handlers.c - forks while a library's fork handlers make sockets of their own
 * (fork_handlers_lib.c, installed in the library's constructor), and the child still
 * connects back over the parent's listener. Each wait has a deadline (alarm,
 * SO_RCVTIMEO). The same output on the kernel and under the LD_PRELOAD shim
 * (crates/usnet-preload/tests). usage: fork_handlers ADDR PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

extern int fork_handlers_made, fork_handlers_failed;

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    alarm(30); /* the whole run's deadline */
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK("bind", bind(l, (struct sockaddr *)&addr, sizeof addr) == 0);
    CHECK("listen", listen(l, 8) == 0);
    int served = 0;
    for (int i = 0; i < 3; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            alarm(10);
            int c = socket(AF_INET, SOCK_STREAM, 0);
            if (c < 0 || connect(c, (struct sockaddr *)&addr, sizeof addr) != 0) _exit(1);
            char b = (char)('a' + i);
            _exit(send(c, &b, 1, 0) == 1 ? 0 : 2);
        }
        int s = accept(l, NULL, NULL);
        struct timeval tv = {10, 0};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char b = 0;
        if (s >= 0 && recv(s, &b, 1, 0) == 1 && b == 'a' + i) served++;
        close(s);
        int st = 0;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) served = -100;
    }
    CHECK("three children connected back after their forks", served == 3);
    CHECK("the library's fork handlers made their sockets",
          fork_handlers_made == 6 && fork_handlers_failed == 0);
    printf("handlers made %d sockets, %d failed\n", fork_handlers_made, fork_handlers_failed);
    close(l);
    printf(failures ? "some failed\n" : "all ok\n");
    return failures != 0;
}
