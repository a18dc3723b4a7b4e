/* cli/provenance.c — the "run" object of a metrics file's first record. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <hwloc.h>
#include <oneapi/dnnl/dnnl.h>

#include <subtrain/subtrain.h>

#include "cli/cli_util.h"
#include "cli/config_file.h"
#include "cli/provenance.h"
#include "config.h"

typedef struct json_out {
    FILE *f;
    int n;
} json_out;

static void config_member(const char *key, const char *value, void *user)
{
    json_out *j = user;
    fputs(j->n++ ? "," : "{", j->f);
    st_cli_json_string(j->f, key);
    fputc(':', j->f);
    st_cli_json_string(j->f, value);
}

int st_cli_provenance_make(const st_cli_options *o, st_cli_provenance *p)
{
    memset(p, 0, sizeof *p);
    size_t len = 0;
    FILE *f = open_memstream(&p->config, &len);
    if (!f) {
        fprintf(stderr, "subtrain: out of memory for the run's provenance\n");
        return -1;
    }
    json_out j = { f, 0 };
    st_cli_config_each(o, config_member, &j);
    fputs(j.n ? "}" : "{}", f);
    if (fclose(f) != 0) {
        fprintf(stderr, "subtrain: out of memory for the run's provenance\n");
        return -1;
    }
    /* the machine, and the plan the run will make of it (the same pure
     * function of the same topology and request as train.c's) */
    st_topology *t = NULL;
    if (st_topology_load(NULL, &t) == ST_OK) {
        const char *cpu = st_topology_cpu_model(t);
        snprintf(p->cpu, sizeof p->cpu, "%s", cpu ? cpu : "");
        for (size_t n = strlen(p->cpu); n > 0 && p->cpu[n - 1] == ' '; n--)
            p->cpu[n - 1] = '\0';   /* hwloc keeps the padding of some models */
        p->cores = st_topology_core_count(t);
        p->pus = st_topology_pu_count(t);
        p->numa = st_topology_numa_count(t);
        const st_train_config *c = &o->train;
        st_plan_request req = { .workers = c->workers, .oversubscribe = c->oversubscribe,
                                .cpuset = c->cpuset, .threads_per_worker = c->threads_per_worker,
                                .team_spans = c->team_spans, .core_limit = c->core_limit };
        st_plan plan;
        if (st_plan_make(t, &req, &plan) == ST_OK) {
            p->workers = plan.n_workers * st_world_size();
            st_plan_free(&plan);
        }
        st_topology_destroy(t);
    }
    p->rank = st_world_rank();
    p->seed = o->train.seed;
    time_t now = time(NULL);
    struct tm utc;
    if (gmtime_r(&now, &utc))
        strftime(p->start_time, sizeof p->start_time, "%Y-%m-%dT%H:%M:%SZ", &utc);
    return 0;
}

int st_cli_provenance_split(st_cli_provenance *p, const st_cli_options *o,
                            const st_dataset *train)
{
    st_split_name(&o->train.split, p->split_name, sizeof p->split_name);
    if (st_split_make(&o->train.split, train, p->workers, o->train.seed,
                      (uint32_t)o->train.batch, &p->split) != ST_OK) {
        st_cli_error("subtrain", "%s", st_last_error());
        return -1;
    }
    return 0;
}

/* "split":{...}: the spec and each worker's samples of each class. */
static void write_split(FILE *f, const st_cli_provenance *p)
{
    const st_split *s = p->split;
    const uint32_t C = st_split_classes(s);
    const uint32_t *h = st_split_histogram(s);
    fputs(",\"split\":{\"spec\":", f);
    st_cli_json_string(f, p->split_name);
    fprintf(f, ",\"classes\":%lu,\"histogram\":[", (unsigned long)C);
    for (int g = 0; g < st_split_workers(s); g++) {
        fputs(g ? ",[" : "[", f);
        for (uint32_t c = 0; c < C; c++)
            fprintf(f, "%s%lu", c ? "," : "", (unsigned long)h[(size_t)g * C + c]);
        fputc(']', f);
    }
    fputs("]}", f);
}

/* A team's OS PU numbers, runs of consecutive ones as ranges: "0-3,8". */
static void write_pus(FILE *f, const st_plan *pl, int w)
{
    const int T = pl->threads_per_worker > 1 ? pl->threads_per_worker : 1;
    const int *pus = pl->team_pu_os ? pl->team_pu_os + (size_t)w * T : &pl->workers[w].pu_os;
    const int count = pl->team_pu_os ? T : 1;
    fputc('"', f);
    for (int k = 0; k < count; ) {
        int end = k;
        while (end + 1 < count && pus[end + 1] == pus[end] + 1)
            end++;
        fprintf(f, "%s%d", k ? "," : "", pus[k]);
        if (end > k)
            fprintf(f, "-%d", pus[end]);
        k = end + 1;
    }
    fputc('"', f);
}

void st_cli_provenance_write(FILE *f, const st_cli_provenance *p, const st_epoch_record *rec)
{
    const dnnl_version_t *v = dnnl_version();
    fprintf(f, "\"run\":{\"config\":%s,\"version\":", p->config ? p->config : "{}");
    st_cli_json_string(f, st_version());
    fputs(",\"git\":", f);
    if (strcmp(ST_GIT_DESCRIBE, "none") != 0)
        st_cli_json_string(f, ST_GIT_DESCRIBE);
    else
        fputs("null", f);
    fprintf(f, ",\"onednn\":{\"version\":\"%d.%d.%d\",\"isa\":\"%s\"},\"hwloc\":", v->major,
            v->minor, v->patch, st_cpu_isa_name());
#ifdef HWLOC_VERSION
    st_cli_json_string(f, HWLOC_VERSION);   /* the hwloc subtrain was built with */
#else
    const unsigned h = hwloc_get_api_version();
    fprintf(f, "\"%u.%u.%u\"", h >> 16, (h >> 8) & 0xff, h & 0xff);
#endif
    fputs(",\"machine\":{\"cpu\":", f);
    if (p->cpu[0])
        st_cli_json_string(f, p->cpu);
    else
        fputs("null", f);
    fprintf(f, ",\"cores\":%d,\"pus\":%d,\"numa\":%d},\"placement\":[", p->cores, p->pus,
            p->numa);
    const st_plan *pl = rec->placement;
    for (int w = 0; pl && w < pl->n_workers; w++) {
        /* the global worker: ranks have the same number of workers each */
        fprintf(f, "%s{\"worker\":%d,\"rank\":%d,\"pus\":", w ? "," : "",
                p->rank * pl->n_workers + w, p->rank);
        write_pus(f, pl, w);
        fprintf(f, ",\"numa\":%d}", pl->workers[w].numa_os);
    }
    fprintf(f, "],\"seed\":%llu,\"start_time\":\"%s\"", (unsigned long long)p->seed,
            p->start_time);
    if (p->split)
        write_split(f, p);
    fputc('}', f);
}

void st_cli_provenance_free(st_cli_provenance *p)
{
    free(p->config);
    p->config = NULL;
    st_split_destroy(p->split);
    p->split = NULL;
}
