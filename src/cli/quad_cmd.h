/*
 * cli/quad_cmd.h — `subtrain quad`: independent subnetwork training on
 * quadratics and its exact checks (doc/quad.md).
 */
#ifndef SUBTRAIN_CLI_QUAD_CMD_H
#define SUBTRAIN_CLI_QUAD_CMD_H

/* argv[0] is "quad" (main passes its argv + 1).  Returns the exit status:
 * 0 success, 1 runtime failure (e.g. an unwritable CSV file), 2 bad usage. */
int st_cli_quad_main(int argc, char **argv);

#endif /* SUBTRAIN_CLI_QUAD_CMD_H */
