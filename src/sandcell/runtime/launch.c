/* The first step of every sandbox's launch chain, run as root by the worker (launch.py):
   bwrap's behind every step, runsc's behind the cgroup joins alone.

   launch [STEP VALUE]... -- PROGRAM ARG...

   Steps, applied in the order given, then PROGRAM is exec'd (found on PATH):
     join PATH       write this process's pid to a cgroup's cgroup.procs
     nofile N        RLIMIT_NOFILE, soft and hard (likewise core, fsize in bytes, nproc)
     mounts FD       enter the mount namespace open at FD (launch_mounts.py), then close FD
     uid N           become uid and gid N: no supplementary groups, not one capability in
                     any set, no_new_privs

   Any step that fails ends it with status 125 and a line on stderr, before PROGRAM runs:
   nothing of the sandbox ever runs outside its cgroups or limits, or as root.

   No C library: it makes its system calls itself. A C library's start-up asks the CPU about
   its caches, some seventy cpuid instructions, and in a VM each one is an exit to the
   hypervisor: 0.7-0.8 ms of CPU a start here, against 0.1 ms for this whole helper. */
#include <asm/unistd.h>
#include <linux/capability.h>
#include <linux/errno.h>
#include <linux/fcntl.h>
#include <linux/prctl.h>
#include <linux/resource.h>

#define FAILED 125
#define AT_CWD (-100)
#define MAX_PATH 4096

#if defined(__x86_64__)
__asm__(".text\n.global _start\n_start:\n"
        "  xor %ebp, %ebp\n  mov %rsp, %rdi\n  and $-16, %rsp\n  call start\n  hlt\n");

static long sys(long n, long a, long b, long c, long d, long e) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    long result;
    __asm__ volatile("syscall"
                     : "=a"(result)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8)
                     : "rcx", "r11", "memory");
    return result;
}
#elif defined(__aarch64__)
__asm__(".text\n.global _start\n_start:\n"
        "  mov x29, #0\n  mov x30, #0\n  mov x0, sp\n  bl start\n");

static long sys(long n, long a, long b, long c, long d, long e) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    __asm__ volatile("svc #0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4)
                     : "memory");
    return x0;
}
#else
#error "the launch helper knows the system calls of x86_64 and aarch64 only"
#endif

/* The compiler may call these for a struct's copy or zeroing, as it may in any C program. */
void *memset(void *to, int byte, unsigned long n) {
    for (unsigned char *p = to; n--;)
        *p++ = (unsigned char)byte;
    return to;
}

void *memcpy(void *to, const void *from, unsigned long n) {
    unsigned char *t = to;
    for (const unsigned char *f = from; n--;)
        *t++ = *f++;
    return to;
}

static unsigned long length(const char *text) {
    unsigned long n = 0;
    while (text[n])
        n++;
    return n;
}

