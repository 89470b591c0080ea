/* exec.c - sockets kept across exec, as inetd-style servers, CGI, socket activation,
 * a shell's `exec 3<>/dev/tcp/...` and nginx's binary upgrade use them:
 *   - a listener (no FD_CLOEXEC) handed to a program started with fork + execv, which
 *     accepts and answers;
 *   - a connection handed to a program started with posix_spawn, then the parent
 *     closes its copy: the program reads the request, answers, and its close ends
 *     the stream;
 *   - the same through system() (a shell between, the program in the background)
 *     and popen();
 *   - execve with an empty environment (a program that clears it);
 *   - execl after the program emptied its own environment in place (postfix's
 *     clean_env: environ[0] = NULL), system after clearenv(), and execle with an
 *     empty environment;
 *   - a socket with FD_CLOEXEC is closed in the new program;
 *   - a shell's /dev/tcp connection written and read by external commands
 *     (`cat >&3`, `cat <&3`; bash's own echo writes through stdio, which calls
 *     glibc's internal write, past any LD_PRELOAD shim);
 *   - as root: a child that drops to uid/gid 65534 right after fork, before its first
 *     socket call, serves from the inherited listener (nginx's workers, sshd).
 * Only the parent prints; the programs it starts report through their exit status.
 * Every wait has a deadline (SO_RCVTIMEO, alarm). The same output on the kernel and
 * under the LD_PRELOAD shim (crates/usnet-preload/tests).
 * usage: exec ADDR PORT  (the program runs itself with --child-* to play the
 * started program) */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"

extern char **environ;

static struct sockaddr_in addr;
static char self[4096];

static void timeouts(int fd, int secs) {
    struct timeval tv = {secs, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

static int read_n(int fd, char *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, buf + got, n - got);
        if (k <= 0) return -1;
        got += (size_t)k;
    }
    return 0;
}

static int listener(int port, int cloexec) {
    int l = socket(AF_INET, SOCK_STREAM | (cloexec ? SOCK_CLOEXEC : 0), 0);
    int one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = addr;
    a.sin_port = htons(port);
    if (bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 16) != 0) return -1;
    return l;
}

static int status_of(pid_t pid) {
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st)) return -1;
    return WEXITSTATUS(st);
}

/* Answers "pong" to one "ping" on connection s (uses read/write, as a program that
 * thinks it got a pipe or a terminal would). */
static int answer(int s) {
    char req[4];
    if (read_n(s, req, 4) != 0 || memcmp(req, "ping", 4) != 0) return 11;
    if (write(s, "pong", 4) != 4) return 12;
    return 0;
}

/* The client side of one exchange on connection c: "ping", then "pong" and EOF. */
static int exchange(int c) {
    char buf[8];
    if (send(c, "ping", 4, 0) != 4) return -1;
    if (read_n(c, buf, 4) != 0 || memcmp(buf, "pong", 4) != 0) return -1;
    return recv(c, buf, 1, 0) == 0 ? 0 : -1;
}

/* ------------------------------------------------------------ the started programs */

static int child_main(const char *role, int fd) {
    alarm(20);
    if (strcmp(role, "--child-listen") == 0) {
        int s = accept(fd, NULL, NULL);
        if (s < 0) return 10;
        timeouts(s, 10);
        int r = answer(s);
        close(s);
        return r;
    }
    if (strcmp(role, "--child-conn") == 0) {
        timeouts(fd, 10);
        int r = answer(fd);
        close(fd);
        return r;
    }
    if (strcmp(role, "--child-closed") == 0) {
        /* An FD_CLOEXEC socket's number is closed in the new program. */
        return fcntl(fd, F_GETFD) == -1 && errno == EBADF ? 0 : 13;
    }
    return 2;
}

/* ------------------------------------------------------------ the parent's cases */

static int port_base;

