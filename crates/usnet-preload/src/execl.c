/* execl, execlp and execle for the shim. glibc's own run its internal execve,
 * which no shim sees, so a program that emptied its environment in place
 * (postfix's clean_env sets environ[0] = NULL) would start its programs without
 * the shim. These gather the arguments and call execv, execvp and execve: the
 * shim's definitions (a preloaded library's are found first), which put the
 * settings back. In C because Rust (stable) cannot define a C-variadic function;
 * the exported execl, execlp and execle are naked Rust functions that jump here
 * (src/spawn.rs), since a cdylib exports only what Rust defines. */
#include <stdarg.h>
#include <stddef.h>

/* Declared here without glibc's nonnull attributes: `arg` may be NULL. */
int execv(const char *path, char *const argv[]);
int execvp(const char *file, char *const argv[]);
int execve(const char *path, char *const argv[], char *const envp[]);

/* n: how many arguments, `arg` the first, come before the terminating NULL. */
#define COUNT(n, arg)                                                   \
    do {                                                                \
        va_list ap;                                                     \
        va_start(ap, arg);                                              \
        n = 0;                                                          \
        if (arg)                                                        \
            for (n = 1; va_arg(ap, const char *) != NULL; n++) continue; \
        va_end(ap);                                                     \
    } while (0)

/* argv[0..n] from `arg` and the n - 1 arguments after it, then NULL; `ap` is left
 * just past the last of them (at the terminating NULL, if arg was not it). */
#define GATHER(argv, n, arg, ap)                              \
    do {                                                      \
        argv[0] = (char *)arg;                                \
        for (size_t i = 1; i < n; i++) argv[i] = va_arg(ap, char *); \
        argv[n] = NULL;                                       \
    } while (0)

/* execl and execlp: the list as an array, to execv and execvp. */
#define EXEC_LIST(name, target)                           \
    int name(const char *file, const char *arg, ...) {    \
        size_t n;                                         \
        COUNT(n, arg);                                    \
        char *argv[n + 1];                                \
        va_list ap;                                       \
        va_start(ap, arg);                                \
        GATHER(argv, n, arg, ap);                         \
        va_end(ap);                                       \
        return target(file, argv);                        \
    }

EXEC_LIST(usnet_execl, execv)
EXEC_LIST(usnet_execlp, execvp)

int usnet_execle(const char *path, const char *arg, ...) {
    size_t n;
    COUNT(n, arg);
    char *argv[n + 1];
    va_list ap;
    va_start(ap, arg);
    GATHER(argv, n, arg, ap);
    /* The terminating NULL (unless `arg` was it), then the environment. */
    if (arg) (void)va_arg(ap, char *);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, argv, envp);
}
