/* stdio.c - stdio streams on sockets: fdopen'd connections read and written with
 * fprintf/fgets and closed with fclose; stdout, stderr and stdin moved onto
 * connections with dup2 and back (output still buffered when the number moves goes
 * where the kernel's stream would write it at its next flush). glibc's streams
 * write with its internal write, which no LD_PRELOAD shim sees: the shim's own
 * streams stand in for them on usnet sockets. The same output on the kernel and
 * under the shim (crates/usnet-preload/tests). usage: stdio ADDR PORT */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check.h"

static struct sockaddr_in a;
static int l;

/* A connection: the peer's end in *peer (reads time out after 5 s), ours returned. */
static int connection(int *peer) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    struct timeval tv = {5, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(c, (struct sockaddr *)&a, sizeof a) != 0)
        return -1;
    *peer = c;
    return accept(l, NULL, NULL);
}

/* Whether the peer receives exactly `want`. */
static int receives(int c, const char *want) {
    char buf[256];
    size_t n = strlen(want), got = 0;
    while (got < n) {
        ssize_t r = recv(c, buf + got, n - got, 0);
        if (r <= 0)
            return 0;
        got += r;
    }
    return memcmp(buf, want, n) == 0;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    alarm(30);
    /* Fully buffered (as a pipe is anyway): output can wait in the stream. */
    setvbuf(stdout, NULL, _IOFBF, BUFSIZ);
    a.sin_family = AF_INET;
    a.sin_port = htons(atoi(argv[2]));
    inet_pton(AF_INET, argv[1], &a.sin_addr);
    l = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    CHECK("bind", bind(l, (struct sockaddr *)&a, sizeof a) == 0);
    CHECK("listen", listen(l, 8) == 0);

    /* fdopen: both ways, fileno, fclose ends the connection. */
    int c1, s1 = connection(&c1);
    FILE *f = fdopen(s1, "r+");
    CHECK("fdopen", f != NULL);
    CHECK("fileno is the socket's number", fileno(f) == s1);
    fprintf(f, "hello %d\n", 42);
    CHECK("fflush", fflush(f) == 0);
    CHECK("the peer reads the line", receives(c1, "hello 42\n"));
    send(c1, "from the peer\nand more\n", 23, 0);
    char line[64] = "";
    CHECK("fgets", fgets(line, sizeof line, f) && strcmp(line, "from the peer\n") == 0);
    CHECK("fgets again", fgets(line, sizeof line, f) && strcmp(line, "and more\n") == 0);
    CHECK("fclose", fclose(f) == 0);
    char b;
    CHECK("the peer sees the end", recv(c1, &b, 1, 0) == 0);
    CHECK("the number is closed", fcntl(s1, F_GETFD) < 0 && errno == EBADF);
    close(c1);

    /* stdout onto a connection: what waited in stdout goes there too. */
    int c2, s2 = connection(&c2);
    int saved = dup(1);
    printf("waiting ");
    dup2(s2, 1);
    printf("on the connection %d\n", 7);
    fflush(stdout);
    printf("left behind\n");
    dup2(saved, 1);
    close(saved);
    /* "left behind" went back with the number: it is written here, at the flush. */
    CHECK("stdout wrote to the connection", receives(c2, "waiting on the connection 7\n"));
    close(s2);
    CHECK("nothing more reached the connection", recv(c2, &b, 1, 0) == 0);
    close(c2);

    /* stderr (unbuffered) onto a connection. */
    int c3, s3 = connection(&c3);
    saved = dup(2);
    dup2(s3, 2);
    fprintf(stderr, "an error %s\n", "line");
    dup2(saved, 2);
    close(saved);
    CHECK("stderr wrote to the connection at once", receives(c3, "an error line\n"));
    close(s3);
    close(c3);

    /* stdin from a connection. */
    int c4, s4 = connection(&c4);
    send(c4, "line one\nline two\n", 18, 0);
    saved = dup(0);
    dup2(s4, 0);
    int n1 = fgets(line, sizeof line, stdin) && strcmp(line, "line one\n") == 0;
    int n2 = fgets(line, sizeof line, stdin) && strcmp(line, "line two\n") == 0;
    dup2(saved, 0);
    close(saved);
    CHECK("stdin read the first line", n1);
    CHECK("stdin read the second line", n2);
    close(s4);
    close(c4);
    close(l);

    if (failures == 0)
        printf("all ok\n");
    return failures != 0;
}
