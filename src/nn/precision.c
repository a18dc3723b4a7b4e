/*
 * nn/precision.c — can this CPU run bf16 products, and how.
 *
 * oneDNN picks its kernels by the effective ISA: the CPU's, or lower
 * when ONEDNN_MAX_CPU_ISA says so.
 *   avx512_core_bf16  native bf16 dot products (vdpbf16ps): faster than fp32
 *   avx512_core       bf16 runs, converted in software: slower than fp32
 *   avx2              no bf16 matmul at all (primitive creation fails)
 * So a caller asks before it builds a bf16 model: native, emulated (run
 * only when the user says so), or unavailable (doc/precision.md has the
 * timings).
 */
#include <oneapi/dnnl/dnnl.h>

#include <subtrain/model.h>

static const char *isa_name(dnnl_cpu_isa_t isa)
{
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic: return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "generic";
    }
}

/* Whether oneDNN creates a bf16 x bf16 -> fp32 matmul at all. */
static int bf16_matmul_exists(void)
{
    dnnl_engine_t engine;
    if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
        return 0;
    dnnl_dims_t a_dims = { 16, 32 }, b_dims = { 32, 16 }, c_dims = { 16, 16 };
    dnnl_memory_desc_t a, b, c;
    dnnl_matmul_desc_t d;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_memory_desc_init_by_tag(&a, 2, a_dims, dnnl_bf16, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&b, 2, b_dims, dnnl_bf16, dnnl_ab) == dnnl_success &&
             dnnl_memory_desc_init_by_tag(&c, 2, c_dims, dnnl_f32, dnnl_ab) == dnnl_success &&
             dnnl_matmul_desc_init(&d, &a, &b, NULL, &c) == dnnl_success &&
             dnnl_primitive_desc_create(&pd, &d, NULL, engine, NULL) == dnnl_success;
    if (pd)
        dnnl_primitive_desc_destroy(pd);
    dnnl_engine_destroy(engine);
    return ok;
}

const char *st_cpu_isa_name(void)
{
    return isa_name(dnnl_get_effective_cpu_isa());
}

st_bf16_support st_bf16_probe(const char **isa)
{
    const dnnl_cpu_isa_t have = dnnl_get_effective_cpu_isa();
    const unsigned bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    if (isa)
        *isa = isa_name(have);
    if (((unsigned)have & bf16) == bf16)
        return ST_BF16_NATIVE;
    return bf16_matmul_exists() ? ST_BF16_EMULATED : ST_BF16_UNAVAILABLE;
}
