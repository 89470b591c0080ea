/* fork_handlers_lib.c - a library that installs fork handlers in its constructor and
 * makes socket calls in them, as a library may (one that keeps a connection and must
 * close or reopen it around a fork). A library's constructor runs before an
 * LD_PRELOAD shim's, so under the shim these handlers run while the shim holds its
 * locks across the fork (docs/preload.md "fork"): their calls must go through it.
 * Linked by fork_handlers.c. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <unistd.h>

/* What the handlers saw, read by the program: sockets made, sockets that failed. */
int fork_handlers_made, fork_handlers_failed;

/* A new socket, looked up and closed again. */
static void socket_round(void) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) {
        fork_handlers_failed++;
        return;
    }
    struct sockaddr_in a;
    socklen_t n = sizeof a;
    int one = 1;
    if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        getsockname(s, (struct sockaddr *)&a, &n) != 0)
        fork_handlers_failed++;
    else
        fork_handlers_made++;
    close(s);
}

static void prepare(void) { socket_round(); }
static void parent(void) { socket_round(); }

__attribute__((constructor)) static void install(void) {
    pthread_atfork(prepare, parent, NULL);
}
