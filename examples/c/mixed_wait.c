/* Waits on sockets and kernel descriptors at once, as event loops make them (a
 * socket beside a self-pipe, an eventfd or a signalfd): epoll, poll and select
 * must each wake for either side, at once.
 *
 *   mixed_wait ADDR PORT             the checks; prints the same on the kernel and
 *                                    under the shim, ending "all ok"
 *   mixed_wait ADDR PORT measure N   then how long a pipe's wake-up takes in a
 *                                    mixed epoll_wait (median and p90 of 400), and
 *                                    how busy N idle mixed waiters keep the machine
 */
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
