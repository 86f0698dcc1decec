/* statx(2) for programs in a sandcell image, preloaded into every process (/etc/ld.so.preload).
 *
 * Debian's runsc (20221219) answers EINVAL to a statx with AT_NO_AUTOMOUNT, which is how
 * coreutils' `ls` and `stat` ask: without this, both fail on every path inside a gVisor
 * sandbox. Linux accepts the flag, and later gVisor ignores it (it has no automounts), so
 * the call is made again without it, and its answer (a result, or an error such as ENOENT)
 * is the one Linux would give; from then on this process leaves the flag out from the start.
 * On a kernel that accepts the flag (bwrap's), nothing changes.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

static int refused; /* this kernel refused AT_NO_AUTOMOUNT and took the call without it */

int statx(int dirfd, const char *path, int flags, unsigned int mask, struct statx *buf)
{
    if (__atomic_load_n(&refused, __ATOMIC_RELAXED))
        flags &= ~AT_NO_AUTOMOUNT;
    long done = syscall(SYS_statx, dirfd, path, flags, mask, buf);
    if (done == -1 && errno == EINVAL && (flags & AT_NO_AUTOMOUNT)) {
        done = syscall(SYS_statx, dirfd, path, flags & ~AT_NO_AUTOMOUNT, mask, buf);
        /* Anything but EINVAL again (a result, or ENOENT and the like): the flag was it. */
        if (done == 0 || errno != EINVAL)
            __atomic_store_n(&refused, 1, __ATOMIC_RELAXED);
    }
    return (int)done;
}
