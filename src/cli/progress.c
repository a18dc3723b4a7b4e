/* cli/progress.c — progress bar, per-epoch lines, metrics records. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli_util.h"
#include "cli/progress.h"
#include "cli/provenance.h"

#define BAR_WIDTH 24


static void clear_bar(st_progress *p)
{
    if (p->bar_visible) {
        fputs("\r\033[K", stderr);
        p->bar_visible = 0;
    }
}

void st_progress_on_step(const st_step_info *info, void *user)
{
    st_progress *p = user;
    if (!p->bar)
        return;
    double t = st_cli_now_s();
    if (t - p->last_draw < 0.1 && info->step != info->total_steps)
        return;
    p->last_draw = t;
    char bar[BAR_WIDTH + 1], eta[32];
    int filled = (int)((double)BAR_WIDTH * (double)info->step / (double)info->total_steps);
    for (int i = 0; i < BAR_WIDTH; i++)
        bar[i] = i < filled ? '=' : (i == filled ? '>' : ' ');
    bar[BAR_WIDTH] = '\0';
    st_cli_format_duration(eta, sizeof eta, info->eta_s);
    fprintf(stderr, "\r\033[Kepoch %d/%d [%s] step %llu/%llu  loss %.4f  %.0f samples/s  ETA %s",
            info->epoch, info->epochs, bar, (unsigned long long)info->step,
            (unsigned long long)info->total_steps, info->loss, info->samples_per_s, eta);
    fflush(stderr);
    p->bar_visible = 1;
}

/* sdp: the coverage that runs, k of N workers holding each unit, and the
 * C asked for when that differs (doc/sdp.md). */
static void print_coverage(const st_epoch_record *rec, const char *before)
{
    const double k = rec->coverage_holders, n = rec->workers > 0 ? rec->workers : 1;
    printf("%scoverage %d/%d = %g", before, rec->coverage_holders, rec->workers, k / n);
    if (fabs(k / n - rec->coverage) > 1e-6)
        printf(" (requested %g)", rec->coverage);
}

/* --report memory: the record's per-worker array lives only during the
 * callback, so the table is printed from here. */
static void print_memory_table(const st_epoch_record *rec)
{
    printf("peak memory by worker (MiB)");
    if (rec->coverage_holders)
        print_coverage(rec, ", sdp ");
    printf(":\n%6s %9s %9s %9s %9s %9s %9s %9s\n", "worker",
           "total", "weights", "gradients", "optimizer", "activs", "workspace", "attention");
    for (int w = 0; w < (rec->workers_per_rank > 0 ? rec->workers_per_rank : rec->workers); w++) {
        const st_mem_stats *m = &rec->worker_memory[w];
        printf("%6d %9.2f", w, (double)m->peak_total / 1048576.0);
        for (int k = 0; k < ST_MEM_KIND_COUNT; k++)
            printf(" %9.2f", (double)m->peak[k] / 1048576.0);
        printf("\n");
    }
}

/* A metrics record; the run's first one begins with its provenance. */
static int write_record(st_progress *p, const st_epoch_record *rec)
{
    if (!p->provenance || p->run_written)
        return st_metrics_write(p->metrics, rec);
    p->run_written = 1;
    fputc('{', p->metrics);
    st_cli_provenance_write(p->metrics, p->provenance, rec);
    fputc(',', p->metrics);
    return st_metrics_write_members(p->metrics, rec);
}

/* The record whole or not at all: formatted in memory, then written with
 * write(2); a write cut short (a full disk, a file size limit) is taken
 * back by cutting a regular file to where the record began, so that each
 * line of the file is a whole record.  0, or -1 with errno. */
static int put_record(st_progress *p, const st_epoch_record *rec)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&buf, &len);
    if (!mem)
        return -1;
    FILE *file = p->metrics;
    p->metrics = mem;
    const int formatted = write_record(p, rec) == 0;
    p->metrics = file;
    if (fclose(mem) != 0 || !formatted) {
        free(buf);
        errno = ENOMEM;
        return -1;
    }
    const int fd = fileno(file);
    if (p->metrics_replace && (ftruncate(fd, 0) != 0 || lseek(fd, 0, SEEK_SET) != 0)) {
        free(buf);
        return -1;
    }
    p->metrics_replace = 0;
    struct stat sb;
    const off_t at = fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) ? sb.st_size : -1;
    size_t done = 0;
    int e = 0;
    while (done < len) {
        const ssize_t w = write(fd, buf + done, len - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            e = w < 0 ? errno : EIO;
            break;
        }
        done += (size_t)w;
    }
    free(buf);
    if (done == len)
        return 0;
    if (at >= 0 && ftruncate(fd, at) == 0)
        lseek(fd, at, SEEK_SET);
    errno = e;
    return -1;
}

void st_progress_on_epoch(const st_epoch_record *rec, void *user)
{
    st_progress *p = user;
    clear_bar(p);
    if (p->metrics && !p->metrics_failed) {
        errno = 0;
        if (put_record(p, rec) != 0) {
            p->metrics_failed = 1;
            const int e = errno ? errno : EIO;
            st_cli_error("subtrain", "writing the metrics file '%s' failed: %s",
                         ST_CLI_SHOW(p->metrics_path), strerror(e));
        }
    }
    if (rec->final && p->report_memory && rec->worker_memory)
        print_memory_table(rec);
    if (!p->epoch_lines || rec->final)
        return;
    /* synth segment epochs: the joined network is never trained as such, so
     * it has no training loss; the segments' losses follow instead. */
    const int segments = rec->n_segments && !rec->recovery;
    printf("epoch %d/%d  step %llu  ", rec->epoch, rec->epochs, (unsigned long long)rec->step);
    if (!segments)
        printf("train_loss %.4f  ", rec->train_loss);
    printf("test_loss %.4f  test_acc %.4f  %.0f samples/s  wall %.1fs", rec->test_loss,
           rec->test_acc, rec->samples_per_s, rec->wall_s);
    if (rec->align_measured) {
        printf("  grad_alignment %.4f (min %.4f)", rec->align_mean, rec->align_min);
        if (rec->coverage_holders)
            print_coverage(rec, " at ");
    }
    if (rec->n_segments && rec->recovery)
        printf("  (recovery)");
    if (segments) {
        printf("  (joined) segment_loss");
        for (int g = 0; g < rec->n_segments; g++)
            printf("%s%.4f", g ? "/" : " ", rec->segment_loss[g]);
        printf("  peak %.1f MiB/worker", (double)rec->memory.peak_total / 1048576.0);
    }
    printf("\n");
    fflush(stdout);
}

void st_progress_on_warning(const char *message, void *user)
{
    st_progress *p = user;
    if (p->quiet)
        return;
    clear_bar(p);
    st_cli_error("subtrain", "warning: %s", message);
}

void st_progress_on_note(const char *message, void *user)
{
    st_progress *p = user;
    if (p->quiet)
        return;
    clear_bar(p);
    /* standard output, as the epoch lines: a failing run's standard error
     * is its one error line */
    printf("%s\n", message);
    fflush(stdout);
}
