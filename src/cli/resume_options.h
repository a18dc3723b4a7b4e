/*
 * cli/resume_options.h — the options a step checkpoint records and a
 * resume compares (st_train_config.options): every option of
 * --dump-config, in its words, but the few that may change on a resume
 * (doc/checkpoints.md).
 */
#ifndef SUBTRAIN_CLI_RESUME_OPTIONS_H
#define SUBTRAIN_CLI_RESUME_OPTIONS_H

#include <subtrain/checkpoint.h>

#include "cli/options.h"

typedef struct st_cli_resume_options {
    st_safetensors_meta_entry *list;   /* n entries: an option's name, its value ("": default) */
    int n;
    char *text;         /* the keys and values, one malloc */
} st_cli_resume_options;

/* 0, or -1 when out of memory (said on stderr). */
int st_cli_resume_options_make(const st_cli_options *o, st_cli_resume_options *out);

/* Leaves out of r the options that `file`, the checkpoint being resumed,
 * does not record and that have their default value here: an option
 * added by a later version is absent from an earlier one's checkpoints,
 * whose runs had what is now its default.  An option at its default that
 * the file records as "" (an earlier version's word for a default it did
 * not spell out) is compared as "". */
void st_cli_resume_options_since(st_cli_resume_options *r, const st_safetensors *file);
void st_cli_resume_options_free(st_cli_resume_options *r);

#endif /* SUBTRAIN_CLI_RESUME_OPTIONS_H */
