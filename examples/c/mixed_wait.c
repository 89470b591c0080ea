/* Waits on sockets and kernel descriptors at once, as event loops make them (a
 * socket beside a self-pipe, an eventfd or a signalfd): epoll, poll and select
 * must each wake for either side, at once. First, before the process has any
 * socket: a waiter asleep before the first socket joins its set, and a one-shot
 * listener re-armed by another thread while the waiter sleeps.
 *
 *   mixed_wait ADDR PORT             the checks; prints the same on the kernel and
 *                                    under the shim, ending "all ok"
 *   mixed_wait ADDR PORT measure N   then how long a pipe's wake-up takes in a
 *                                    mixed epoll_wait (median and p90 of 400), and
 *                                    how busy N idle mixed waiters keep the machine
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static struct sockaddr_in at;
static int u, sender, pr, pw;
static volatile double sent_at;

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void check(int ok, const char *what) {
    printf("%s: %s\n", what, ok ? "ok" : "FAILED");
    if (!ok) exit(1);
}

/* After 20 ms, one byte into the pipe (side 'p') or one datagram to u ('s'). */
static void *later(void *arg) {
    usleep(20000);
    if (*(char *)arg == 'p') {
        char c = 1;
        if (write(pw, &c, 1) != 1) perror("write");
    } else if (sendto(sender, "x", 1, 0, (struct sockaddr *)&at, sizeof at) != 1) {
        perror("sendto");
    }
    return NULL;
}

static pthread_t soon(char *side) {
    pthread_t t;
    pthread_create(&t, NULL, later, side);
    return t;
}

static void drain(void) {
    char b[16];
    if (read(pr, b, 1) != 1) perror("read pipe");
}

static void take_datagram(void) {
    char b[16];
    if (recv(u, b, sizeof b, 0) != 1) perror("recv");
}

static int setup(const char *addr, int port) {
    memset(&at, 0, sizeof at);
    at.sin_family = AF_INET;
    at.sin_port = htons(port);
    inet_pton(AF_INET, addr, &at.sin_addr);
    u = socket(AF_INET, SOCK_DGRAM, 0);
    if (bind(u, (struct sockaddr *)&at, sizeof at)) { perror("bind"); exit(1); }
    sender = socket(AF_INET, SOCK_DGRAM, 0);
    int p[2];
    if (pipe(p)) { perror("pipe"); exit(1); }
    pr = p[0];
    pw = p[1];
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 1};
    epoll_ctl(ep, EPOLL_CTL_ADD, u, &e);
    e.data.u64 = 2;
    epoll_ctl(ep, EPOLL_CTL_ADD, pr, &e);
    return ep;
}

/* What a waiter thread got: how many events, and the first one's data. */
static int waited_n;
static unsigned long long waited_data;

static void *waiter(void *arg) {
    struct epoll_event ev[4];
    int n = epoll_wait(*(int *)arg, ev, 4, 10000);
    waited_n = n;
    waited_data = n > 0 ? ev[0].data.u64 : 0;
    return NULL;
}

/* The waiter ended within 5 s, half its own timeout (else it slept through
 * what should have woken it). */
static int joined_in_time(pthread_t t) {
    struct timespec by;
    clock_gettime(CLOCK_REALTIME, &by);
    by.tv_sec += 5;
    return pthread_timedjoin_np(t, NULL, &by) == 0;
}

static int dial_tcp(const struct sockaddr_in *a) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(c, (const struct sockaddr *)a, sizeof *a)) perror("connect");
    return c;
}

/* An event loop whose threads wait before its first socket exists, as the BEAM's
 * poll threads do: a thread waits on a set that holds only a pipe; then the
 * process's first socket, a listener, joins the set (EPOLLONESHOT), and a
 * connection to it must wake the waiter. Fired once, nothing is armed; while the
 * waiter sleeps again, another thread accepts and re-arms the listener with
 * EPOLL_CTL_MOD (which must not wait for the sleeper), and a second connection
 * must wake it. */
static void early_waiters(const char *addr, int port) {
    int p[2];
    if (pipe(p)) { perror("pipe"); exit(1); }
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.u64 = 2};
    epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &e);
    pthread_t t;
    pthread_create(&t, NULL, waiter, &ep);
    usleep(100000); /* asleep by now */
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, addr, &a.sin_addr);
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 8)) { perror("listen"); exit(1); }
    e.events = EPOLLIN | EPOLLONESHOT;
    e.data.u64 = 3;
    epoll_ctl(ep, EPOLL_CTL_ADD, l, &e);
    int c1 = dial_tcp(&a);
    check(joined_in_time(t) && waited_n == 1 && waited_data == 3,
          "epoll: a waiter from before the first socket woken by it");
    pthread_create(&t, NULL, waiter, &ep);
    usleep(100000);
    int s1 = accept(l, NULL, NULL);
    check(epoll_ctl(ep, EPOLL_CTL_MOD, l, &e) == 0, "epoll: re-armed while a waiter sleeps");
    int c2 = dial_tcp(&a);
    check(joined_in_time(t) && waited_n == 1 && waited_data == 3,
          "epoll: the re-armed one-shot listener wakes the waiter");
    int s2 = accept(l, NULL, NULL);
    int fds[] = {c1, c2, s1, s2, l, ep, p[0], p[1]};
    for (size_t i = 0; i < sizeof fds / sizeof fds[0]; i++) close(fds[i]);
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void *writer(void *x) {
    (void)x;
    for (int i = 0; i < 400; i++) {
        usleep(2000 + rand() % 1000);
        sent_at = now_us();
        char c = 1;
        if (write(pw, &c, 1) != 1) break;
    }
    return NULL;
}

