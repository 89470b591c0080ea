/* sockets_errno - the socket semantics a program relies on, checked one by one; the
 * same output on the kernel and on usnet is the test (see usnet_or_kernel.h).
 *
 *   sockets_errno ADDR PORT       (PORT and PORT+1 must be free)
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <fcntl.h>

#include "usnet_or_kernel.h"

#ifdef USE_USNET
#define S_EPOLL_CREATE1 usnet_epoll_create1
#define S_EPOLL_CTL     usnet_epoll_ctl
#define S_EPOLL_WAIT    usnet_epoll_wait
#else
#define S_EPOLL_CREATE1 epoll_create1
#define S_EPOLL_CTL     epoll_ctl
#define S_EPOLL_WAIT    epoll_wait
#endif

#include "check.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    struct sockaddr_in closed = a;
    closed.sin_port = htons(atoi(argv[2]) + 1);

    int l = S_SOCKET(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    S_SETSOCKOPT(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK("bind", S_BIND(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK("listen", S_LISTEN(l, 8) == 0);
    int acc = 0;
    socklen_t len = sizeof acc;
    CHECK("SO_ACCEPTCONN", S_GETSOCKOPT(l, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len) == 0 && acc == 1);

    /* Non-blocking connect: EINPROGRESS, then POLLOUT and SO_ERROR 0. */
    int c = S_SOCKET(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int r = S_CONNECT(c, (struct sockaddr *)&a, sizeof a);
    CHECK("connect EINPROGRESS", r < 0 && errno == EINPROGRESS);
    struct pollfd p = {.fd = c, .events = POLLOUT};
    CHECK("poll POLLOUT", S_POLL(&p, 1, 5000) == 1 && (p.revents & POLLOUT));
    int err = -1;
    len = sizeof err;
    CHECK("SO_ERROR 0", S_GETSOCKOPT(c, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0);

    int s = S_ACCEPT(l, NULL, NULL);
    CHECK("accept", s >= 0);
    int type = 0;
    len = sizeof type;
    CHECK("SO_TYPE", S_GETSOCKOPT(s, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM);
    struct tcp_info ti;
    len = sizeof ti;
    CHECK("TCP_INFO established",
          S_GETSOCKOPT(s, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 && ti.tcpi_state == 1);

    /* Nothing to read on a non-blocking socket: EAGAIN. */
    char buf[64];
    errno = 0;
    CHECK("recv EAGAIN", S_RECV(c, buf, sizeof buf, 0) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
    /* MSG_DONTWAIT on a blocking socket: EAGAIN too. */
    errno = 0;
    CHECK("MSG_DONTWAIT EAGAIN",
          S_RECV(s, buf, sizeof buf, MSG_DONTWAIT) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));

    /* poll over a pipe and a socket. */
    int pfd[2];
    if (pipe(pfd) != 0) return 1;
    struct pollfd two[2] = {{.fd = pfd[0], .events = POLLIN}, {.fd = s, .events = POLLIN}};
    if (write(pfd[1], "x", 1) != 1) return 1;
    r = S_POLL(two, 2, 5000);
    CHECK("poll pipe only", r == 1 && (two[0].revents & POLLIN) && two[1].revents == 0);
    char x;
    if (read(pfd[0], &x, 1) != 1) return 1;
    CHECK("send", S_SEND(c, "hello", 5, 0) == 5);
    r = S_POLL(two, 2, 5000);
    CHECK("poll socket only", r == 1 && two[0].revents == 0 && (two[1].revents & POLLIN));
    CHECK("recv 5", S_RECV(s, buf, sizeof buf, 0) == 5 && memcmp(buf, "hello", 5) == 0);

    /* epoll with the socket and the pipe. */
    int ep = S_EPOLL_CREATE1(0);
    struct epoll_event ev = {.events = EPOLLIN, .data.u64 = 7};
    CHECK("epoll_ctl socket", S_EPOLL_CTL(ep, EPOLL_CTL_ADD, s, &ev) == 0);
    struct epoll_event ev2 = {.events = EPOLLIN, .data.u64 = 9};
    CHECK("epoll_ctl pipe", S_EPOLL_CTL(ep, EPOLL_CTL_ADD, pfd[0], &ev2) == 0);
    errno = 0;
    CHECK("epoll_ctl EEXIST", S_EPOLL_CTL(ep, EPOLL_CTL_ADD, s, &ev) < 0 && errno == EEXIST);
    struct epoll_event out[4];
    CHECK("epoll_wait nothing", S_EPOLL_WAIT(ep, out, 4, 50) == 0);
    CHECK("send again", S_SEND(c, "abc", 3, 0) == 3);
    r = S_EPOLL_WAIT(ep, out, 4, 5000);
    CHECK("epoll_wait socket", r == 1 && out[0].data.u64 == 7 && (out[0].events & EPOLLIN));
    if (write(pfd[1], "y", 1) != 1) return 1;
    int seen7 = 0, seen9 = 0;
    r = S_EPOLL_WAIT(ep, out, 4, 5000);
    for (int i = 0; i < r; i++) {
        seen7 |= out[i].data.u64 == 7;
        seen9 |= out[i].data.u64 == 9;
    }
    CHECK("epoll_wait both (level)", r == 2 && seen7 && seen9);
    S_CLOSE(ep);

    /* The peer's shutdown: end of stream after the data. */
    CHECK("shutdown", S_SHUTDOWN(c, SHUT_WR) == 0);
    int got = 0;
    for (int i = 0; i < 100; i++) {
        ssize_t n = S_RECV(s, buf, sizeof buf, 0);
        if (n <= 0) {
            CHECK("end of stream", n == 0 && got == 3);
            break;
        }
        got += (int)n;
    }

    /* A blocking connect to a closed port: ECONNREFUSED. */
    int d = S_SOCKET(AF_INET, SOCK_STREAM, 0);
    errno = 0;
    CHECK("ECONNREFUSED", S_CONNECT(d, (struct sockaddr *)&closed, sizeof closed) < 0 && errno == ECONNREFUSED);
    S_CLOSE(d);

    /* Closing a socket takes it out of an epoll set: its number, given to a new
     * socket, can be added again. */
    {
        int e3 = S_EPOLL_CREATE1(0);
        int x = S_SOCKET(AF_INET, SOCK_DGRAM, 0);
        struct epoll_event ex = {.events = EPOLLIN, .data.u64 = 1};
        CHECK("epoll_ctl udp", S_EPOLL_CTL(e3, EPOLL_CTL_ADD, x, &ex) == 0);
        S_CLOSE(x);
        int y = S_SOCKET(AF_INET, SOCK_DGRAM, 0);
        CHECK("number reused", y == x);
        CHECK("epoll_ctl ADD after close", S_EPOLL_CTL(e3, EPOLL_CTL_ADD, y, &ex) == 0);
        S_CLOSE(y);
        S_CLOSE(e3);
    }

    /* Edge-triggered EPOLLOUT: fill the send buffer, let the peer read, and the
     * writer is told once there is room again. */
    {
        int c2 = S_SOCKET(AF_INET, SOCK_STREAM, 0);
        CHECK("connect 2", S_CONNECT(c2, (struct sockaddr *)&a, sizeof a) == 0);
        int s2 = S_ACCEPT(l, NULL, NULL);
        CHECK("accept 2", s2 >= 0);
        /* TCP_CORK holds a partial segment; lifting it sends it. */
        CHECK("TCP_CORK on", S_SETSOCKOPT(c2, IPPROTO_TCP, TCP_CORK, &one, sizeof one) == 0);
        int ck = 0;
        socklen_t cl = sizeof ck;
        CHECK("TCP_CORK reads back", S_GETSOCKOPT(c2, IPPROTO_TCP, TCP_CORK, &ck, &cl) == 0 && ck == 1);
        CHECK("send corked", S_SEND(c2, "ab", 2, 0) == 2);
        int zero = 0;
        CHECK("TCP_CORK off", S_SETSOCKOPT(c2, IPPROTO_TCP, TCP_CORK, &zero, sizeof zero) == 0);
        char two[4];
        CHECK("uncorked bytes arrive", S_RECV(s2, two, sizeof two, 0) == 2 && memcmp(two, "ab", 2) == 0);
        S_FCNTL(c2, F_SETFL, O_NONBLOCK);
        S_FCNTL(s2, F_SETFL, O_NONBLOCK);
        static char big[65536];
        /* Fill until a send right after a pause still finds no room: the stack has
         * taken all it can, so the next room comes only when the peer reads. */
        int settled = 0;
        for (int pass = 0; pass < 50 && !settled; pass++) {
            int first = 1;
            for (int i = 0; i < 4096; i++, first = 0) {
                if (S_SEND(c2, big, sizeof big, MSG_NOSIGNAL) > 0) continue;
                settled = first && (errno == EAGAIN || errno == EWOULDBLOCK);
                break;
            }
            usleep(50000);
        }
        CHECK("send buffer full", settled);
        int e2 = S_EPOLL_CREATE1(0);
        struct epoll_event eo = {.events = EPOLLOUT | EPOLLET, .data.u64 = 5};
        CHECK("epoll_ctl EPOLLET", S_EPOLL_CTL(e2, EPOLL_CTL_ADD, c2, &eo) == 0);
        struct epoll_event o2[2];
        CHECK("no EPOLLOUT while full", S_EPOLL_WAIT(e2, o2, 2, 0) == 0);
        int woke = 0;
        for (int round = 0; round < 200 && !woke; round++) {
            ssize_t n;
            while ((n = S_RECV(s2, big, sizeof big, 0)) > 0) {}
            r = S_EPOLL_WAIT(e2, o2, 2, 50);
            woke = r == 1 && o2[0].data.u64 == 5 && (o2[0].events & EPOLLOUT);
        }
        CHECK("EPOLLOUT edge after the peer read", woke);
        S_CLOSE(e2);
        S_CLOSE(c2);
        S_CLOSE(s2);
    }

    /* dup: a second number for the same connection. Flags are shared (one open
     * file description), FD_CLOEXEC is per number, and the connection lasts until
     * its last number is closed. dup2 onto a number makes it name the socket. */
    {
        int c3 = S_SOCKET(AF_INET, SOCK_STREAM, 0);
        CHECK("connect 3", S_CONNECT(c3, (struct sockaddr *)&a, sizeof a) == 0);
        int s3 = S_ACCEPT(l, NULL, NULL);
        CHECK("accept 3", s3 >= 0);
        int d3 = S_DUP(c3);
        CHECK("dup", d3 >= 0 && d3 != c3);
        CHECK("O_NONBLOCK shared", S_FCNTL(c3, F_SETFL, O_NONBLOCK) == 0 &&
                                       (S_FCNTL(d3, F_GETFL, 0) & O_NONBLOCK));
        S_FCNTL(c3, F_SETFL, 0);
        CHECK("FD_CLOEXEC per number", S_FCNTL(d3, F_SETFD, FD_CLOEXEC) == 0 &&
                                           S_FCNTL(c3, F_GETFD, 0) == 0 &&
                                           S_FCNTL(d3, F_GETFD, 0) == FD_CLOEXEC);
        char b3[8];
        CHECK("send through the dup", S_SEND(d3, "dup", 3, 0) == 3 &&
                                          S_RECV(s3, b3, sizeof b3, 0) == 3 && memcmp(b3, "dup", 3) == 0);
        CHECK("close the first number", S_CLOSE(c3) == 0);
        CHECK("the dup still sends", S_SEND(d3, "one", 3, 0) == 3 &&
                                         S_RECV(s3, b3, sizeof b3, 0) == 3 && memcmp(b3, "one", 3) == 0);
        int f3 = S_FCNTL(d3, F_DUPFD, 100);
        CHECK("F_DUPFD at or above 100", f3 >= 100);
        int p3[2];
        if (pipe(p3) != 0) return 1;
        CHECK("dup2 onto a pipe's number", S_DUP2(d3, p3[0]) == p3[0]);
        CHECK("that number sends", S_SEND(p3[0], "two", 3, 0) == 3 &&
                                       S_RECV(s3, b3, sizeof b3, 0) == 3 && memcmp(b3, "two", 3) == 0);
        CHECK("dup2 onto itself", S_DUP2(d3, d3) == d3);
        S_CLOSE(d3);
        S_CLOSE(p3[0]);
        CHECK("not closed while a number is open", S_RECV(s3, b3, sizeof b3, MSG_DONTWAIT) < 0 &&
                                                       (errno == EAGAIN || errno == EWOULDBLOCK));
        S_CLOSE(f3);
        CHECK("the last number closes it", S_RECV(s3, b3, sizeof b3, 0) == 0);
        close(p3[1]);
        S_CLOSE(s3);
    }

    /* sendfile: at an offset (the offset moves, the file's position does not),
     * then from the file's position (which moves), then at the end of the file. */
    {
        int c4 = S_SOCKET(AF_INET, SOCK_STREAM, 0);
        CHECK("connect 4", S_CONNECT(c4, (struct sockaddr *)&a, sizeof a) == 0);
        int s4 = S_ACCEPT(l, NULL, NULL);
        CHECK("accept 4", s4 >= 0);
        char path[] = "/tmp/usnet-sendfile-XXXXXX";
        int f = mkstemp(path);
        if (f < 0) return 1;
        unlink(path);
        static char file[100000];
        for (size_t i = 0; i < sizeof file; i++) file[i] = (char)(i * 7 % 251);
        if (write(f, file, sizeof file) != (ssize_t)sizeof file) return 1;
        lseek(f, 0, SEEK_SET);
        off_t off = 1000;
        CHECK("sendfile at an offset", S_SENDFILE(c4, f, &off, 50000) == 50000 && off == 51000 &&
                                           lseek(f, 0, SEEK_CUR) == 0);
        static char got[100000];
        size_t have = 0;
        while (have < 50000) {
            ssize_t n = S_RECV(s4, got + have, 50000 - have, 0);
            if (n <= 0) break;
            have += (size_t)n;
        }
        CHECK("its bytes", have == 50000 && memcmp(got, file + 1000, 50000) == 0);
        lseek(f, 99000, SEEK_SET);
        CHECK("sendfile from the position", S_SENDFILE(c4, f, NULL, 5000) == 1000 &&
                                                lseek(f, 0, SEEK_CUR) == 100000);
        CHECK("sendfile at the end", S_SENDFILE(c4, f, NULL, 5000) == 0);
        have = 0;
        while (have < 1000) {
            ssize_t n = S_RECV(s4, got + have, 1000 - have, 0);
            if (n <= 0) break;
            have += (size_t)n;
        }
        CHECK("those bytes", have == 1000 && memcmp(got, file + 99000, 1000) == 0);
        close(f);
        S_CLOSE(c4);
        S_CLOSE(s4);
    }

    /* A closed descriptor: EBADF. */
    CHECK("close", S_CLOSE(c) == 0);
    errno = 0;
    CHECK("EBADF", S_SEND(c, "x", 1, MSG_NOSIGNAL) < 0 && errno == EBADF);
    int fl = S_FCNTL(s, F_GETFL, 0);
    CHECK("F_GETFL blocking", fl >= 0 && !(fl & O_NONBLOCK));
    CHECK("F_SETFL O_NONBLOCK", S_FCNTL(s, F_SETFL, fl | O_NONBLOCK) == 0 && (S_FCNTL(s, F_GETFL, 0) & O_NONBLOCK));
    S_CLOSE(s);
    S_CLOSE(l);
    printf("%s\n", failures ? "FAILED" : "all ok");
    return failures != 0;
}
