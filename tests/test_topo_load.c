/*
 * tests/test_topo_load.c — topologies: this machine against hwloc's view,
 * synthetic descriptions, XML exports, and the size limit that refuses a
 * description too large before hwloc builds it.
 *
 * load, make, the plan comparisons and printing: tests/topo_check.h.
 */
#include "topo_check.h"

/* ------------------------------------------------------------ loading */

Test(topology, synthetic_counts_and_name)
{
    st_topology *t = load("synthetic:pack:2 numa:4 core:16 pu:2");
    cr_assert_eq(st_topology_is_this_machine(t), 0);
    cr_assert_str_eq(st_topology_name(t), "synthetic:pack:2 numa:4 core:16 pu:2");
    cr_assert_eq(st_topology_numa_count(t), 8);
    cr_assert_eq(st_topology_core_count(t), 128);
    cr_assert_eq(st_topology_pu_count(t), 256);
    st_topology_destroy(t);
}

Test(topology, synthetic_os_indices_equal_logical_by_default)
{
    st_topology *t = load("synthetic:pack:2 numa:1 core:4 pu:2");
    hwloc_topology_t hw = st_topology_hwloc(t);
    for (int i = 0; i < st_topology_pu_count(t); i++)
        cr_assert_eq(hwloc_get_obj_by_type(hw, HWLOC_OBJ_PU, (unsigned)i)->os_index,
                     (unsigned)i);
    for (int i = 0; i < st_topology_numa_count(t); i++)
        cr_assert_eq(hwloc_get_obj_by_type(hw, HWLOC_OBJ_NUMANODE, (unsigned)i)->os_index,
                     (unsigned)i);
    st_topology_destroy(t);
}

Test(topology, this_machine_matches_hwloc)
{
    st_topology *t = load(NULL);
    hwloc_topology_t hw = st_topology_hwloc(t);
    cr_assert_eq(st_topology_is_this_machine(t), 1);
    cr_assert_str_eq(st_topology_name(t), "this machine");
    cr_assert_eq(st_topology_numa_count(t), hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_NUMANODE));
    cr_assert_eq(st_topology_pu_count(t), hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_PU));
    int cores = hwloc_get_nbobjs_by_type(hw, HWLOC_OBJ_CORE);
    cr_assert_eq(st_topology_core_count(t), cores > 0 ? cores : st_topology_pu_count(t));
    cr_log_info("this machine: %d NUMA nodes, %d cores, %d PUs", st_topology_numa_count(t),
                st_topology_core_count(t), st_topology_pu_count(t));
    st_topology_destroy(t);

    st_topology *e = load("");
    cr_assert_eq(st_topology_is_this_machine(e), 1);
    st_topology_destroy(e);
}

static void load_fails(const char *spec, st_status status, const char *needle)
{
    st_topology *t = (st_topology *)&t; /* not NULL: must be cleared */
    st_status s = st_topology_load(spec, &t);
    cr_assert_eq(s, status, "'%s': status %d, want %d (%s)", spec, s, status, st_last_error());
    cr_assert_null(t);
    cr_assert(strstr(st_last_error(), needle), "'%s': message '%s' lacks '%s'", spec,
              st_last_error(), needle);
}

Test(topology, bad_specs_say_what_is_wrong)
{
    load_fails("synthetic:nonsense", ST_ERR_INVALID, "nonsense");
    load_fails("synthetic:", ST_ERR_INVALID, "no description");
    load_fails("xml:/nonexistent.xml", ST_ERR_IO, "/nonexistent.xml");
    load_fails("xml:/nonexistent.xml", ST_ERR_IO, "No such file");
    load_fails("xml:", ST_ERR_INVALID, "no file name");
    load_fails("xml:/tmp", ST_ERR_IO, "directory");
    load_fails("bogus:x", ST_ERR_INVALID, "'bogus:x'");
    load_fails("bogus:x", ST_ERR_INVALID, "synthetic:");
    load_fails("bogus:x", ST_ERR_INVALID, "xml:FILE");
}

/* Described topologies past the size limit (topo/limits.c) are refused
 * before hwloc builds them, in a moment: these took hwloc minutes, or
 * forever.  The timeout only guards against the hang returning. */