/* A listener handed to fork + execv of `--child-listen FD`. */
static void listener_through_fork_and_exec(void) {
    int l = listener(port_base + 1, 0);
    CHECK("exec: a listener for the started program", l >= 0);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", l);
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {self, "--child-listen", fdarg, NULL};
        execv(self, argv);
        _exit(127);
    }
    close(l);
    struct sockaddr_in a = addr;
    a.sin_port = htons(port_base + 1);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    timeouts(c, 10);
    int ok = connect(c, (struct sockaddr *)&a, sizeof a) == 0 && exchange(c) == 0;
    close(c);
    CHECK("exec: the exec'd program accepts on the inherited listener and answers", ok);
    CHECK("exec: the exec'd program exits 0", status_of(pid) == 0);
}

/* A connection accepted here, handed to a program started by `start`, closed here. */
static void connection_handed_over(const char *name, int (*start)(int fd, pid_t *pid)) {
    int l = listener(port_base + 2, 1);
    struct sockaddr_in a = addr;
    a.sin_port = htons(port_base + 2);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    timeouts(c, 10);
    int ok = connect(c, (struct sockaddr *)&a, sizeof a) == 0;
    int s = ok ? accept(l, NULL, NULL) : -1; /* no SOCK_CLOEXEC: inherited */
    close(l);
    pid_t pid = -1;
    int started = s >= 0 && start(s, &pid) == 0;
    if (s >= 0) close(s);
    char line[128];
    snprintf(line, sizeof line, "%s: the started program answers on the connection, its close ends it", name);
    CHECK(line, started && exchange(c) == 0);
    close(c);
    if (pid > 0) {
        snprintf(line, sizeof line, "%s: the started program exits 0", name);
        CHECK(line, status_of(pid) == 0);
    }
}

static int start_spawn(int fd, pid_t *pid) {
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    char *argv[] = {self, "--child-conn", fdarg, NULL};
    return posix_spawn(pid, self, NULL, NULL, argv, environ);
}

static int start_empty_env(int fd, pid_t *pid) {
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    *pid = fork();
    if (*pid == 0) {
        char *argv[] = {self, "--child-conn", fdarg, NULL};
        char *envp[] = {NULL};
        execve(self, argv, envp);
        _exit(127);
    }
    return *pid > 0 ? 0 : -1;
}

static char sys_cmd[4200];

/* A child that empties its environment in place, as postfix's clean_env does, then
 * starts the program with execl (which uses that environment). */
static int start_execl_emptied_env(int fd, pid_t *pid) {
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    *pid = fork();
    if (*pid == 0) {
        if (environ) environ[0] = NULL;
        execl(self, self, "--child-conn", fdarg, (char *)NULL);
        _exit(127);
    }
    return *pid > 0 ? 0 : -1;
}

/* execle with an empty environment: the list, then the environment after its NULL. */
static int start_execle_empty_env(int fd, pid_t *pid) {
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", fd);
    *pid = fork();
    if (*pid == 0) {
        char *envp[] = {NULL};
        execle(self, self, "--child-conn", fdarg, (char *)NULL, envp);
        _exit(127);
    }
    return *pid > 0 ? 0 : -1;
}

/* A child that calls clearenv(), then system(): the shell and the program start
 * from that environment. */
static int start_system_cleared_env(int fd, pid_t *pid) {
    *pid = fork();
    if (*pid == 0) {
        clearenv();
        snprintf(sys_cmd, sizeof sys_cmd, "'%s' --child-conn %d &", self, fd);
        int st = system(sys_cmd);
        _exit(WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1);
    }
    return *pid > 0 ? 0 : -1;
}

/* The shell starts the program in the background and exits: system() returns once
 * the program holds the connection. */
