/*
 * topo/topology.c — loading a topology: this machine, a synthetic
 * description, or an lstopo XML export; counts; the binding-env warning.
 *
 * Why described topologies at all: placement is decided by st_plan_make()
 * from a topology alone, so the plan for a 2-socket, 8-domain server can be
 * printed (`subtrain topo --topology ...`) and tested on a laptop.  Whether
 * a topology is the machine we run on is hwloc's answer
 * (hwloc_topology_is_thissystem), never a guess from the spec: an XML export
 * describes some machine, usually another one, and binding threads or
 * memory according to it would be wrong.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/file.h"
#include "topo/topo_internal.h"

#define SPEC_FORMS "expected '' (this machine), 'synthetic:DESCRIPTION' " \
                   "(e.g. 'synthetic:pack:2 numa:4 core:16 pu:2') or 'xml:FILE'"

static const char *const this_machine_name = "this machine";

static st_status set_name(st_topology *t, const char *name)
{
    size_t n = strlen(name) + 1;
    t->name = malloc(n);
    if (!t->name)
        return st_fail(ST_ERR_NOMEM, "out of memory loading topology '%s'", name);
    memcpy(t->name, name, n);
    return ST_OK;
}

/* A missing or unreadable file is the common mistake; hwloc would only say
 * that the XML backend failed, so look first and name the real reason. */
static st_status check_xml_file(const char *spec, const char *path)
{
    struct stat sb;
    if (*path == '\0')
        return st_fail(ST_ERR_INVALID, "topology '%s': no file name after 'xml:'", spec);
    if (stat(path, &sb) != 0)
        return st_fail(ST_ERR_IO, "topology '%s': cannot read '%s': %s", spec, path,
                       strerror(errno));
    if (S_ISDIR(sb.st_mode))
        return st_fail(ST_ERR_IO, "topology '%s': '%s' is a directory, not an lstopo "
                       "XML file", spec, path);
    /* a FIFO or a device would hang hwloc's read: refused like every file
     * subtrain reads */
    FILE *f;
    if (st_file_open_read(path, &f) != ST_OK)
        return st_fail(ST_ERR_IO, "topology '%s': %s", spec, st_last_error());
    fclose(f);
    return ST_OK;
}

/* The size limits (limits.c) of a description, named in the message as
 * the user gave it: the spec, or the environment variable. */
static st_status check_size(const char *spec, const char *synthetic, const char *xml)
{
    char what[4200];
    if (spec)
        snprintf(what, sizeof what, "topology '%s'", spec);
    else
        snprintf(what, sizeof what, "topology %s='%s'", synthetic ? "HWLOC_SYNTHETIC"
                 : "HWLOC_XMLFILE", synthetic ? synthetic : xml);
    return synthetic ? st_topo_check_synthetic(what, synthetic)
                     : st_topo_check_xml(what, xml, spec != NULL);
}

/* hwloc loads another machine than this one when HWLOC_SYNTHETIC or
 * HWLOC_XMLFILE is set (alone, or picked by HWLOC_COMPONENTS=synthetic or
 * xml): their descriptions are checked like a spec's. */
static st_status check_environment(void)
{
    const char *synthetic = getenv("HWLOC_SYNTHETIC"), *xml = getenv("HWLOC_XMLFILE");
    if (synthetic && *synthetic)
        ST_TRY(check_size(NULL, synthetic, NULL));
    if (xml && *xml)
        ST_TRY(check_size(NULL, NULL, xml));
    return ST_OK;
}

/* A default load that hwloc made from its environment is not "this
 * machine": name what described it, so that a message saying training
 * needs this machine does not say "not on this machine". */
static st_status name_from_environment(st_topology *t)
{
    hwloc_obj_t root = hwloc_get_root_obj(t->hw);
    const char *backend = hwloc_obj_get_info_by_name(root, "Backend");
    const char *synthetic = hwloc_obj_get_info_by_name(root, "SyntheticDescription");
    const char *xml = getenv("HWLOC_XMLFILE");
    char name[4200];
    if (backend && strcmp(backend, "Synthetic") == 0)
        snprintf(name, sizeof name, "HWLOC_SYNTHETIC='%s'",
                 synthetic ? synthetic : getenv("HWLOC_SYNTHETIC") ? getenv("HWLOC_SYNTHETIC")
                                                                    : "?");
    else if (backend && strcmp(backend, "XML") == 0 && xml)
        snprintf(name, sizeof name, "HWLOC_XMLFILE='%s'", xml);
    else
        snprintf(name, sizeof name, "the machine hwloc's environment describes (HWLOC_*)");
    free(t->name);
    t->name = NULL;
    return set_name(t, name);
}

