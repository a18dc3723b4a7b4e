/* core/version.c — the library's version, fixed when it is compiled. */
#include <subtrain/version.h>

const char *st_version(void)
{
    return SUBTRAIN_VERSION;
}
