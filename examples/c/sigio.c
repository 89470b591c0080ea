/* Signal-driven I/O: O_ASYNC with an owner (F_SETOWN, F_SETOWN_EX, FIOSETOWN)
 * brings SIGIO when a datagram arrives or a connection waits on a listener;
 * F_SETSIG's signal comes with the descriptor and the band in its siginfo;
 * setting O_ASYNC signals nothing by itself, and clearing it stops the signals.
 * The same answers under the shim as on the kernel.
 *
 *   sigio ADDR PORT      (ADDR: an IPv4 address of the stack)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

static volatile sig_atomic_t sigios, rts, rt_fd = -1, rt_band;

static void on_sigio(int sig) {
    (void)sig;
    sigios++;
}

static void on_rt(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)ctx;
    rts++;
    rt_fd = si->si_fd;
    rt_band = (int)si->si_band;
}

/* Whether *count moved past `from` within `ms`. */
static int came(volatile sig_atomic_t *count, int from, int ms) {
    for (int i = 0; i < ms; i++) {
        if (*count > from)
            return 1;
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
    return *count > from;
}

static int udp_bound(struct sockaddr_in *at) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    return bind(s, (struct sockaddr *)at, sizeof *at) == 0 ? s : -1;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: sigio ADDR PORT\n");
        return 2;
    }
    int port = atoi(argv[2]);
    struct in_addr addr;
    if (inet_pton(AF_INET, argv[1], &addr) != 1)
        return 2;
    struct sockaddr_in me = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = addr};
    struct sockaddr_in peer_at = me, lst_at = me;
    peer_at.sin_port = htons(port + 1);
    lst_at.sin_port = htons(port + 2);
    char b[16];

    struct sigaction sa = {.sa_handler = on_sigio, .sa_flags = SA_RESTART};
    sigaction(SIGIO, &sa, NULL);
    struct sigaction rt = {.sa_sigaction = on_rt, .sa_flags = SA_SIGINFO | SA_RESTART};
    sigaction(SIGRTMIN + 1, &rt, NULL);

    int s = udp_bound(&me), peer = udp_bound(&peer_at);
    CHECK("bind two sockets", s >= 0 && peer >= 0);
    CHECK("no owner at first", fcntl(s, F_GETOWN) == 0);
    CHECK("F_SETOWN to this process", fcntl(s, F_SETOWN, getpid()) == 0);
    CHECK("F_GETOWN reads it back", fcntl(s, F_GETOWN) == getpid());
    errno = 0;
    CHECK("F_SETOWN to no such process: ESRCH",
          fcntl(s, F_SETOWN, 0x3ffffff0) == -1 && errno == ESRCH);
    CHECK("O_ASYNC with O_NONBLOCK", fcntl(s, F_SETFL, O_NONBLOCK | O_ASYNC) == 0);
    int fl = fcntl(s, F_GETFL);
    CHECK("F_GETFL shows both", (fl & O_ASYNC) && (fl & O_NONBLOCK));
    CHECK("setting it signals nothing by itself", !came(&sigios, 0, 300));

    sendto(peer, "a", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("a datagram brings SIGIO", came(&sigios, 0, 5000));
    CHECK("  and it is there to read", recv(s, b, sizeof b, 0) == 1 && b[0] == 'a');

    CHECK("F_SETSIG to a real-time signal", fcntl(s, F_SETSIG, SIGRTMIN + 1) == 0);
    CHECK("F_GETSIG reads it back", fcntl(s, F_GETSIG) == SIGRTMIN + 1);
    int before = sigios;
    sendto(peer, "b", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("a datagram brings that signal", came(&rts, 0, 5000));
    CHECK("  with the descriptor in si_fd", rt_fd == s);
    CHECK("  and POLLIN in si_band", (rt_band & POLLIN) != 0);
    CHECK("  and not SIGIO", sigios == before);
    CHECK("  the datagram is there", recv(s, b, sizeof b, 0) == 1 && b[0] == 'b');
    errno = 0;
    CHECK("F_SETSIG past the last signal: EINVAL", fcntl(s, F_SETSIG, 65) == -1 && errno == EINVAL);

    CHECK("O_ASYNC off", fcntl(s, F_SETFL, O_NONBLOCK) == 0 && !(fcntl(s, F_GETFL) & O_ASYNC));
    int rts_before = rts;
    before = sigios;
    sendto(peer, "c", 1, 0, (struct sockaddr *)&me, sizeof me);
    CHECK("then a datagram brings no signal", !came(&rts, rts_before, 300) && sigios == before);

    /* A listener, owned through the ioctls: a connection waiting brings SIGIO. */
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1, pid = getpid(), got = 0;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK("listen", bind(l, (struct sockaddr *)&lst_at, sizeof lst_at) == 0 && listen(l, 8) == 0);
    CHECK("FIOSETOWN", ioctl(l, FIOSETOWN, &pid) == 0);
    CHECK("SIOCGPGRP reads it back", ioctl(l, SIOCGPGRP, &got) == 0 && got == pid);
    CHECK("FIOASYNC on", ioctl(l, FIOASYNC, &one) == 0 && (fcntl(l, F_GETFL) & O_ASYNC));
    struct f_owner_ex ex = {0};
    CHECK("F_GETOWN_EX: a process", fcntl(l, F_GETOWN_EX, &ex) == 0 && ex.type == F_OWNER_PID &&
                                        ex.pid == pid);
    before = sigios;
    /* Not blocking: the listener's signal would interrupt a blocking connect. */
    int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = connect(c, (struct sockaddr *)&lst_at, sizeof lst_at);
    CHECK("connect to it", r == 0 || errno == EINPROGRESS);
    CHECK("a waiting connection brings SIGIO", came(&sigios, before, 5000));
    int a = accept(l, NULL, NULL);
    CHECK("  and is there to accept", a >= 0);

    close(a);
    close(c);
    close(l);
    close(s);
    close(peer);
    if (failures == 0)
        printf("all ok\n");
    return failures != 0;
}
