/* The first step of a bwrap sandbox's launch chain, run as root by the worker (launch.py).

   launch [STEP VALUE]... -- PROGRAM ARG...

   Steps, applied in the order given, then PROGRAM is exec'd (found on PATH):
     join PATH       write this process's pid to a cgroup's cgroup.procs
     nofile N        RLIMIT_NOFILE, soft and hard (likewise core, fsize in bytes, nproc)
     uid N           become uid and gid N: no supplementary groups, not one capability in
                     any set, no_new_privs

   Any step that fails ends it with status 125 and a line on stderr, before PROGRAM runs:
   nothing of the sandbox ever runs outside its cgroups or limits, or as root. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FAILED 125

_Noreturn static void fail(const char *what, const char *arg) {
    fprintf(stderr, "sandcell-launch: %s %s: %s\n", what, arg, strerror(errno));
    exit(FAILED);
}

static long number(const char *text) {
    char *end;
    errno = 0;
    long n = strtol(text, &end, 10);
    if (errno || end == text || *end || n < 0) {
        errno = EINVAL;
        fail("not a number:", text);
    }
    return n;
}

static void join(const char *procs) {
    char pid[24];
    int length = snprintf(pid, sizeof pid, "%d", getpid());
    int fd = open(procs, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, pid, length) != length || close(fd) != 0)
        fail("cannot join", procs);
}

static void limit(int resource, const char *name, const char *value) {
    struct rlimit both = {number(value), number(value)};
    if (setrlimit(resource, &both) != 0)
        fail("cannot set rlimit", name);
}

static void become(const char *value) {
    long id = number(value);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {{0}};
    if (setgroups(0, NULL) != 0 || setresgid(id, id, id) != 0 || setresuid(id, id, id) != 0)
        fail("cannot become uid", value);
    /* Leaving root already empties the permitted and effective sets; inheritable is not. */
    if (syscall(SYS_capset, &header, none) != 0)
        fail("cannot drop capabilities of uid", value);
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
        fail("cannot clear ambient capabilities of uid", value);
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        fail("cannot set no_new_privs for uid", value);
    if (setresuid(0, 0, 0) == 0) { /* a kernel that let it back would be no boundary */
        errno = EPERM;
        fail("could become root again after uid", value);
    }
}

int main(int argc, char **argv) {
    int at = 1;
    for (; at + 1 < argc && strcmp(argv[at], "--") != 0; at += 2) {
        const char *step = argv[at], *value = argv[at + 1];
        if (strcmp(step, "join") == 0)
            join(value);
        else if (strcmp(step, "nofile") == 0)
            limit(RLIMIT_NOFILE, step, value);
        else if (strcmp(step, "core") == 0)
            limit(RLIMIT_CORE, step, value);
        else if (strcmp(step, "fsize") == 0)
            limit(RLIMIT_FSIZE, step, value);
        else if (strcmp(step, "nproc") == 0)
            limit(RLIMIT_NPROC, step, value);
        else if (strcmp(step, "uid") == 0)
            become(value);
        else {
            errno = EINVAL;
            fail("no such step:", step);
        }
    }
    if (at + 1 >= argc || strcmp(argv[at], "--") != 0) {
        errno = EINVAL;
        fail("usage:", "launch [STEP VALUE]... -- PROGRAM [ARG]...");
    }
    execvp(argv[at + 1], argv + at + 1);
    fail("cannot run", argv[at + 1]);
}
