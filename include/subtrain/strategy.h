/*
 * subtrain/strategy.h — the training strategies as a front end sees them,
 * without naming any: each one's name, its part of --strategy's help, its
 * options (for a command line, its --help and a configuration file), the
 * line that describes a configured run of it, and what it says of --init
 * and of the model it trains by default.
 *
 * Strategies are numbered from 0 in their table's order (st_strategy,
 * train.h, names the first ones); st_strategy_info_of returns NULL past
 * the last.  An option's name may belong to several strategies (ist's and
 * localsgd's --local-steps), each reading it into its own member of
 * st_train_config.
 */
#ifndef SUBTRAIN_STRATEGY_H
#define SUBTRAIN_STRATEGY_H

#include <stddef.h>
#include <stdint.h>
#include <subtrain/train.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The syntax of an option's value, which the front end parses (its
 * messages are the front end's) before `set` stores it. */
typedef enum st_option_kind {
    ST_OPTION_COUNT,    /* a whole number in [lo, hi] */
    ST_OPTION_REAL,     /* a number in the range real_lo, real_hi with its
                         * brackets, kept as a float */
    ST_OPTION_NAME,     /* one of names */
    ST_OPTION_COUNTS,   /* at most `most` increasing whole numbers in
                         * [lo, hi], comma-separated ("2,4") */
    ST_OPTION_TEXT,     /* a syntax of its own: `parse` reads it, `print`
                         * writes it back */
    ST_OPTION_FLAG,     /* no value: given or not (name 1 or 0) */
} st_option_kind;

#define ST_OPTION_MAX_COUNTS 16

/* A value of an option, in the member its kind says. */
typedef struct st_option_value {
    uint64_t count;                     /* COUNT */
    double real;                        /* REAL (a float's value) */
    int name;                           /* NAME: its index in names; FLAG:
                                         * 1 given; TEXT: the parser's */
    int counts[ST_OPTION_MAX_COUNTS];   /* COUNTS: n_counts of them */
    int n_counts;
} st_option_value;

typedef struct st_strategy_option {
    const char *name;         /* the long option without its dashes, and a
                               * configuration file's key: "local-steps" */
    const char *syntax;       /* its value in --help: "R", "reset|keep"; a
                               * FLAG's: "" */
    const char *help;         /* --help's text, lines of at most 55
                               * columns joined by '\n': "ist: steps
                               * between synchronisations (default 50)" */
    st_option_kind kind;
    uint64_t lo, hi;          /* COUNT, COUNTS: the range */
    char lo_bracket, hi_bracket; /* REAL: '[' or '(', ']' or ')' */
    double real_lo, real_hi;  /* REAL: the range */
    const char *const *names; /* NAME: the values, NULL-ended */
    int most;                 /* COUNTS: at most this many numbers */
    const char *expected;     /* COUNTS: what a malformed list is told
                               * ("increasing layer numbers such as 2,4") */
    /* TEXT: the value into *v, 0; or -1 and why it is refused in `why`
     * ("Q, the fraction kept, must be ..."); and *v as the value reads */
    int (*parse)(const char *text, st_option_value *v, char *why, size_t n);
    void (*print)(const st_option_value *v, char *out, size_t n);
    int only;                 /* 1: given with another strategy, refused
                               * ("--segments applies to --strategy synth
                               * only"); 0: kept in this strategy's member,
                               * which the others leave alone */
    /* The value, parsed and in its range, into c. */
    void (*set)(st_train_config *c, const st_option_value *v);
    /* c's value into *v: 1, or 0 when it has none of its own (a default
     * derived from other options: an empty value in a configuration file) */
    int (*get)(const st_train_config *c, st_option_value *v);
} st_strategy_option;

typedef struct st_strategy_info {
    const char *name;         /* as --strategy spells it */
    const char *help;         /* its part of --strategy's --help text, lines
                               * of at most 55 columns joined by '\n' */
    const st_strategy_option *options; /* its options, ended by one without
                                        * a name; NULL: none */
    const char *no_init;      /* NULL: it starts from --init's weights; else
                               * why it cannot ("its segments start from
                               * their own initial values") */
    const char *model;        /* the model it trains when none is named ... */
    int depth;                /* ... and its depth, when none is given; 0: the
                               * library's default (st_model_config_default) */
} st_strategy_info;

/* Strategy s's information; NULL when there is no strategy s. */
const st_strategy_info *st_strategy_info_of(st_strategy s);

/* The strategy of c as a run's banner describes it: its name and, in
 * parentheses, its options that matter ("sdp (block, forward masking,
 * coverage 1/2 = 0.5)", "ist (50 local steps)"); workers: of the run, all
 * ranks (0: not known yet).  Writes at most n bytes, like snprintf. */
void st_strategy_describe(const st_train_config *c, int workers, char *out, size_t n);

/* The branch scale c's run evaluates its full model with, and that its
 * trained weights are meant to be evaluated with (ist of resmlp: 1 /
 * workers); 0: none. */
float st_strategy_eval_scale(const st_train_config *c, int workers);

#ifdef __cplusplus
}
#endif
#endif /* SUBTRAIN_STRATEGY_H */
