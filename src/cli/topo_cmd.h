/*
 * cli/topo_cmd.h — `subtrain topo`: print the placement plan and the
 * reduction tree for this machine or a described one.
 */
#ifndef SUBTRAIN_CLI_TOPO_CMD_H
#define SUBTRAIN_CLI_TOPO_CMD_H

/* argv[0] is "topo" (main passes its argv + 1).  Returns the exit status:
 * 0 success, 1 runtime failure (e.g. an unreadable XML file), 2 bad usage. */
int st_cli_topo_main(int argc, char **argv);

#endif /* SUBTRAIN_CLI_TOPO_CMD_H */
