/*
 * fuzz/fuzz_options.c — libFuzzer harness of the option parser of
 * `subtrain train`, st_cli_parse (cli/options.c).
 *
 * The input is a command line: its words are split on NUL and newline
 * bytes (so a corpus file is one word per line, and a word can hold any
 * other byte; a separator at the end ends the last word, and an empty
 * input is no word), after argv[0] = "subtrain".  Rejecting a command line is
 * the parser's job; what is a finding is a crash, undefined behaviour, a
 * leak, or a rejection without its one-line message (a control byte of
 * the input echoed raw would break the line).  The parser keeps
 * pointers into argv (--data, --metrics, ...): the words live until the
 * options are dropped.
 */
#include "fuzz_file.h"

#include "cli/options.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define MAX_WORDS 256

static int has_control_byte(const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        if (*p < 0x20 || *p == 0x7f)
            return 1;
    return 0;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    unsetenv("SUBTRAIN_DATA");   /* the default --data is the compiled-in one */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* one copy of the input, NUL-terminated words in place */
    char *text = malloc(size + 1);
    char *argv[MAX_WORDS + 2];
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    int argc = 0;
    argv[argc++] = (char *)"subtrain";
    char *word = text;
    for (size_t i = 0; i < size && argc <= MAX_WORDS; i++)
        if (text[i] == '\0' || text[i] == '\n') {
            text[i] = '\0';
            argv[argc++] = word;
            word = text + i + 1;
        }
    if (word < text + size && argc <= MAX_WORDS)   /* the last word, unterminated */
        argv[argc++] = word;
    argv[argc] = NULL;

    st_cli_options o;
    char err[512];
    err[0] = '\0';
    memset(err + 1, 'x', sizeof err - 1);
    if (st_cli_parse(argc, argv, &o, err, sizeof err) != 0) {
        FUZZ_CHECK(err[0] != '\0' && memchr(err, '\0', sizeof err) != NULL);
        FUZZ_CHECK(!has_control_byte(err));
    } else {
        FUZZ_CHECK(o.action >= ST_CLI_RUN && o.action <= ST_CLI_VERSION);
        FUZZ_CHECK(o.data != NULL && o.prompt != NULL);
        FUZZ_CHECK(strlen(o.data_spec.dir) < sizeof o.data_spec.dir);
    }
    st_cli_options_free(&o);   /* a --config file's text */
    free(text);
    return 0;
}
