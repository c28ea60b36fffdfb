/*
 * cli — shared declarations of the `tessera` command-line tool. Each command lives in
 * its own cmd_*.c and is reached from the table in main.c. A command returns the
 * process exit code: 0 success, 1 failure (bad input, rejected batch), 2 usage error.
 *
 * Conventions of every command: options are parsed with tsr_cmdline_parse_spec (brief
 * usage errors: one line naming the flag, then a pointer to --help); every message
 * starts with "tessera <command>: " (e.g. "tessera index search: ", "tessera query: ");
 * --help ends with the exit codes.
 */
#ifndef TSR_CLI_H
#define TSR_CLI_H

int tsr_cmd_index_build(int argc, char **argv);
int tsr_cmd_index_search(int argc, char **argv);
int tsr_cmd_index_check(int argc, char **argv);
int tsr_cmd_index_info(int argc, char **argv);
int tsr_cmd_index_rewrite(int argc, char **argv);
int tsr_cmd_batch_inspect(int argc, char **argv);
int tsr_cmd_query(int argc, char **argv);
int tsr_cmd_update(int argc, char **argv);
int tsr_cmd_read(int argc, char **argv);
int tsr_cmd_stats(int argc, char **argv);
int tsr_cmd_health(int argc, char **argv);
int tsr_cmd_cluster_up(int argc, char **argv);

#endif