static int start_system(int fd, pid_t *pid) {
    *pid = -1;
    snprintf(sys_cmd, sizeof sys_cmd, "'%s' --child-conn %d &", self, fd);
    int st = system(sys_cmd);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

static FILE *popened;
static int start_popen(int fd, pid_t *pid) {
    *pid = -1;
    snprintf(sys_cmd, sizeof sys_cmd, "'%s' --child-conn %d", self, fd);
    popened = popen(sys_cmd, "r");
    return popened ? 0 : -1;
}

static void cloexec_socket_closes_at_exec(void) {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    char fdarg[16];
    snprintf(fdarg, sizeof fdarg, "%d", s);
    pid_t pid = fork();
    if (pid == 0) {
        char *argv[] = {self, "--child-closed", fdarg, NULL};
        execv(self, argv);
        _exit(127);
    }
    CHECK("exec: an FD_CLOEXEC socket is closed in the new program", status_of(pid) == 0);
    close(s);
}

/* bash's /dev/tcp: the connection bash makes, read by cat through fd 3. */
struct served {
    int l;
    int ok;
};
static void *serve_shell(void *arg) {
    struct served *sv = arg;
    int s = accept(sv->l, NULL, NULL);
    if (s < 0) return NULL;
    timeouts(s, 10);
    char req[3];
    if (read_n(s, req, 3) == 0 && memcmp(req, "hi\n", 3) == 0 && write(s, "reply\n", 6) == 6)
        sv->ok = 1;
    close(s);
    return NULL;
}

static void shell_dev_tcp(void) {
    if (access("/bin/bash", X_OK) != 0) {
        printf("ok shell: (no bash)\n");
        return;
    }
    struct served sv = {listener(port_base + 3, 1), 0};
    pthread_t t;
    pthread_create(&t, NULL, serve_shell, &sv);
    char ip[32];
    inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "/bin/bash -c 'exec 3<>/dev/tcp/%s/%d; echo hi | cat >&3; timeout 10 cat <&3'", ip,
             port_base + 3);
    FILE *f = popen(cmd, "r");
    char out[64] = {0};
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    int st = f ? pclose(f) : -1;
    pthread_join(t, NULL);
    close(sv.l);
    CHECK("shell: bash's /dev/tcp connection read by cat through fd 3",
          sv.ok && n == 6 && memcmp(out, "reply\n", 6) == 0 && st == 0);
}

static void setuid_after_fork(void) {
    if (getuid() != 0) {
        printf("ok setuid: (not root)\n");
        return;
    }
    int l = listener(port_base + 4, 1);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(20);
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(20);
        int s = accept(l, NULL, NULL);
        if (s < 0) _exit(10);
        timeouts(s, 10);
        int r = answer(s);
        close(s);
        _exit(r);
    }
    close(l);
    struct sockaddr_in a = addr;
    a.sin_port = htons(port_base + 4);
    int c = socket(AF_INET, SOCK_STREAM, 0);
    timeouts(c, 10);
    int ok = connect(c, (struct sockaddr *)&a, sizeof a) == 0 && exchange(c) == 0;
    close(c);
    CHECK("setuid: a child that dropped to nobody after fork serves the inherited listener", ok);
    CHECK("setuid: the child exits 0", status_of(pid) == 0);
}

int main(int argc, char **argv) {
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 2;
    self[n] = 0;
    if (argc == 3 && strncmp(argv[1], "--child-", 8) == 0)
        return child_main(argv[1], atoi(argv[2]));
    if (argc != 3) {
        fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    addr.sin_family = AF_INET;
    inet_pton(AF_INET, argv[1], &addr.sin_addr);
    port_base = atoi(argv[2]);
    addr.sin_port = htons(port_base);

    listener_through_fork_and_exec();
    connection_handed_over("posix_spawn", start_spawn);
    connection_handed_over("execve with an empty environment", start_empty_env);
    connection_handed_over("execl after environ[0] = NULL", start_execl_emptied_env);
    connection_handed_over("system after clearenv", start_system_cleared_env);
    connection_handed_over("execle with an empty environment", start_execle_empty_env);
    connection_handed_over("system", start_system);
    connection_handed_over("popen", start_popen);
    CHECK("popen: the command exits 0", popened && pclose(popened) == 0);
    cloexec_socket_closes_at_exec();
    shell_dev_tcp();
    setuid_after_fork();

    if (failures == 0) printf("all ok\n");
    return failures ? 1 : 0;
}