static int same(const char *a, const char *b) {
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

static _Noreturn void leave(int status) {
    for (;;)
        sys(__NR_exit_group, status, 0, 0, 0, 0);
}

static const char *reason(long error) {
    switch (error) {
    case EPERM: return "Operation not permitted";
    case ENOENT: return "No such file or directory";
    case ESRCH: return "No such process";
    case EIO: return "Input/output error";
    case E2BIG: return "Argument list too long";
    case ENOEXEC: return "Exec format error";
    case EBADF: return "Bad file descriptor";
    case EAGAIN: return "Resource temporarily unavailable";
    case ENOMEM: return "Cannot allocate memory";
    case EACCES: return "Permission denied";
    case EFAULT: return "Bad address";
    case EBUSY: return "Device or resource busy";
    case ENOTDIR: return "Not a directory";
    case EISDIR: return "Is a directory";
    case EINVAL: return "Invalid argument";
    case ENFILE: return "Too many open files in system";
    case EMFILE: return "Too many open files";
    case ETXTBSY: return "Text file busy";
    case ENOSPC: return "No space left on device";
    case EROFS: return "Read-only file system";
    case ENAMETOOLONG: return "File name too long";
    case ELOOP: return "Too many levels of symbolic links";
    default: return "Unknown error";
    }
}

static _Noreturn void fail(const char *what, const char *arg, long error) {
    char line[512];
    unsigned long n = 0;
    const char *parts[] = {"sandcell-launch: ", what, " ", arg, ": ", reason(error), "\n"};
    for (unsigned long i = 0; i < sizeof parts / sizeof *parts; i++)
        for (const char *c = parts[i]; *c && n < sizeof line; c++)
            line[n++] = *c;
    sys(__NR_write, 2, (long)line, (long)n, 0, 0);
    leave(FAILED);
}

static unsigned long long number(const char *text) {
    unsigned long long n = 0;
    const char *c = text;
    for (; *c >= '0' && *c <= '9'; c++) {
        if (n > (~0ULL - 9) / 10)
            fail("not a number:", text, EINVAL);
        n = n * 10 + (unsigned long long)(*c - '0');
    }
    if (c == text || *c)
        fail("not a number:", text, EINVAL);
    return n;
}

static void join(const char *procs) {
    char digits[24], *pid = digits + sizeof digits;
    for (long n = sys(__NR_getpid, 0, 0, 0, 0, 0); pid == digits + sizeof digits || n; n /= 10)
        *--pid = (char)('0' + n % 10);
    long size = digits + sizeof digits - pid;
    long fd = sys(__NR_openat, AT_CWD, (long)procs, O_WRONLY | O_CLOEXEC, 0, 0);
    if (fd < 0)
        fail("cannot join", procs, -fd);
    long written = sys(__NR_write, fd, (long)pid, size, 0, 0);
    long closed = sys(__NR_close, fd, 0, 0, 0, 0);
    if (written != size || closed != 0)
        fail("cannot join", procs, written < 0 ? -written : closed < 0 ? -closed : EIO);
}

static void limit(int resource, const char *name, const char *value) {
    unsigned long long n = number(value);
    struct rlimit64 both = {n, n};
    long done = sys(__NR_prlimit64, 0, resource, (long)&both, 0, 0);
    if (done != 0)
        fail("cannot set rlimit", name, -done);
}

static void enter(const char *value) {
    long fd = (long)number(value);
    long done = sys(__NR_setns, fd, 0x00020000 /* CLONE_NEWNS */, 0, 0, 0);
    if (done != 0)
        fail("cannot enter the mount namespace of fd", value, -done);
    sys(__NR_close, fd, 0, 0, 0, 0);
}

static void step(long done, const char *what, const char *value) {
    if (done != 0)
        fail(what, value, -done);
}

static void become(const char *value) {
    long id = (long)number(value);
    if (id > 0xfffffffeL)
        fail("not a number:", value, EINVAL);
    struct __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct none[_LINUX_CAPABILITY_U32S_3] = {{0, 0, 0}, {0, 0, 0}};
    step(sys(__NR_setgroups, 0, 0, 0, 0, 0), "cannot become uid", value);
    step(sys(__NR_setresgid, id, id, id, 0, 0), "cannot become uid", value);
    step(sys(__NR_setresuid, id, id, id, 0, 0), "cannot become uid", value);
    /* Leaving root already empties the permitted and effective sets; inheritable is not. */
    step(sys(__NR_capset, (long)&header, (long)none, 0, 0, 0), "cannot drop capabilities of uid",
         value);
    step(sys(__NR_prctl, PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0),
         "cannot clear ambient capabilities of uid", value);
    step(sys(__NR_prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "cannot set no_new_privs for uid", value);
    if (sys(__NR_setresuid, 0, 0, 0, 0, 0) == 0) /* a kernel that let it back would be no boundary */
        fail("could become root again after uid", value, EPERM);
}

/* As execvp: a name without a slash is looked for in each of PATH's directories, in order;
   one that cannot be run there (missing, not a directory, not permitted) is looked for in
   the next, and the failure told is a refusal if one was met, else the last one. */
static _Noreturn void run(char **argv, char **envp) {
    const char *name = argv[0], *path = "/bin:/usr/bin";
    for (const char *c = name; *c; c++)
        if (*c == '/')
            fail("cannot run", name, -sys(__NR_execve, (long)name, (long)argv, (long)envp, 0, 0));
    for (char **env = envp; *env; env++)
        if ((*env)[0] == 'P' && (*env)[1] == 'A' && (*env)[2] == 'T' && (*env)[3] == 'H' &&
            (*env)[4] == '=')
            path = *env + 5;
    char full[MAX_PATH];
    unsigned long name_length = length(name);
    long error = ENOENT;
    int refused = 0;
    for (const char *dir = path;; dir++) {
        unsigned long n = 0;
        for (; *dir && *dir != ':'; dir++)
            if (n < sizeof full)
                full[n++] = *dir;
        if (n == 0)
            full[n++] = '.'; /* an empty entry is the working directory, as execvp has it */
        if (n + 1 + name_length < sizeof full) {
            full[n++] = '/';
            memcpy(full + n, name, name_length + 1);
            error = -sys(__NR_execve, (long)full, (long)argv, (long)envp, 0, 0);
            if (error == EACCES)
                refused = 1;
            else if (error != ENOENT && error != ENOTDIR)
                fail("cannot run", name, error);
        }
        if (!*dir)
            break;
    }
    fail("cannot run", name, refused ? EACCES : error);
}

__attribute__((used)) _Noreturn void start(long *stack) {
    int argc = (int)stack[0];
    char **argv = (char **)(stack + 1), **envp = argv + argc + 1;
    int at = 1;
    for (; at + 1 < argc && !same(argv[at], "--"); at += 2) {
        const char *name = argv[at], *value = argv[at + 1];
        if (same(name, "join"))
            join(value);
        else if (same(name, "nofile"))
            limit(RLIMIT_NOFILE, name, value);
        else if (same(name, "core"))
            limit(RLIMIT_CORE, name, value);
        else if (same(name, "fsize"))
            limit(RLIMIT_FSIZE, name, value);
        else if (same(name, "nproc"))
            limit(RLIMIT_NPROC, name, value);
        else if (same(name, "mounts"))
            enter(value);
        else if (same(name, "uid"))
            become(value);
        else
            fail("no such step:", name, EINVAL);
    }
    if (at + 1 >= argc || !same(argv[at], "--"))
        fail("usage:", "launch [STEP VALUE]... -- PROGRAM [ARG]...", EINVAL);
    run(argv + at + 1, envp);
}
