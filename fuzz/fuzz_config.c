/*
 * fuzz/fuzz_config.c — libFuzzer harness of the --config reader,
 * st_cli_config_read (cli/config_file.c): the input as a file, read as a
 * configuration (key = value lines) or, when it starts with '{', as a
 * metrics file whose first record's "run"."config" is parsed by jansson.
 *
 * A finding is a crash, undefined behaviour, a leak, a refusal without
 * its one-line message, or an accepted entry without its strings.  A key
 * may be any string here, "" too: the option table refuses the unknown
 * ones (`unknown key ''`).
 */
#include "fuzz_file.h"

#include "cli/config_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    st_cli_config_file cf;
    char err[512];
    err[0] = '\0';
    memset(err + 1, 'x', sizeof err - 1);
    if (st_cli_config_read(fuzz_file(data, size), &cf, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
        FUZZ_CHECK(strchr(err, '\n') == NULL);
    } else {
        for (int i = 0; i < cf.n; i++) {
            FUZZ_CHECK(cf.entries[i].key && cf.entries[i].value);
            FUZZ_CHECK(cf.entries[i].line >= 1);
            (void)strlen(cf.entries[i].key);
            (void)strlen(cf.entries[i].value);
        }
    }
    st_cli_config_free(&cf);
    return 0;
}
