/* udp_mmsg.c - UDP with sendmmsg/recvmmsg and a connected send/recv, the same output
 * on the kernel and under the LD_PRELOAD shim (crates/usnet-preload/tests).
 * usage: udp_mmsg ADDR PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[2]))};
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    int rx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("bind", bind(rx, (struct sockaddr *)&a, sizeof a) == 0);
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK("connect", connect(tx, (struct sockaddr *)&a, sizeof a) == 0);

    enum { N = 8 };
    char out[N][32], in[N][64];
    struct iovec oiov[N], iiov[N];
    struct mmsghdr om[N], im[N];
    memset(om, 0, sizeof om);
    memset(im, 0, sizeof im);
    for (int i = 0; i < N; i++) {
        int len = snprintf(out[i], sizeof out[i], "datagram %d of %d", i, N);
        oiov[i] = (struct iovec){out[i], (size_t)len};
        om[i].msg_hdr.msg_iov = &oiov[i];
        om[i].msg_hdr.msg_iovlen = 1;
        iiov[i] = (struct iovec){in[i], sizeof in[i]};
        im[i].msg_hdr.msg_iov = &iiov[i];
        im[i].msg_hdr.msg_iovlen = 1;
    }
    CHECK("sendmmsg", sendmmsg(tx, om, N, 0) == N);
    int got = 0;
    for (int tries = 0; tries < 100 && got < N; tries++) {
        int r = recvmmsg(rx, im + got, N - got, MSG_WAITFORONE, NULL);
        if (r <= 0) break;
        got += r;
    }
    CHECK("recvmmsg all", got == N);
    int same = 1;
    for (int i = 0; i < got; i++)
        same &= im[i].msg_len == oiov[i].iov_len && memcmp(in[i], out[i], im[i].msg_len) == 0;
    CHECK("in order and whole", same);
    errno = 0;
    CHECK("recvmmsg EAGAIN", recvmmsg(rx, im, N, MSG_DONTWAIT, NULL) < 0 && errno == EAGAIN);
    CHECK("send", send(tx, "x", 1, 0) == 1);
    char b[8];
    CHECK("recv", recv(rx, b, sizeof b, 0) == 1 && b[0] == 'x');
    close(tx);
    close(rx);
    printf("%s\n", failures ? "FAILED" : "all ok");
    return failures != 0;
}
