/* core/file.c — opening the files subtrain reads (core/file.h). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"

static const char *kind_of(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO"
         : S_ISCHR(m)  ? "a character device"
         : S_ISBLK(m)  ? "a block device"
         : S_ISSOCK(m) ? "a socket"
         : S_ISDIR(m)  ? "a directory"
                       : "a file of another kind";
}

/* errno after the message is formatted: callers read open(2)'s reason. */
static st_status cannot_open(const char *path, int e)
{
    st_fail(ST_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    errno = e;
    return ST_ERR_IO;
}

st_status st_file_open_read(const char *path, FILE **out)
{
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return cannot_open(path, errno);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        const int e = errno;
        close(fd);
        return cannot_open(path, e);
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        st_fail(ST_ERR_IO, "%s: not a regular file (%s)", path, kind_of(sb.st_mode));
        errno = 0;
        return ST_ERR_IO;
    }
    FILE *f = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        const int e = errno;
        close(fd);
        return cannot_open(path, e);
    }
    *out = f;
    return ST_OK;
}

void st_file_fault_in_write(const char *path)
{
    const char *fault = getenv("SUBTRAIN_FAULT"), *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (fault && strncmp(fault, "stop:", 5) == 0 && strcmp(fault + 5, name) == 0)
        raise(SIGSTOP);
    if (fault && strncmp(fault, "slow:", 5) == 0 && strcmp(fault + 5, name) == 0) {
        struct timespec left = { 5, 0 };
        while (nanosleep(&left, &left) != 0 && errno == EINTR)
            continue;   /* a signal's handler ran: the write goes on */
    }
}