static long long busy_ticks(void) {
    long long v[8] = {0};
    FILE *f = fopen("/proc/stat", "r");
    if (!f || fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2],
                     &v[3], &v[4], &v[5], &v[6], &v[7]) != 8) {
        if (f) fclose(f);
        return 0;
    }
    fclose(f);
    return v[0] + v[1] + v[2] + v[5] + v[6];
}

static void measure(int ep, const char *addr, int port, int n) {
    pthread_t t;
    pthread_create(&t, NULL, writer, NULL);
    double lat[400];
    int k = 0;
    struct epoll_event ev[4];
    while (k < 400) {
        if (epoll_wait(ep, ev, 4, 5000) <= 0) break;
        double woke = now_us();
        drain();
        lat[k++] = woke - sent_at;
    }
    pthread_join(t, NULL);
    qsort(lat, k, sizeof(double), cmp);
    if (k > 0)
        fprintf(stderr, "a pipe's wake-up in a mixed epoll_wait: median %.1f us, p90 %.1f us\n",
                lat[k / 2], lat[k * 9 / 10]);
    pid_t kids[1024];
    if (n > 1024) n = 1024;
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) {
            int e = setup(addr, port + 1 + i);
            for (;;) epoll_wait(e, ev, 4, -1);
        }
        kids[i] = p;
    }
    sleep(1);
    long long b0 = busy_ticks();
    sleep(3);
    long long b1 = busy_ticks();
    fprintf(stderr, "%d idle mixed waiters: %.1f%% of a core busy (the whole machine)\n", n,
            100.0 * (b1 - b0) / sysconf(_SC_CLK_TCK) / 3);
    for (int i = 0; i < n; i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ADDR PORT [measure N]\n", argv[0]);
        return 2;
    }
    alarm(120); /* the whole run's deadline */
    /* First: before this process has any socket. */
    early_waiters(argv[1], atoi(argv[2]) + 3);
    int ep = setup(argv[1], atoi(argv[2]));
    struct epoll_event ev[4];
    check(epoll_wait(ep, ev, 4, 0) == 0, "epoll: nothing yet");

    pthread_t t = soon("p");
    int n = epoll_wait(ep, ev, 4, 10000);
    check(n == 1 && ev[0].data.u64 == 2, "epoll woken by the pipe");
    pthread_join(t, NULL);
    drain();

    t = soon("s");
    n = epoll_wait(ep, ev, 4, 10000);
    check(n == 1 && ev[0].data.u64 == 1, "epoll woken by the socket");
    pthread_join(t, NULL);
    take_datagram();

    struct pollfd fds[2] = {{.fd = u, .events = POLLIN}, {.fd = pr, .events = POLLIN}};
    t = soon("p");
    n = poll(fds, 2, 10000);
    check(n == 1 && fds[0].revents == 0 && fds[1].revents == POLLIN, "poll woken by the pipe");
    pthread_join(t, NULL);
    drain();

    fds[1].revents = 0;
    t = soon("s");
    n = poll(fds, 2, 10000);
    check(n == 1 && fds[0].revents == POLLIN && fds[1].revents == 0, "poll woken by the socket");
    pthread_join(t, NULL);
    take_datagram();

    fd_set r;
    FD_ZERO(&r);
    FD_SET(u, &r);
    FD_SET(pr, &r);
    int top = (u > pr ? u : pr) + 1;
    struct timeval tv = {.tv_sec = 10};
    t = soon("p");
    n = select(top, &r, NULL, NULL, &tv);
    check(n == 1 && FD_ISSET(pr, &r) && !FD_ISSET(u, &r), "select woken by the pipe");
    pthread_join(t, NULL);
    drain();

    FD_ZERO(&r);
    FD_SET(u, &r);
    FD_SET(pr, &r);
    tv.tv_sec = 10;
    t = soon("s");
    n = select(top, &r, NULL, NULL, &tv);
    check(n == 1 && FD_ISSET(u, &r) && !FD_ISSET(pr, &r), "select woken by the socket");
    pthread_join(t, NULL);
    take_datagram();

    if (argc >= 5 && strcmp(argv[3], "measure") == 0)
        measure(ep, argv[1], atoi(argv[2]), atoi(argv[4]));
    printf("all ok\n");
    return 0;
}
