/*
 * cli/progress.h — what the user sees while training: a live bar on a
 * terminal (step, loss, samples/s, ETA, redrawn at most 10 times a second,
 * on stderr) and one plain line per epoch (on stdout), and the metrics file.
 */
#ifndef SUBTRAIN_CLI_PROGRESS_H
#define SUBTRAIN_CLI_PROGRESS_H

#include <stdio.h>
#include <subtrain/train.h>

typedef struct st_progress {
    int bar;             /* draw the live bar */
    int epoch_lines;     /* print one line per epoch */
    double last_draw;    /* wall time of the last redraw */
    int bar_visible;
    FILE *metrics;       /* or NULL */
    const char *metrics_path;
    int metrics_failed;  /* a write failed: said at once, with the reason; the run
                          * goes on and exits 1 */
    int metrics_replace; /* the file's earlier contents go with the first record:
                          * a run that fails before it leaves them */
    int quiet;           /* no warnings either */
    int report_memory;   /* print every worker's memory with the final record */
    /* what made the run: written as "run" with the first record (NULL:
     * none); a resumed run's first record in the file it appends to says
     * it again */
    const struct st_cli_provenance *provenance;
    int run_written;
} st_progress;

void st_progress_on_step(const st_step_info *info, void *user);
void st_progress_on_epoch(const st_epoch_record *rec, void *user);
void st_progress_on_warning(const char *message, void *user);
/* Something done that the user should see (a checkpoint written), on
 * standard output; nothing under --quiet. */
void st_progress_on_note(const char *message, void *user);

#endif /* SUBTRAIN_CLI_PROGRESS_H */