/* Tells hwloc where the topology comes from (nothing to do for this
 * machine: discovery is the default). */
static st_status select_source(hwloc_topology_t hw, const char *spec)
{
    if (!spec || *spec == '\0')
        return ST_OK;
    if (strncmp(spec, "synthetic:", 10) == 0) {
        const char *desc = spec + 10;
        if (*desc == '\0')
            return st_fail(ST_ERR_INVALID, "topology '%s': no description after "
                           "'synthetic:' (e.g. 'synthetic:pack:2 numa:4 core:16 pu:2')", spec);
        if (hwloc_topology_set_synthetic(hw, desc) != 0)   /* parses, builds nothing */
            return st_fail(ST_ERR_INVALID, "topology '%s': hwloc rejects the synthetic "
                           "description '%s' (syntax: levels like 'pack:2 numa:4 "
                           "core:16 pu:2', see hwloc's synthetic topologies)", spec, desc);
        return check_size(spec, desc, NULL);
    }
    if (strncmp(spec, "xml:", 4) == 0) {
        ST_TRY(check_xml_file(spec, spec + 4));
        ST_TRY(check_size(spec, NULL, spec + 4));
        if (hwloc_topology_set_xml(hw, spec + 4) != 0)
            return st_fail(ST_ERR_FORMAT, "topology '%s': hwloc cannot use '%s' as an "
                           "XML topology: %s", spec, spec + 4, strerror(errno));
        return ST_OK;
    }
    return st_fail(ST_ERR_INVALID, "unknown topology '%s': " SPEC_FORMS, spec);
}

st_status st_topology_load(const char *spec, st_topology **out)
{
    *out = NULL;
    st_topology *t = calloc(1, sizeof *t);
    if (!t)
        return st_fail(ST_ERR_NOMEM, "out of memory loading a topology");
    int described = spec && *spec;
    st_status s = set_name(t, described ? spec : this_machine_name);
    if (s != ST_OK)
        goto fail;
    if (hwloc_topology_init(&t->hw) != 0) {
        t->hw = NULL;
        s = st_fail(ST_ERR_TOPOLOGY, "topology '%s': hwloc_topology_init failed: %s",
                    t->name, strerror(errno));
        goto fail;
    }
    ST_TRY_GOTO(s, select_source(t->hw, spec), fail);
    if (!described)
        ST_TRY_GOTO(s, check_environment(), fail);
    if (hwloc_topology_load(t->hw) != 0) {
        int err = errno;
        if (described && strncmp(spec, "xml:", 4) == 0)
            s = st_fail(ST_ERR_FORMAT, "topology '%s': hwloc cannot load '%s' (%s); is it "
                        "an lstopo XML export (lstopo --of xml)?", spec, spec + 4,
                        strerror(err));
        else
            s = st_fail(ST_ERR_TOPOLOGY, "topology '%s': hwloc_topology_load failed: %s",
                        t->name, strerror(err));
        goto fail;
    }
    /* Decided by hwloc, not by the spec: a synthetic or XML topology is
     * not this system (unless the user forces it with HWLOC_THISSYSTEM=1,
     * hwloc's own switch for "this export is of this very machine"), and
     * HWLOC_XMLFILE / HWLOC_SYNTHETIC in the environment can make even the
     * default load a described one. */
    t->this_machine = hwloc_topology_is_thissystem(t->hw) ? 1 : 0;
    if (!described && !t->this_machine)
        ST_TRY_GOTO(s, name_from_environment(t), fail);
    *out = t;
    return ST_OK;
fail:
    st_topology_destroy(t);
    return s;
}

void st_topology_destroy(st_topology *t)
{
    if (!t)
        return;
    if (t->hw)
        hwloc_topology_destroy(t->hw);
    free(t->name);
    free(t);
}

int st_topology_is_this_machine(const st_topology *t)
{
    return t->this_machine;
}

const char *st_topology_name(const st_topology *t)
{
    return t->name;
}

static int count_type(const st_topology *t, hwloc_obj_type_t type)
{
    int n = hwloc_get_nbobjs_by_type(t->hw, type);
    return n < 0 ? 0 : n;
}

int st_topology_numa_count(const st_topology *t)
{
    return count_type(t, HWLOC_OBJ_NUMANODE);
}

