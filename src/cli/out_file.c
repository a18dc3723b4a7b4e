/*
 * cli/out_file.c — a file a command writes at its end (out_file.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/out_file.h"
#include "core/file.h"

/* The signals held while the temporary file exists (out_file.h). */
static const int held_signals[8] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM,
                                     SIGXFSZ };
static atomic_int caught;     /* the first that came, 0 if none */
static atomic_int released;   /* the actions are back */

/* The handler may run in another thread while release_signals runs: each
 * side writes its own flag before it reads the other's (sequentially
 * consistent), so that one of them raises the signal again.  A SIGXFSZ
 * caught lets the write fail (EFBIG) and the file be removed first. */
static void catch_held(int sig)
{
    int none = 0;
    atomic_compare_exchange_strong(&caught, &none, sig);
    if (atomic_load(&released))
        raise(sig);
}

/* A handler, not a blocked mask: a signal sent to the process may go to
 * any of its threads (oneDNN's), and only a handler is the process's. */
static void hold_signals(st_cli_out *o)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = catch_held;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    atomic_store(&caught, 0);
    atomic_store(&released, 0);
    for (int k = 0; k < 8; k++)
        sigaction(held_signals[k], &sa, &o->held[k]);
}

/* The actions back, and a signal that came meanwhile taken as it would
 * have been. */
static void release_signals(st_cli_out *o)
{
    for (int k = 0; k < 8; k++)
        sigaction(held_signals[k], &o->held[k], NULL);
    atomic_store(&released, 1);
    const int sig = atomic_load(&caught);
    if (sig)
        raise(sig);
}

/* Written in place, opened now: anything that is not a regular file, a
 * new name or a link to a regular file or to no file. */
static int open_in_place(st_cli_out *o)
{
    o->tmp[0] = '\0';
    if (!(o->in_place = fopen(o->path, "w"))) {
        st_cli_error(o->cmd, "%s %s: cannot open it: %s", o->option, ST_CLI_SHOW(o->path),
                     strerror(errno));
        return 1;
    }
    return 0;
}

/* The standard stream that sb's file is already open as (--csv
 * /dev/stdout with stdout sent to a file), or NULL: renaming over that
 * file would lose what the command prints into it. */
static FILE *standard_stream(const struct stat *sb)
{
    struct stat fb;
    if (fstat(STDOUT_FILENO, &fb) == 0 && fb.st_dev == sb->st_dev && fb.st_ino == sb->st_ino)
        return stdout;
    if (fstat(STDERR_FILENO, &fb) == 0 && fb.st_dev == sb->st_dev && fb.st_ino == sb->st_ino)
        return stderr;
    return NULL;
}

int st_cli_out_open(st_cli_out *o, const char *cmd, const char *option, const char *path)
{
    o->cmd = cmd;
    o->option = option;
    o->path = path;
    o->in_place = NULL;
    o->stream = NULL;
    o->mode = 0644;
    struct stat sb, tb;
    const int exists = lstat(path, &sb) == 0;
    const int resolves = exists && stat(path, &tb) == 0;   /* tb: what a link names */
    if (resolves && (o->stream = standard_stream(&tb))) {
        o->tmp[0] = '\0';
        return 0;
    }
    int is_new = !exists, dangling = 0;
    if (exists && S_ISLNK(sb.st_mode) && !resolves) {
        /* a dangling link: its target is created, the link kept */
        if (st_cli_dangling_target(path, o->target, sizeof o->target) != 0)
            return open_in_place(o);
        is_new = dangling = 1;
    } else if (exists && S_ISLNK(sb.st_mode)) {
        /* the link's target is replaced, the link kept */
        if (!S_ISREG(tb.st_mode) || !realpath(path, o->target))
            return open_in_place(o);
        o->mode = tb.st_mode & 07777;
    } else if (exists && !S_ISREG(sb.st_mode)) {
        return open_in_place(o);
    } else if ((size_t)snprintf(o->target, sizeof o->target, "%s", path) >= sizeof o->target) {
        st_cli_error(o->cmd, "%s %s: the name is too long", option, ST_CLI_SHOW(path));
        return 1;
    } else if (exists) {
        o->mode = sb.st_mode & 07777;
    }
    if (!is_new && access(o->target, W_OK) != 0) {
        st_cli_error(o->cmd, "%s %s: cannot write it: %s", option, ST_CLI_SHOW(path),
                     strerror(errno));
        return 1;
    }
    snprintf(o->tmp, sizeof o->tmp, "%s.tmp.%ld", o->target, (long)getpid());
    const int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 && !is_new) {
        /* a file it may write in a directory it may not: written in place
         * at the end, as nothing can be put beside it */
        o->tmp[0] = '\0';
        return 0;
    }
    if (fd < 0 && dangling) {
        st_cli_error(o->cmd, "%s %s: cannot create the link's target %s: %s", option,
                     ST_CLI_SHOW(path), ST_CLI_SHOW(o->target), strerror(errno));
        return 1;
    }
    if (fd < 0) {
        st_cli_error(o->cmd, "%s %s: cannot create %s beside it: %s", option, ST_CLI_SHOW(path),
                     ST_CLI_SHOW(o->tmp), strerror(errno));
        return 1;
    }
    close(fd);
    unlink(o->tmp);
    return 0;
}

FILE *st_cli_out_begin(st_cli_out *o)
{
    if (o->stream)
        return o->stream;
    FILE *f = o->in_place;
    o->in_place = NULL;
    if (f)
        return f;
    if (!*o->tmp) {   /* in place, at the end */
        if (!(f = fopen(o->target, "w")))
            st_cli_error(o->cmd, "%s %s: cannot open it: %s", o->option, ST_CLI_SHOW(o->path),
                         strerror(errno));
        return f;
    }
    /* a new file, not one planted under the name since the open */
    hold_signals(o);
    const int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, o->mode);
    if (fd >= 0 && fchmod(fd, o->mode) == 0 && (f = fdopen(fd, "w")))
        return f;
    st_cli_error(o->cmd, "%s %s: cannot create %s: %s", o->option, ST_CLI_SHOW(o->path),
                 ST_CLI_SHOW(o->tmp), strerror(errno));
    if (fd >= 0) {
        close(fd);
        unlink(o->tmp);
    }
    release_signals(o);
    return NULL;
}

int st_cli_out_commit(st_cli_out *o, FILE *f)
{
    const int failed = ferror(f) != 0;
    int placed;
    if (f == o->stream)
        placed = fflush(f) == 0 && !failed;
    else
        placed = fclose(f) == 0 && !failed;
    const int e = errno ? errno : EIO;
    const int held = *o->tmp != '\0';   /* a temporary file: hold_signals ran */
    if (placed && held)
        st_file_fault_in_write(o->target);
    const int ok = placed && (!held || rename(o->tmp, o->target) == 0);
    if (!ok) {
        st_cli_error(o->cmd, "%s %s: writing it failed: %s", o->option, ST_CLI_SHOW(o->path),
                     strerror(placed ? errno : e));
        if (held)
            remove(o->tmp);
    }
    if (held)
        release_signals(o);
    return ok ? 0 : 1;
}

void st_cli_out_abandon(st_cli_out *o)
{
    if (o->in_place)
        fclose(o->in_place);
    o->in_place = NULL;
}
