/*
 * cli/plan_cmd.h — `subtrain plan`: the strategies that fit a memory
 * budget per worker, their memory by kind, bytes and predicted speed.
 */
#ifndef SUBTRAIN_CLI_PLAN_CMD_H
#define SUBTRAIN_CLI_PLAN_CMD_H

/* argv[0] is "plan". */
int st_cli_plan_main(int argc, char **argv);

/* A size as the budgets take it: "512M", "1G", "1.5GiB", "4096" (K, M,
 * G, T and KiB, MiB, GiB, TiB are powers of 1024; a bare number is
 * bytes), at least one byte.  0 with *out in bytes, or -1. */
int st_cli_parse_size(const char *s, double *out);

#endif /* SUBTRAIN_CLI_PLAN_CMD_H */
