/*
 * cli/out_file.h — private: a file that a command writes at its end (a
 * calibration, quad's trace), the one way every such command does it.
 *
 * A regular file, a new name or a symbolic link to a regular file or to
 * no file (a dangling link) is written through TARGET.tmp.PID beside the
 * file itself (a link's target), with the file's permission bits, and
 * renamed over it, so that a failed or interrupted command leaves an
 * earlier file as it was, creates none, and a link stays a link (a hard
 * link keeps the earlier contents).  While the temporary file exists, a
 * signal that would end the command (SIGINT, SIGTERM, SIGHUP, SIGQUIT,
 * SIGUSR1, SIGUSR2, SIGALRM, and SIGXFSZ, whose write then fails) is held
 * until the file is renamed or removed, then ends the command as it would
 * have.  Written in place instead: a file the
 * command's stdout or stderr already writes (--csv /dev/stdout), through
 * that stream; an existing file whose directory takes no new name, at the
 * end; anything else (a FIFO, a device, a link to one), opened once
 * before the work, as nothing can be renamed over it and opening a FIFO
 * twice would give its reader an end of file after the first.
 *
 *   st_cli_out o;
 *   if (st_cli_out_open(&o, "calibrate", "--output", path) != 0) return 1;
 *   ... the work; on failure st_cli_out_abandon(&o) ...
 *   FILE *f = st_cli_out_begin(&o);   then write, then
 *   return st_cli_out_commit(&o, f);
 */
#ifndef SUBTRAIN_CLI_OUT_FILE_H
#define SUBTRAIN_CLI_OUT_FILE_H

#include <limits.h>
#include <signal.h>
#include <stdio.h>

typedef struct st_cli_out {
    const char *cmd, *option, *path;   /* for messages: the user's words */
    char target[PATH_MAX];             /* the file renamed over (path, or a link's target) */
    char tmp[PATH_MAX + 32];           /* "" when written in place */
    FILE *in_place;                    /* opened before the work */
    FILE *stream;                      /* stdout or stderr, or NULL */
    unsigned mode;                     /* the new file's permission bits */
    struct sigaction held[8];          /* while the temporary file exists: the
                                        * actions it replaced */
} st_cli_out;

/* Before the work: what the write at the end needs, tried now (the
 * temporary name created and removed; an existing file's write permission;
 * a FIFO or device opened), so that a bad name is said at once, not after
 * the work.  0, or 1 said as "subtrain CMD: OPTION PATH: ...". */
int st_cli_out_open(st_cli_out *o, const char *cmd, const char *option, const char *path);
/* The stream to write into (the temporary file, or the one opened in
 * place), or NULL said. */
FILE *st_cli_out_begin(st_cli_out *o);
/* f closed and, unless written in place, renamed over the target; on a
 * write error the temporary file removed.  0, or 1 said. */
int st_cli_out_commit(st_cli_out *o, FILE *f);
/* An output opened but not written (the work failed). */
void st_cli_out_abandon(st_cli_out *o);

#endif /* SUBTRAIN_CLI_OUT_FILE_H */
