/* Read a file through the usnet async system call ring and check it.
 * Usage: async_syscall <file>   (exit status 0 on success) */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "usnet.h"

#define PIECE 4096

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s <file>\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY);
    if (fd < 0) { perror("open"); return 1; }
    struct stat st;
    if (fstat(fd, &st) < 0) { perror("fstat"); return 1; }
    size_t size = (size_t)st.st_size;
    size_t n = (size + PIECE - 1) / PIECE;

    usnet_async_t *h = usnet_async_init(2, 64);
    if (!h) { perror("usnet_async_init"); return 1; }

    /* gettid through the ring runs on an exec thread */
    uint64_t none[6] = {0};
    usnet_async_completion_t c;
    if (usnet_async_submit(h, SYS_gettid, none, 999) != 0) return 1;
    if (usnet_async_wait_one(h, &c, -1) != 0 || c.user_data != 999 || c.result <= 0) return 1;
    if (c.result == syscall(SYS_gettid)) { fprintf(stderr, "gettid ran on the caller?\n"); return 1; }

    /* read the file in PIECE-sized pread64 calls, in batches of 16 */
    char *via_ring = malloc(size + 1);
    usnet_async_call_t calls[16];
    size_t next = 0, done = 0;
    while (done < n) {
        uint32_t k = 0;
        while (k < 16 && next < n) {
            memset(&calls[k], 0, sizeof calls[k]);
            calls[k].num = SYS_pread64;
            calls[k].args[0] = (uint64_t)fd;
            calls[k].args[1] = (uint64_t)(uintptr_t)(via_ring + next * PIECE);
            calls[k].args[2] = PIECE;
            calls[k].args[3] = next * PIECE;
            calls[k].user_data = next;
            k++, next++;
        }
        if (k) {
            int32_t r = usnet_async_submit_batch(h, calls, k);
            if (r != (int32_t)k) { fprintf(stderr, "submit_batch: %d\n", r); return 1; }
        }
        usnet_async_completion_t out[16];
        int32_t got = usnet_async_wakeup(h, out, 16);
        if (got < 0) { fprintf(stderr, "wakeup: %d\n", got); return 1; }
        for (int32_t i = 0; i < got; i++) {
            size_t want = out[i].user_data == n - 1 ? size - (n - 1) * PIECE : PIECE;
            if (out[i].result != (int64_t)want) {
                fprintf(stderr, "piece %llu: result %lld\n", (unsigned long long)out[i].user_data,
                        (long long)out[i].result);
                return 1;
            }
        }
        done += (size_t)got;
    }

    /* errors come back as negative errno */
    uint64_t bad[6] = {(uint64_t)-1 >> 1};
    usnet_async_submit(h, SYS_close, bad, 7);
    if (usnet_async_wait_one(h, &c, 1000000000) != 0 || c.result != -EBADF) return 1;

    /* exit with work pending: cancelled or run, but completed exactly once */
    for (int i = 0; i < 8; i++) usnet_async_submit(h, SYS_getppid, NULL, 100 + i);
    usnet_async_exit(h, USNET_ASYNC_EXIT_CANCEL);
    int reaped = 0;
    while (usnet_async_poll(h, &c, 1) == 1) reaped++;
    if (reaped != 8 || usnet_async_in_flight(h) != 0) { fprintf(stderr, "reaped %d\n", reaped); return 1; }
    if (usnet_async_submit(h, SYS_getpid, NULL, 0) != -ESHUTDOWN) return 1;

    /* compare with a plain read */
    char *plain = malloc(size + 1);
    if (pread(fd, plain, size, 0) != (ssize_t)size) { perror("pread"); return 1; }
    if (memcmp(plain, via_ring, size) != 0) { fprintf(stderr, "content mismatch\n"); return 1; }

    usnet_async_errors_t e;
    usnet_async_errors(h, &e);
    usnet_async_destroy(h);
    printf("ok: read %zu bytes in %zu calls through the ring (errors %llu)\n", size, n,
           (unsigned long long)(e.bad_index + e.bad_state + e.unknown_state + e.bad_completion + e.queue_corrupt));
    free(plain);
    free(via_ring);
    close(fd);
    return 0;
}