Test(topology, too_large_descriptions_are_refused_before_loading, .timeout = 60)
{
    load_fails("synthetic:core:20000 pu:1", ST_ERR_INVALID, "is too large: 20000 PUs, up to "
               "20000 under one parent");
    load_fails("synthetic:pack:65536 pu:65536", ST_ERR_INVALID, "4294967296 PUs");
    load_fails("synthetic:core:0x1000 pu:1", ST_ERR_INVALID, "4096 PUs");   /* hwloc's base 0 */
    load_fails("synthetic:core:1024 pu:16", ST_ERR_INVALID, "16384 PUs");
    load_fails("synthetic:pack:2(memory=1GB) core:4096 pu:1", ST_ERR_INVALID, "8192 PUs");
    load_fails("synthetic:pack:16 [numa] core:1024 pu:2", ST_ERR_INVALID, "32768 PUs");
    /* the same through hwloc's environment, which the default load reads */
    cr_assert_eq(setenv("HWLOC_SYNTHETIC", "core:20000 pu:1", 1), 0);
    load_fails(NULL, ST_ERR_INVALID, "topology HWLOC_SYNTHETIC='core:20000 pu:1' is too large");
    cr_assert_eq(setenv("HWLOC_COMPONENTS", "synthetic", 1), 0);
    load_fails(NULL, ST_ERR_INVALID, "HWLOC_SYNTHETIC='core:20000 pu:1'");
    unsetenv("HWLOC_COMPONENTS");
    unsetenv("HWLOC_SYNTHETIC");
}

/* Realistic large machines stay within the limit: 2048 PUs as 8 packages
 * of 2 domains of 64 two-thread cores, and 4096 cores in 64 domains. */
Test(topology, large_real_machines_load)
{
    st_topology *t = load("synthetic:pack:8 numa:2 core:64 pu:2");
    cr_assert_eq(st_topology_pu_count(t), 2048);
    cr_assert_eq(st_topology_core_count(t), 1024);
    cr_assert_eq(st_topology_numa_count(t), 16);
    st_topology_destroy(t);
    t = load("synthetic:pack:8 numa:8 core:64 pu:1");
    cr_assert_eq(st_topology_core_count(t), 4096);
    cr_assert_eq(st_topology_numa_count(t), 64);
    st_topology_destroy(t);
}

/* A default load that hwloc's environment turned into another machine is
 * named after the variable, not "this machine". */
Test(topology, environment_described_topology_is_named)
{
    unsetenv("HWLOC_THISSYSTEM");
    cr_assert_eq(setenv("HWLOC_SYNTHETIC", "pack:2 pu:1", 1), 0);
    st_topology *t = load(NULL);
    cr_assert_eq(st_topology_is_this_machine(t), 0);
    cr_assert_str_eq(st_topology_name(t), "HWLOC_SYNTHETIC='pack:2 pu:1'");
    cr_assert_eq(st_topology_pu_count(t), 2);
    st_topology_destroy(t);
    unsetenv("HWLOC_SYNTHETIC");
}

/* An lstopo export of 8192 cores side by side under the machine: small
 * as a file (6 MiB) but past the import limit; the same cores in 64
 * domains pass it. */
static void write_flat_xml(const char *path, int cores, int domains)
{
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    char *s = NULL;
    hwloc_bitmap_set_range(b, 0, cores - 1);
    hwloc_bitmap_asprintf(&s, b);
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM "
            "\"hwloc2.dtd\">\n<topology version=\"2.0\">\n<object type=\"Machine\" "
            "os_index=\"0\" cpuset=\"%s\" complete_cpuset=\"%s\" nodeset=\"0x%x\" "
            "complete_nodeset=\"0x%x\" gp_index=\"1\">\n", s, s, (1u << domains) - 1,
            (1u << domains) - 1);
    free(s);
    int gp = 2, per = cores / domains;
    for (int d = 0; d < domains; d++) {
        hwloc_bitmap_zero(b);
        hwloc_bitmap_set_range(b, d * per, d * per + per - 1);
        hwloc_bitmap_asprintf(&s, b);
        const unsigned node = 1u << d;
        fprintf(f, "<object type=\"Package\" os_index=\"%d\" cpuset=\"%s\" "
                "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                "gp_index=\"%d\">\n<object type=\"NUMANode\" os_index=\"%d\" cpuset=\"%s\" "
                "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                "gp_index=\"%d\" local_memory=\"1073741824\"/>\n",
                d, s, s, node, node, gp, d, s, s, node, node, gp + 1);
        gp += 2;
        free(s);
        for (int c = d * per; c < d * per + per; c++) {
            hwloc_bitmap_only(b, (unsigned)c);
            hwloc_bitmap_asprintf(&s, b);
            fprintf(f, "<object type=\"Core\" os_index=\"%d\" cpuset=\"%s\" "
                    "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                    "gp_index=\"%d\">\n<object type=\"PU\" os_index=\"%d\" cpuset=\"%s\" "
                    "complete_cpuset=\"%s\" nodeset=\"0x%x\" complete_nodeset=\"0x%x\" "
                    "gp_index=\"%d\"/>\n</object>\n", c, s, s, node, node, gp, c, s, s, node,
                    node, gp + 1);
            gp += 2;
            free(s);
        }
        fprintf(f, "</object>\n");
    }
    fprintf(f, "</object>\n</topology>\n");
    hwloc_bitmap_free(b);
    cr_assert_eq(fclose(f), 0);
}

