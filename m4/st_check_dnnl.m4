# ST_CHECK_DNNL
# -------------
# oneDNN ships no pkg-config file on Debian 12, so look for the header and the
# library directly, then compile a test that the version is 2.x (the C API we
# use is the v2 `*_desc_init` one, removed in 3.0) and that the CPU runtime is
# OpenMP (workers are OpenMP threads; a TBB or sequential build would either
# oversubscribe or ignore our thread binding).
# Sets DNNL_LIBS and st_dnnl_version.
AC_DEFUN([ST_CHECK_DNNL], [
  AC_CHECK_HEADER([oneapi/dnnl/dnnl.h], [],
    [AC_MSG_ERROR([oneDNN header oneapi/dnnl/dnnl.h not found; Debian: apt-get install libdnnl-dev])])
  st_save_LIBS=$LIBS
  st_save_CFLAGS=$CFLAGS
  CFLAGS="$CFLAGS $OPENMP_CFLAGS"
  LIBS=""
  AC_SEARCH_LIBS([dnnl_engine_create], [dnnl], [],
    [AC_MSG_ERROR([oneDNN library (libdnnl) not found; Debian: apt-get install libdnnl-dev])])
  DNNL_LIBS=$LIBS
  LIBS=$st_save_LIBS
  AC_MSG_CHECKING([for oneDNN 2.x with the OpenMP CPU runtime])
  AC_COMPILE_IFELSE([AC_LANG_PROGRAM([[
#include <oneapi/dnnl/dnnl.h>
#if DNNL_VERSION_MAJOR != 2
#error "subtrain needs the oneDNN 2.x C API"
#endif
#if DNNL_CPU_RUNTIME != DNNL_RUNTIME_OMP
#error "subtrain needs oneDNN built with the OpenMP CPU runtime"
#endif
]], [[]])],
    [AC_MSG_RESULT([yes])],
    [AC_MSG_RESULT([no])
     AC_MSG_ERROR([oneDNN must be version 2.x built with DNNL_CPU_RUNTIME=OMP (Debian 12's libdnnl-dev 2.6 is); 3.x changed the C API])])
  AC_COMPUTE_INT([st_dnnl_major], [DNNL_VERSION_MAJOR], [#include <oneapi/dnnl/dnnl.h>])
  AC_COMPUTE_INT([st_dnnl_minor], [DNNL_VERSION_MINOR], [#include <oneapi/dnnl/dnnl.h>])
  AC_COMPUTE_INT([st_dnnl_patch], [DNNL_VERSION_PATCH], [#include <oneapi/dnnl/dnnl.h>])
  st_dnnl_version="$st_dnnl_major.$st_dnnl_minor.$st_dnnl_patch"
  CFLAGS=$st_save_CFLAGS
  AC_SUBST([DNNL_LIBS])
])
