/*
 * cli/option_values.h — values of `subtrain train`'s options with a syntax
 * of their own: --data's specification, and a strategy's option by its
 * descriptor.  Each returns 0, or -1 with a one-line message in err.
 */
#ifndef SUBTRAIN_CLI_OPTION_VALUES_H
#define SUBTRAIN_CLI_OPTION_VALUES_H

#include <stddef.h>

#include <subtrain/strategy.h>

#include "cli/options.h"

/* --data (or $SUBTRAIN_DATA, named by `what`). */
int st_cli_parse_data(const char *what, const char *s, st_cli_data *d, char *err, size_t n);
/* A strategy option's value as typed, by its descriptor's syntax, with
 * the messages of the command's own options. */
int st_cli_parse_strategy_value(const st_strategy_option *d, const char *arg,
                                st_option_value *v, char *err, size_t n);

#endif /* SUBTRAIN_CLI_OPTION_VALUES_H */
