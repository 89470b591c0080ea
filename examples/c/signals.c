/* signals.c - a signal handler ending a blocking socket call: EINTR without
 * SA_RESTART, a restarted recv with it, EINTR from poll and epoll_wait either way.
 * The same output on the kernel and under the LD_PRELOAD shim
 * (crates/usnet-preload/tests). usage: signals ADDR PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"

static volatile sig_atomic_t fired;
static void on_alarm(int sig) { (void)sig; fired++; }

static void handler(int restart) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sa.sa_flags = restart ? SA_RESTART : 0;
    sigaction(SIGALRM, &sa, NULL);
}

static void alarm_in_ms(int ms) {
    struct itimerval t = {{0, 0}, {0, ms * 1000}};
    setitimer(ITIMER_REAL, &t, NULL);
}

static int peer;
static void *send_later(void *arg) {
    (void)arg;
    usleep(400 * 1000);
    send(peer, "late", 4, 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    setvbuf(stdout, NULL, _IONBF, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    int l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK("bind", bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK("listen", listen(l, 4) == 0);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    CHECK("connect", connect(c, (struct sockaddr *)&a, sizeof a) == 0);
    int s = accept(l, NULL, NULL);
    CHECK("accept", s >= 0);
    peer = c;
    char buf[16];

    /* No SA_RESTART: a blocked recv ends with EINTR. */
    handler(0);
    fired = 0;
    alarm_in_ms(100);
    errno = 0;
    ssize_t n = recv(s, buf, sizeof buf, 0);
    CHECK("recv EINTR without SA_RESTART", n < 0 && errno == EINTR && fired == 1);

    /* SA_RESTART: the recv goes on and returns the data sent later. */
    handler(1);
    fired = 0;
    pthread_t t;
    pthread_create(&t, NULL, send_later, NULL);
    alarm_in_ms(100);
    n = recv(s, buf, sizeof buf, 0);
    CHECK("recv restarted with SA_RESTART", n == 4 && memcmp(buf, "late", 4) == 0 && fired == 1);
    pthread_join(t, NULL);

    /* poll and epoll_wait end with EINTR even under SA_RESTART. */
    fired = 0;
    alarm_in_ms(100);
    struct pollfd p = {.fd = s, .events = POLLIN};
    errno = 0;
    CHECK("poll EINTR", poll(&p, 1, 5000) < 0 && errno == EINTR && fired == 1);
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 1}, out[2];
    epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev);
    fired = 0;
    alarm_in_ms(100);
    errno = 0;
    CHECK("epoll_wait EINTR", epoll_wait(ep, out, 2, 5000) < 0 && errno == EINTR && fired == 1);

    /* ppoll, pselect and epoll_pwait wait with the mask they are given: a signal
     * the program blocks everywhere else ends the wait (sshd collects its
     * children so), and is blocked again once it returns. One arrives during the
     * wait, one is already pending when it starts. */
    sigset_t block, open_mask, now;
    sigemptyset(&block);
    sigaddset(&block, SIGALRM);
    sigprocmask(SIG_BLOCK, &block, &open_mask);
    sigdelset(&open_mask, SIGALRM);
    struct timespec five = {5, 0};
    for (int pending = 0; pending < 2; pending++) {
        const char *when = pending ? "pending" : "arriving";
        char what[96];
        fired = 0;
        alarm_in_ms(pending ? 20 : 100);
        if (pending) usleep(100 * 1000);
        errno = 0;
        p.revents = 0;
        int r = ppoll(&p, 1, &five, &open_mask);
        sigprocmask(SIG_BLOCK, NULL, &now);
        snprintf(what, sizeof what, "ppoll EINTR, a signal %s, blocked again", when);
        CHECK(what, r < 0 && errno == EINTR && fired == 1 && sigismember(&now, SIGALRM));

        fired = 0;
        alarm_in_ms(pending ? 20 : 100);
        if (pending) usleep(100 * 1000);
        errno = 0;
        r = epoll_pwait(ep, out, 2, 5000, &open_mask);
        sigprocmask(SIG_BLOCK, NULL, &now);
        snprintf(what, sizeof what, "epoll_pwait EINTR, a signal %s, blocked again", when);
        CHECK(what, r < 0 && errno == EINTR && fired == 1 && sigismember(&now, SIGALRM));

        fired = 0;
        alarm_in_ms(pending ? 20 : 100);
        if (pending) usleep(100 * 1000);
        fd_set rs;
        FD_ZERO(&rs);
        FD_SET(s, &rs);
        errno = 0;
        r = pselect(s + 1, &rs, NULL, NULL, &five, &open_mask);
        sigprocmask(SIG_BLOCK, NULL, &now);
        snprintf(what, sizeof what, "pselect EINTR, a signal %s, blocked again", when);
        CHECK(what, r < 0 && errno == EINTR && fired == 1 && sigismember(&now, SIGALRM));
    }
    sigprocmask(SIG_UNBLOCK, &block, NULL);

    /* The program sees its own handler, not the shim's. */
    struct sigaction cur;
    sigaction(SIGALRM, NULL, &cur);
    CHECK("sigaction reports the program's handler", cur.sa_handler == on_alarm);
    close(ep);
    close(s);
    close(c);
    close(l);
    printf("%s\n", failures ? "FAILED" : "all ok");
    return failures != 0;
}