/* Where hwloc reports no cores (some synthetic descriptions, a few virtual
 * machines), every PU is its own core, as it is for the plan. */
int st_topology_core_count(const st_topology *t)
{
    int n = count_type(t, HWLOC_OBJ_CORE);
    return n > 0 ? n : count_type(t, HWLOC_OBJ_PU);
}

int st_topology_pu_count(const st_topology *t)
{
    return count_type(t, HWLOC_OBJ_PU);
}

/* ------------------------------------------------------------ the process's PUs */

/* The process's binding as it was before subtrain bound any thread.  The
 * thread that calls st_plan_bind_self() is usually the main thread (OpenMP
 * thread 0 is worker 0), and it stays bound after a run; read live, the
 * process binding (the union over its threads) would then shrink to our
 * own choice, and a second run in the same process (tests do that) would
 * plan on fewer PUs than the first.  So the first binding freezes it. */
static pthread_mutex_t process_lock = PTHREAD_MUTEX_INITIALIZER;
static hwloc_bitmap_t process_before_binding; /* never freed: one per process */

static void read_process_cpuset(hwloc_topology_t hw, hwloc_bitmap_t out)
{
    if (hwloc_get_cpubind(hw, out, HWLOC_CPUBIND_PROCESS) != 0 || hwloc_bitmap_iszero(out))
        hwloc_bitmap_copy(out, hwloc_topology_get_allowed_cpuset(hw));
}

void st_topo_freeze_process_cpuset(const st_topology *t)
{
    pthread_mutex_lock(&process_lock);
    if (!process_before_binding && (process_before_binding = hwloc_bitmap_alloc()) != NULL)
        read_process_cpuset(t->hw, process_before_binding);
    pthread_mutex_unlock(&process_lock);
}

void st_topo_process_cpuset(const st_topology *t, hwloc_bitmap_t out)
{
    pthread_mutex_lock(&process_lock);
    if (process_before_binding)
        hwloc_bitmap_copy(out, process_before_binding);
    else
        read_process_cpuset(t->hw, out);
    pthread_mutex_unlock(&process_lock);
    hwloc_bitmap_and(out, out, hwloc_topology_get_topology_cpuset(t->hw));
}

/* Rebuilt on every call: the environment may change between calls (tests
 * do), and this is not on any hot path.  Set-but-empty variables are
 * ignored by the OpenMP runtimes, so they are not reported either. */
const char *st_topology_binding_env_warning(void)
{
    static const char *const vars[] = { "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY" };
    static _Thread_local char msg[256];
    char names[96] = "";
    int n = 0;
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (!v || *v == '\0')
            continue;
        if (n > 0)
            strcat(names, ", ");
        strcat(names, vars[i]);
        n++;
    }
    if (n == 0)
        return NULL;
    snprintf(msg, sizeof msg, "%s %s set, but subtrain binds its worker threads itself "
             "with hwloc (one PU per worker) and ignores %s", names, n == 1 ? "is" : "are",
             n == 1 ? "it" : "them");
    return msg;
}

/* ------------------------------------------------------------ the CPU model */

/* /proc/cpuinfo's first "model name" (x86) or "Model name"/"cpu model"
 * (others), read once: the machine does not change under a process. */
static pthread_once_t cpuinfo_once = PTHREAD_ONCE_INIT;
static char cpuinfo_model[256];

static void read_cpuinfo_model(void)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f)) {
        const char *colon = strchr(line, ':');
        if (!colon || (strncasecmp(line, "model name", 10) != 0 &&
                       strncmp(line, "cpu model", 9) != 0))
            continue;
        const char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        snprintf(cpuinfo_model, sizeof cpuinfo_model, "%s", v);
        cpuinfo_model[strcspn(cpuinfo_model, "\n")] = '\0';
        break;
    }
    if (f)
        fclose(f);
}

const char *st_topology_cpu_model(const st_topology *t)
{
    hwloc_obj_t pkg = hwloc_get_obj_by_type(t->hw, HWLOC_OBJ_PACKAGE, 0);
    const char *m = pkg ? hwloc_obj_get_info_by_name(pkg, "CPUModel") : NULL;
    if (m && *m)
        return m;
    if (!t->this_machine)   /* a described machine says it or nobody does */
        return NULL;
    pthread_once(&cpuinfo_once, read_cpuinfo_model);
    return cpuinfo_model[0] ? cpuinfo_model : NULL;
}