Test(topology, too_large_xml_is_refused_before_loading, .timeout = 60)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX], spec[ST_TEST_PATH_MAX + 8];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "flat.xml");
    write_flat_xml(path, 8192, 1);
    snprintf(spec, sizeof spec, "xml:%s", path);
    load_fails(spec, ST_ERR_INVALID, "is too large: 8192 PUs");
    cr_assert_eq(setenv("HWLOC_XMLFILE", path, 1), 0);
    load_fails(NULL, ST_ERR_INVALID, "HWLOC_XMLFILE=");
    unsetenv("HWLOC_XMLFILE");
    /* the limit counts the tree, not the file: 1024 cores in 8 packages */
    write_flat_xml(path, 1024, 8);
    st_topology *t = load(spec);
    cr_assert_eq(st_topology_core_count(t), 1024);
    cr_assert_eq(st_topology_numa_count(t), 8);
    st_topology_destroy(t);
    st_test_rmdir(dir);
}

Test(topology, xml_that_is_not_xml_is_a_format_error)
{
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_test_path(path, dir, "garbage.xml");
    const char junk[] = "this is not an lstopo export\n";
    cr_assert_eq(st_test_write_file(path, junk, sizeof junk - 1), 0);
    char spec[ST_TEST_PATH_MAX + 8];
    snprintf(spec, sizeof spec, "xml:%s", path);
    load_fails(spec, ST_ERR_FORMAT, path);
    st_test_rmdir(dir);
}

/* Exports `from` to dir/name and loads it back through "xml:". */
static st_topology *xml_round_trip(const st_topology *from, const char *dir, const char *name,
                                   char *path)
{
    st_test_path(path, dir, name);
    cr_assert_eq(hwloc_topology_export_xml(st_topology_hwloc(from), path, 0), 0,
                 "exporting to %s", path);
    char spec[ST_TEST_PATH_MAX + 8];
    snprintf(spec, sizeof spec, "xml:%s", path);
    st_topology *t = load(spec);
    cr_assert_str_eq(st_topology_name(t), spec);
    return t;
}

Test(topology, xml_export_plans_like_the_original_and_is_not_this_machine)
{
    unsetenv("HWLOC_THISSYSTEM");
    char dir[ST_TEST_PATH_MAX], path[ST_TEST_PATH_MAX];
    cr_assert_eq(st_test_mkdtemp(dir), 0);
    st_topology *syn = load("synthetic:pack:2 numa:4 core:16 pu:2");
    st_topology *xml = xml_round_trip(syn, dir, "eight-domains.xml", path);
    cr_assert_eq(st_topology_is_this_machine(xml), 0);
    cr_assert_eq(st_topology_numa_count(xml), 8);
    cr_assert_eq(st_topology_core_count(xml), 128);
    cr_assert_eq(st_topology_pu_count(xml), 256);
    const int sizes[] = { 0, 8, 20, 200 };
    for (int i = 0; i < 4; i++) {
        st_plan a, b;
        make(syn, sizes[i], 0, NULL, &a);
        make(xml, sizes[i], 0, NULL, &b);
        expect_same_plan(&a, &b);
        st_plan_free(&a);
        st_plan_free(&b);
    }
    st_plan p;
    make(xml, 2, 0, NULL, &p);
    cr_assert_eq(st_plan_bind_self(xml, &p, 0), ST_ERR_TOPOLOGY);
    st_plan_free(&p);
    st_topology_destroy(xml);
    st_topology_destroy(syn);

    /* Even an export of this very machine describes it; it is not it. */
    st_topology *here = load(NULL);
    st_topology *copy = xml_round_trip(here, dir, "here.xml", path);
    cr_assert_eq(st_topology_is_this_machine(copy), 0);
    cr_assert_eq(st_topology_pu_count(copy), st_topology_pu_count(here));
    cr_assert_eq(st_topology_core_count(copy), st_topology_core_count(here));
    cr_assert_eq(st_topology_numa_count(copy), st_topology_numa_count(here));
    st_topology_destroy(copy);
    st_topology_destroy(here);
    st_test_rmdir(dir);
}
